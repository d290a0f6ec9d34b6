// SPDX-License-Identifier: Apache-2.0
// See Note [Autotune] in autotune.h.
#include "src/core/tuning/autotune.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <mutex>
#include <set>
#include <string>

#include "ops/backend.h"
#include "src/base/shape.h"
#include "src/base/strings.h"
#include "src/common/logging.h"
#include "src/core/automatic_name.h"

namespace tutti::core {
namespace {

using detail::str_cat;

std::uint64_t step_key(const Response& response) {
  // "allreduce.noname.17" -> "allreduce.noname": unnamed ops of one type share a step identity.
  const std::uint64_t name = std::hash<std::string_view>{}(without_automatic_number(response.name));
  return name ^ (static_cast<std::uint64_t>(response.process_set_id) * 0x9e3779b97f4a7c15ull);
}

std::uint64_t bytes_of(const Response& response) {
  std::uint64_t bytes = 0;
  for (const TensorSpec& spec : response.tensors) {
    bytes +=
        static_cast<std::uint64_t>(detail::num_elements(spec.shape)) * element_size(spec.dtype);
  }
  return bytes;
}

// The log's name for each step of the threshold search (Note [Autotune search]).
const char* stage_name(int stage) {
  switch (stage) {
    case 1: return "grid";
    case 2: return "top5";
    case 3: return "top3";
    default: return "settled";
  }
}

}  // namespace

std::string host_routes_text(std::int64_t routes) {
  const auto side = [&](int size_class) { return (routes >> size_class) & 1 ? "mpi" : "shm"; };
  return str_cat(side(0), "/", side(1));
}

std::vector<SeenOp> seen_ops(const ResponseList& list, const RankCache& cache) {
  std::vector<SeenOp> ops;
  ops.reserve(list.responses.size());
  const auto see = [&](const Response& response) {
    if (response.ok) ops.push_back(SeenOp{.key = step_key(response), .bytes = bytes_of(response)});
  };
  for (std::size_t i = 0; i < list.responses.size(); ++i) {
    const std::int32_t hits = i < list.hit.size() ? list.hit[i] : 0;
    if (hits == 0) {
      see(list.responses[i]);
      continue;
    }
    for (std::int32_t k = 0; k < hits; ++k) {
      // An unknown id stops the executor; nothing to count.
      if (const Response* response = cache.response(list.cache_ids[i] + k)) see(*response);
    }
  }
  return ops;
}

Autotuner::Options Autotuner::options_of(const Config& config) {
  // One round of every cycle-time candidate, then 2 rounds of the best 3 (step 3 of Note
  // [Autotune]; with 3 candidates, 3 rounds of each).
  const int cycles =
      static_cast<int>(std::size(kCycleCandidatesUs)) +
      (config.cycle_time_set &&
               std::find(std::begin(kCycleCandidatesUs), std::end(kCycleCandidatesUs),
                         config.cycle_time.count()) == std::end(kCycleCandidatesUs)
           ? 1
           : 0);
  return Options{.warmup_samples = config.autotune_warmup_samples,
                 .steps_per_sample = config.autotune_steps_per_sample,
                 .threshold = {.start = config.fusion_threshold_bytes,
                               .start_is_candidate = config.fusion_threshold_set,
                               .max_samples = config.autotune_max_samples},
                 .cycle = {.start = config.cycle_time.count(),
                           .start_is_candidate = config.cycle_time_set,
                           .max_samples = cycles + 2 * 3},
                 .log_path = config.autotune_log};
}

namespace {

HalvingSearch::Options cycle_options(HalvingSearch::Options options) {
  if (options.candidates.empty())
    options.candidates.assign(std::begin(kCycleCandidatesUs), std::end(kCycleCandidatesUs));
  return options;
}

// Every assignment of the two size classes to the two transports, the job's start (none over
// MPI) first; one round of the 4, then 2 rounds of the best 3 (step 3 of Note [Autotune]).
HalvingSearch::Options routes_options() {
  static_assert(ops::kHostSizeClasses == 2, "the log's host_transport names two classes");
  return {.candidates = {0, 1, 2, 3}, .start = 0, .max_samples = 4 + 2 * 3};
}

// Whether no earlier Autotuner of this process wrote the log at `path`; remembers it.
bool first_log_of_process(const std::string& path) {
  static std::mutex mutex;
  static std::set<std::string> written;
  const std::lock_guard<std::mutex> lock(mutex);
  return written.insert(path).second;
}

}  // namespace

Autotuner::Autotuner(Options options)
    : options_(std::move(options)),
      threshold_search_(options_.threshold),
      cycle_(cycle_options(options_.cycle)),
      routes_search_(routes_options()),
      threshold_bytes_(options_.threshold.start),
      cycle_us_(options_.cycle.start) {
  if (options_.log_path.empty()) return;
  // A later session of this process adds its rows to the log the earlier one wrote, as a
  // TUTTI_TIMELINE file goes on (Note [One TUTTI_TIMELINE file per process] in session.cc).
  const bool continued = !first_log_of_process(options_.log_path);
  // The start handshake opened it once already, so this fails only if the path changed since.
  log_.reset(std::fopen(options_.log_path.c_str(), continued ? "a" : "w"));
  if (log_ == nullptr) {
    TUTTI_LOG_ERROR("TUTTI_AUTOTUNE_LOG='", options_.log_path, "' cannot be opened; no log");
    return;
  }
  if (!continued) std::fprintf(log_.get(), "%s\n", std::string(kLogHeader).c_str());
  std::fflush(log_.get());
}

std::optional<TunedSettings> Autotuner::observe(std::span<const SeenOp> ops,
                                                std::chrono::steady_clock::time_point now) {
  if (settled() || ops.empty()) return std::nullopt;
  const std::int64_t threshold_before = threshold_bytes_;
  const std::int64_t cycle_before = cycle_us_;
  const std::int64_t routes_before = routes_;
  if (!started_) {
    started_ = true;
    sample_start_ = now;
    // Without warm-up the first sample is the search's already: the first list switches.
    if (options_.warmup_samples == 0) threshold_bytes_ = threshold_search_.next();
  }
  // Where the next step starts in this list, if it does (step 1 of Note [Autotune]).
  std::size_t first_of_next = ops.size();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (step_keys_.contains(ops[i].key)) {
      first_of_next = i;
      break;
    }
    step_keys_.insert(ops[i].key);
    sample_bytes_ += ops[i].bytes;
  }
  if (first_of_next < ops.size()) {
    ++steps_;
    if (++sample_steps_ == options_.steps_per_sample) {
      end_sample(now);
      sample_start_ = now;
      sample_bytes_ = 0;
      sample_steps_ = 0;
    }
    step_keys_.clear();
    for (std::size_t i = first_of_next; i < ops.size(); ++i) {
      step_keys_.insert(ops[i].key);
      sample_bytes_ += ops[i].bytes;
    }
  }
  if (threshold_bytes_ == threshold_before && cycle_us_ == cycle_before &&
      routes_ == routes_before) {
    return std::nullopt;
  }
  TUTTI_LOG_DEBUG("autotune: TUTTI_FUSION_THRESHOLD=", threshold_bytes_,
                  " TUTTI_CYCLE_TIME=", static_cast<double>(cycle_us_) / 1000,
                  options_.tune_host_routes ? " host transport " + host_routes_text(routes_) : "",
                  " from step ", steps_ + 1);
  return TunedSettings{
      .fusion_threshold_bytes = threshold_bytes_ != threshold_before ? threshold_bytes_ : -1,
      .cycle_time_us = cycle_us_ != cycle_before ? cycle_us_ : -1,
      .host_routes = routes_ != routes_before ? static_cast<std::int32_t>(routes_) : -1};
}

void Autotuner::end_sample(std::chrono::steady_clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - sample_start_).count();
  // A sample's steps cannot take no time at all; guard the division anyway.
  const double throughput = static_cast<double>(sample_bytes_) / std::max(seconds, 1e-9);
  const bool warmup = samples_ < options_.warmup_samples;
  ++samples_;
  // The searches run one after the other: the first one not settled measures this sample.
  constexpr auto kSettled = HalvingSearch::Phase::Settled;
  HalvingSearch* search = &threshold_search_;
  const std::int64_t* value = &threshold_bytes_;
  std::string phase = stage_name(threshold_search_.stage());
  if (threshold_search_.phase() == kSettled) {
    search = &cycle_;
    value = &cycle_us_;
    phase = "cycle";
  }
  if (cycle_.phase() == kSettled) {  // Only while the host routes are searched.
    search = &routes_search_;
    value = &routes_;
    phase = "transport";
  }
  if (warmup) {
    phase = "warmup";
  } else {
    search->record(throughput);
  }
  const bool is_best = !warmup && search->best() == *value;
  write_row(phase, str_cat(seconds), str_cat(sample_bytes_), throughput, is_best);
  if (warmup && samples_ < options_.warmup_samples) return;  // Still warming up.
  // Each search's next value; the chosen one once it has settled.
  threshold_bytes_ = threshold_search_.next();
  if (threshold_search_.phase() == kSettled) cycle_us_ = cycle_.next();
  if (cycle_.phase() == kSettled && options_.tune_host_routes) routes_ = routes_search_.next();
  if (!settled()) return;
  write_row("settled", "", "", last_search().best_median(), true);
  TUTTI_LOG_INFO(
      "autotune settled on TUTTI_FUSION_THRESHOLD=", threshold_bytes_,
      " and TUTTI_CYCLE_TIME=", static_cast<double>(cycle_us_) / 1000,
      options_.tune_host_routes
          ? str_cat(" and host transport ", host_routes_text(routes_), " (up to 64 KiB / larger)")
          : std::string(),
      " after ", steps_, " steps (",
      threshold_search_.samples() + cycle_.samples() + routes_search_.samples(),
      " samples measured, ", options_.warmup_samples, " warm-up)");
}

void Autotuner::write_row(std::string_view phase, const std::string& seconds,
                          const std::string& bytes, double throughput, bool is_best) {
  if (log_ == nullptr) return;
  const std::string row =
      str_cat(samples_ - (phase == "settled" ? 0 : 1), ",", steps_, ",", phase, ",",
              threshold_bytes_, ",", static_cast<double>(cycle_us_) / 1000, ",",
              options_.tune_host_routes ? host_routes_text(routes_) : std::string(), ",", seconds,
              ",", bytes, ",", std::llround(throughput), ",", is_best ? 1 : 0, "\n");
  if (std::fputs(row.c_str(), log_.get()) < 0 || std::fflush(log_.get()) != 0) {
    TUTTI_LOG_WARNING("TUTTI_AUTOTUNE_LOG='", options_.log_path,
                      "': writing failed; autotuning goes on without the log");
    log_.reset();
  }
}

}  // namespace tutti::core

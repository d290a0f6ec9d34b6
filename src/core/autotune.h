// SPDX-License-Identifier: Apache-2.0
// Online tuning of the fusion threshold (TUTTI_AUTOTUNE=1): the coordinator measures the
// running job's throughput under candidate thresholds, settles on the best, and every rank
// switches with it at the same response list.
//
// Note [Autotune]
// 1. Steps. A training step submits the same tensor names again, so a step is recognised by
//    names: a response list that holds an op whose (process set, name) was already seen in the
//    current step starts the next step. This holds however the step's ops are split into lists
//    (that depends on timing), needs no help from the application, and includes whatever the
//    application does between steps (forward, backward, data loading), as throughput must.
//    Unnamed ops count as one name per op type ("allreduce.noname.<n>" as "allreduce.noname"),
//    so each of them is a step. A job whose names never repeat never completes a step and so
//    keeps its starting threshold.
// 2. Samples. A sample is TUTTI_AUTOTUNE_STEPS_PER_SAMPLE whole steps at one threshold; its
//    throughput is the bytes of the ops in those steps divided by the wall time from the start
//    of its first step to the start of the step after its last. The first
//    TUTTI_AUTOTUNE_WARMUP_SAMPLES samples run at the starting threshold and are discarded
//    (the first step negotiates every op afresh, buffers grow, pages fault in). The search
//    (Note [Autotune search] in autotune_search.h) picks each sample's threshold and settles.
// 3. Switching. Timings are taken where rank 0 builds each list, before it is sent: on rank 0
//    the previous lists have run by then (the loop executes a list before it builds the next),
//    so that is when the previous step ended. A new threshold travels in the list that starts
//    a step (ResponseList::fusion_threshold_bytes), and every rank's ResponseExecutor adopts it
//    before it plans that list's fusion: every rank plans every list with the same threshold
//    (Note [Same decision on every rank] in controller.h), and each step runs at one setting.
// 4. Once settled nothing is measured any more and the loop skips the tuner. Only the
//    threshold is tuned, not TUTTI_CYCLE_TIME: the request sender batches only while ops keep
//    arriving (README, Autotune), so on P1 the cycle time did not change the time.
// 5. TUTTI_AUTOTUNE_LOG: rank 0 writes one CSV row per sample, flushed as it is written (see
//    kLogHeader), and a last row with phase "settled". The file was opened once at init() (the
//    start handshake fails init() on every rank if rank 0 cannot open it); a later write error
//    is logged once and ends the logging, not the job.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "src/core/autotune_search.h"
#include "src/core/config.h"
#include "src/core/request.h"
#include "src/core/response_cache.h"

namespace tutti::core {

// The CSV columns of TUTTI_AUTOTUNE_LOG. sample: 0, 1, ... (the settled row continues the
// count); step: steps completed when the row was written; phase: warmup, grid, top5, top3
// (the steps of Note [Autotune search]) or settled; fusion_threshold_bytes: the sample's threshold
// (settled: the chosen one); seconds, bytes: the sample's wall time and bytes (empty on the settled
// row); bytes_per_second: the sample's throughput (settled: the median that chose it); is_best: 1
// if the row's threshold is the search's best after this row.
inline constexpr std::string_view kLogHeader =
    "sample,step,phase,fusion_threshold_bytes,seconds,bytes,bytes_per_second,is_best";

// One op of a response list as the tuner counts it: a key for its step identity (see step 1
// of Note [Autotune]) and its bytes.
struct SeenOp {
  std::uint64_t key = 0;
  std::uint64_t bytes = 0;
};

// The ops of `list` that succeeded, with hits resolved through `cache` (the coordinator's own
// rank cache, which holds every id a list can hit).
std::vector<SeenOp> seen_ops(const ResponseList& list, const RankCache& cache);

// Communication thread of the coordinator (rank 0) only.
class Autotuner {
 public:
  struct Options {
    int warmup_samples = 3;
    int steps_per_sample = 10;  // At least 1.
    ThresholdSearch::Options search{};
    std::string log_path{};  // Empty: no log.
  };
  // TUTTI_AUTOTUNE_* and the threshold the job starts with.
  static Options options_of(const Config& config);

  explicit Autotuner(const Options& options);

  // Files the next response list's ops, built at `now`. Returns the threshold the list must
  // carry when it starts a step at a new threshold.
  std::optional<std::int64_t> observe(std::span<const SeenOp> ops,
                                      std::chrono::steady_clock::time_point now);
  bool settled() const { return search_.phase() == ThresholdSearch::Phase::Settled; }
  std::int64_t threshold() const { return threshold_; }  // The one the job runs at now.
  int steps() const { return steps_; }                   // Completed since the first list.

 private:
  // The sample that just ended: files it, and returns the threshold of the next one.
  std::int64_t end_sample(std::chrono::steady_clock::time_point now);
  void write_row(std::string_view phase, std::int64_t bytes_threshold, const std::string& seconds,
                 const std::string& bytes, double throughput, bool is_best);

  struct CloseFile {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };

  const Options options_;
  ThresholdSearch search_;
  std::int64_t threshold_;
  bool started_ = false;
  std::unordered_set<std::uint64_t> step_keys_;  // Ops of the current step.
  std::chrono::steady_clock::time_point sample_start_;
  std::uint64_t sample_bytes_ = 0;
  int sample_steps_ = 0;  // Completed steps of the current sample.
  int steps_ = 0;
  int samples_ = 0;  // Completed, warm-up included.
  std::unique_ptr<std::FILE, CloseFile> log_;
};

}  // namespace tutti::core

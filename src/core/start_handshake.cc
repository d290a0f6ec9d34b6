// SPDX-License-Identifier: Apache-2.0
// See Note [Agreed settings] in start_handshake.h.
#include "src/core/start_handshake.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "src/base/strings.h"
#include "src/common/env.h"
#include "src/common/logging.h"
#include "tutti/serialize.h"

namespace tutti::core {
namespace {

using detail::str_cat;

constexpr std::uint32_t kHelloMagic = 0x54484c4f;   // "THLO"
constexpr std::uint32_t kAnswerMagic = 0x5441534e;  // "TASN"
// Rank 0's answer carries the job's id (Config::job_id) under this key beside the Job knobs;
// no knob has a dot in its name.
constexpr std::string_view kJobIdKey = "tutti.job";

// Rank 0's pid and the time: unlike any other job's that dumps into the same directory.
std::string new_job_id() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return str_cat(std::hex, std::chrono::duration_cast<std::chrono::milliseconds>(now).count(), "-",
                 std::dec, getpid());
}
constexpr int kErrorCodeCount = static_cast<int>(ErrorCode::Timeout) + 1;

// The Job knobs a rank's environment sets, as text: name -> value.
using JobValues = std::map<std::string, std::string, std::less<>>;

JobValues job_values() {
  JobValues values;
  for (const detail::Knob& knob : detail::knobs()) {
    if (knob.scope != detail::KnobScope::Job) continue;
    if (std::optional<detail::EnvSetting> setting = detail::find_setting(knob.name))
      values.emplace(knob.name, setting->value);
  }
  return values;
}

// Hello (rank -> 0) and answer (0 -> rank): a status, then the Job values.
std::string encode(std::uint32_t magic, const Status& status, const JobValues& values) {
  ByteWriter w;
  w.put(magic);
  w.put<std::uint8_t>(status.ok() ? 1 : 0);
  w.put(static_cast<std::uint8_t>(status.code()));
  w.put_string(status.message());
  w.put<std::uint64_t>(values.size());
  for (const auto& [name, value] : values) {
    w.put_string(name);
    w.put_string(value);
  }
  return w.take();
}

Status decode(std::uint32_t magic, std::string_view bytes, Status* status, JobValues* values) {
  ByteReader r(bytes);
  std::uint32_t found = 0;
  std::uint8_t ok = 0;
  ErrorCode code = ErrorCode::Internal;
  std::string message;
  std::size_t count = 0;
  if (!r.get(&found) || found != magic || !r.get(&ok) || !r.get_enum(&code, kErrorCodeCount) ||
      !r.get_string(&message) || !r.get_count(&count, 16)) {
    return Status(ErrorCode::Internal, "corrupt start-up message");
  }
  for (std::size_t i = 0; i < count; ++i) {
    std::string name;
    std::string value;
    if (!r.get_string(&name) || !r.get_string(&value)) break;
    values->emplace(std::move(name), std::move(value));
  }
  if (!r.done()) return Status(ErrorCode::Internal, "corrupt start-up message");
  *status = ok ? Status() : Status(code, message);
  return Status();
}

// The next message, waiting until `deadline`; nothing if none came.
Result<std::optional<ops::Message>> receive(ops::ControlPlane& plane,
                                            std::chrono::steady_clock::time_point deadline) {
  while (true) {
    TUTTI_ASSIGN_OR_RETURN(std::optional<ops::Message> message, plane.poll());
    if (message || std::chrono::steady_clock::now() > deadline) return message;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Whether rank 0 can write `path`, the value of TUTTI_<knob>. Opened to append, so that the
// check leaves the file as it is: a later session of this process continues it (Note [One
// TUTTI_TIMELINE file per process] in session.cc).
Status check_writable(std::string_view knob, const std::string& path) {
  if (path.empty()) return Status();
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) {
    return invalid_argument(str_cat("TUTTI_", knob, "='", path,
                                    "' cannot be opened on rank 0: ", std::strerror(errno)));
  }
  std::fclose(file);
  return Status();
}

// What only rank 0 can check: the files it writes open.
Status check_on_rank0(const Config& config) {
  TUTTI_RETURN_IF_ERROR(check_writable("TIMELINE", config.timeline_path));
  return check_writable("AUTOTUNE_LOG", config.autotune_log);
}

std::optional<std::string> setting_of(const JobValues& values, std::string_view name) {
  auto it = values.find(name);
  if (it == values.end()) return std::nullopt;
  return it->second;
}

// Whether two ranks' settings give the Job knob the same value: as numbers or booleans, not as
// text, so that "01000" and "1000", or "1" and the default true, agree.
bool same_value(const detail::Knob& knob, const JobValues& a, const JobValues& b) {
  return detail::same_knob_value(knob, setting_of(a, knob.name), setting_of(b, knob.name));
}

std::string value_text(const JobValues& values, std::string_view name) {
  auto it = values.find(name);
  if (it != values.end()) return str_cat("'", it->second, "'");
  const std::string_view fallback = detail::knob_named(name).default_value;
  return fallback.empty() ? std::string("unset") : str_cat("unset (default ", fallback, ")");
}

// Rank 0: gathers the hellos, decides, answers everyone.
Result<Config> lead(ops::ControlPlane& plane, const Result<Config>& local,
                    std::chrono::milliseconds timeout) {
  const JobValues mine = job_values();
  Status outcome =
      local.ok() ? check_on_rank0(local.value())
                 : Status(local.status().code(), str_cat("rank 0: ", local.status().message()));
  std::map<std::string, std::vector<int>> differing;  // Knob -> ranks.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> heard(static_cast<std::size_t>(plane.size()), false);
  for (int heard_count = 1; heard_count < plane.size();) {
    TUTTI_ASSIGN_OR_RETURN(std::optional<ops::Message> message, receive(plane, deadline));
    if (!message) {
      std::vector<int> missing;
      for (int r = 1; r < plane.size(); ++r) {
        if (!heard[static_cast<std::size_t>(r)]) missing.push_back(r);
      }
      outcome = Status(ErrorCode::Communication,
                       str_cat("ranks ", detail::join_list(missing), " did not start within ",
                               "TUTTI_START_TIMEOUT (", timeout.count() / 1000.0, " s)"));
      break;
    }
    Status status;
    JobValues theirs;
    TUTTI_RETURN_IF_ERROR(decode(kHelloMagic, message->bytes, &status, &theirs));
    heard[static_cast<std::size_t>(message->source)] = true;
    ++heard_count;
    if (!status.ok() && outcome.ok()) {
      outcome = Status(status.code(), str_cat("rank ", message->source, ": ", status.message()));
    }
    for (const detail::Knob& knob : detail::knobs()) {
      if (knob.scope == detail::KnobScope::Job && !same_value(knob, theirs, mine))
        differing[std::string(knob.name)].push_back(message->source);
    }
  }
  for (const auto& [knob, ranks] : differing) {
    TUTTI_LOG_WARNING("TUTTI_", knob, " differs from rank 0's on ranks ", detail::join_list(ranks),
                      "; every rank uses rank 0's value, ", value_text(mine, knob));
  }
  JobValues answer_values = mine;
  const std::string job_id = new_job_id();
  answer_values.emplace(std::string(kJobIdKey), job_id);
  const std::string answer = encode(kAnswerMagic, outcome, answer_values);
  for (int r = 1; r < plane.size(); ++r) TUTTI_RETURN_IF_ERROR(plane.send(r, answer));
  const auto sent_by = std::chrono::steady_clock::now() + timeout;
  while (!plane.sends_done() && std::chrono::steady_clock::now() < sent_by)
    std::this_thread::yield();
  if (!outcome.ok()) return outcome;
  Config config = local.value();
  config.job_id = job_id;
  return config;
}

// Every other rank: says hello, waits for rank 0's answer, takes its Job values.
Result<Config> follow(ops::ControlPlane& plane, const Result<Config>& local,
                      std::chrono::milliseconds timeout) {
  const JobValues mine = job_values();
  TUTTI_RETURN_IF_ERROR(plane.send(0, encode(kHelloMagic, local.status(), mine)));
  // Rank 0 may itself wait up to the timeout for a slow rank before it answers.
  TUTTI_ASSIGN_OR_RETURN(std::optional<ops::Message> message,
                         receive(plane, std::chrono::steady_clock::now() + 2 * timeout));
  if (!message) {
    return Status(ErrorCode::Communication,
                  str_cat("rank 0 did not answer within twice TUTTI_START_TIMEOUT (",
                          2 * timeout.count() / 1000.0, " s)"));
  }
  Status outcome;
  JobValues rank0;
  TUTTI_RETURN_IF_ERROR(decode(kAnswerMagic, message->bytes, &outcome, &rank0));
  if (!outcome.ok()) return outcome;
  detail::KnobSource agreed;
  for (const detail::Knob& knob : detail::knobs()) {
    if (knob.scope != detail::KnobScope::Job) continue;
    if (!same_value(knob, rank0, mine)) {
      TUTTI_LOG_WARNING("TUTTI_", knob.name, " is ", value_text(mine, knob.name), " here but ",
                        value_text(rank0, knob.name), " on rank 0; using rank 0's");
    }
    if (auto it = rank0.find(knob.name); it != rank0.end()) {
      agreed.set(knob.name, str_cat("TUTTI_", knob.name, " (rank 0's)"), it->second);
    } else {
      agreed.unset(knob.name);
    }
  }
  TUTTI_ASSIGN_OR_RETURN(Config config, Config::from_env(agreed));
  if (auto it = rank0.find(kJobIdKey); it != rank0.end()) config.job_id = it->second;
  return config;
}

}  // namespace

Result<Config> agree_settings(ops::ControlPlane& plane, const Result<Config>& local,
                              std::chrono::milliseconds timeout) {
  return plane.rank() == 0 ? lead(plane, local, timeout) : follow(plane, local, timeout);
}

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
#include "src/core/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>

#include "src/base/coarse_clock.h"
#include "src/base/json.h"
#include "src/base/strings.h"
#include "src/common/check.h"

namespace tutti::core {
namespace {

// An op without tensors (barrier, join, a process set's change) has no dtype: "", not the
// float32 its record holds.
std::string_view dtype_name(std::int32_t tensors, DataType dtype) {
  return tensors == 0 ? std::string_view() : to_string(dtype);
}

void append_number(std::string& out, double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6f", value);
  out += text;
}

std::string this_host() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

}  // namespace

std::string_view to_string(OpPhase phase) {
  switch (phase) {
    case OpPhase::Submitted: return "submitted";
    case OpPhase::Negotiated: return "negotiated";
    case OpPhase::Executing: return "executing";
    case OpPhase::Done: return "done";
    case OpPhase::Failed: return "failed";
  }
  return "unknown";
}

std::string default_dump_path(const std::string& dir, int rank, std::string_view tag) {
  std::string base = dir;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = detail::str_cat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/tutti-flight-recorder");
  }
  if (tag.empty()) return detail::str_cat(base, "/rank", rank, ".json");
  return detail::str_cat(base, "/rank", rank, ".", tag, ".json");
}

FlightRecorder::FlightRecorder(std::size_t capacity) : capacity_(capacity) {
  detail::MutexLock lock(mutex_);
  slots_.resize(capacity);
  long_names_.resize(capacity);
  long_shapes_.resize(capacity);
  errors_.resize(capacity);
}

double FlightRecorder::now_s() const { return seconds_at(Clock::now()); }

double FlightRecorder::seconds_at(Clock::time_point at) const {
  return std::chrono::duration<double>(at - origin_).count();
}

std::int64_t FlightRecorder::submitted(const Request& request, std::int64_t sequence,
                                       Clock::time_point at) {
  if (!enabled()) return -1;
  detail::MutexLock lock(mutex_);
  return record_locked(request, sequence, at);
}

void FlightRecorder::set_flush(std::function<void()> flush) {
  detail::MutexLock lock(flush_mutex_);
  flush_ = std::move(flush);
}

void FlightRecorder::flush() const {
  detail::MutexLock lock(flush_mutex_);
  if (flush_) flush_();
}

std::int64_t FlightRecorder::record_locked(const Request& request, std::int64_t sequence,
                                           Clock::time_point at) {
  const double now = seconds_at(at == Clock::time_point{} ? base::coarse_now() : at);
  const std::span<const std::int64_t> shape =
      request.tensors.empty() ? std::span<const std::int64_t>{}
                              : std::span<const std::int64_t>(request.tensors.front().shape);
  const std::int64_t id = next_id_++;
  const std::size_t index = static_cast<std::size_t>(id) % capacity_;
  Slot& slot = slots_[index];
  slot.id = id;
  slot.sequence = sequence;
  slot.submitted_s = now;
  slot.negotiated_s = slot.executing_s = slot.finished_s = -1;
  slot.process_set_id = request.process_set_id;
  slot.tensors = static_cast<std::int32_t>(request.tensors.size());
  slot.op = request.op;
  slot.dtype = request.tensors.empty() ? DataType::Float32 : request.tensors.front().dtype;
  slot.phase = OpPhase::Submitted;
  slot.backend = 0;
  slot.failed_with_error = false;
  if (request.name.size() <= kInlineName) {
    slot.name_size = static_cast<std::uint8_t>(request.name.size());
    std::memcpy(slot.name, request.name.data(), request.name.size());
  } else {
    slot.name_size = kBeside;
    long_names_[index].assign(request.name);  // Keeps its capacity.
  }
  if (shape.size() <= kInlineDims) {
    slot.dims = static_cast<std::uint8_t>(shape.size());
    std::copy(shape.begin(), shape.end(), slot.shape);
  } else {
    slot.dims = kBeside;
    long_shapes_[index].assign(shape.begin(), shape.end());
  }
  return id;
}

void FlightRecorder::update(std::int64_t id, OpPhase phase, std::string_view backend,
                            std::string_view error) {
  if (id < 0) return;
  const double now = now_s();
  detail::MutexLock lock(mutex_);
  apply(id, phase, now, intern(backend), error);
}

std::uint8_t FlightRecorder::intern(std::string_view name) {
  if (name.empty()) return 0;
  for (std::size_t i = 0; i < backend_names_.size(); ++i) {
    if (backend_names_[i] == name) return static_cast<std::uint8_t>(i + 1);
  }
  // Backends are a fixed handful (shm, mpi, nccl, ...): a byte numbers them all.
  TUTTI_CHECK(backend_names_.size() < 0xfe, "more backend names than a flight record numbers");
  backend_names_.emplace_back(name);
  return static_cast<std::uint8_t>(backend_names_.size());
}

std::string_view FlightRecorder::name_of(std::size_t index, const Slot& slot) const {
  if (slot.name_size == kBeside) return long_names_[index];
  return {slot.name, slot.name_size};
}

Shape FlightRecorder::shape_of(std::size_t index, const Slot& slot) const {
  if (slot.dims == kBeside) return long_shapes_[index];
  return Shape(slot.shape, slot.shape + slot.dims);
}

FlightRecorder::Slot* FlightRecorder::advance(std::vector<Slot>& ring, std::int64_t id,
                                              OpPhase phase, double at,
                                              std::uint8_t backend) const {
  if (id < 0) return nullptr;
  Slot& slot = ring[static_cast<std::size_t>(id) % capacity_];
  if (slot.id != id || phase <= slot.phase) return nullptr;
  slot.phase = phase;
  switch (phase) {
    case OpPhase::Submitted: break;
    case OpPhase::Negotiated: slot.negotiated_s = at; break;
    case OpPhase::Executing:
      slot.executing_s = at;
      slot.backend = backend;
      break;
    case OpPhase::Done:
    case OpPhase::Failed: slot.finished_s = at; break;
  }
  return &slot;
}

void FlightRecorder::apply(std::int64_t id, OpPhase phase, double now, std::uint8_t backend,
                           std::string_view error) {
  Slot* slot = advance(slots_, id, phase, now, backend);
  // A record finishes once, so the message is never overwritten by a later one.
  if (slot == nullptr || error.empty() || phase < OpPhase::Done) return;
  errors_[static_cast<std::size_t>(id) % capacity_].assign(error);
  slot->failed_with_error = true;
}

void FlightRecorder::batch_begun(std::span<const std::size_t> positions) {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  list_.batch.assign(positions.begin(), positions.end());
  list_.executing_s = -1;
  list_.batch_deferred = false;
}

void FlightRecorder::batch_executing(std::string_view backend) {
  if (!enabled()) return;
  const double now = now_s();
  detail::MutexLock lock(mutex_);
  list_.executing_s = now;
  list_.backend = intern(backend);
}

void FlightRecorder::batch_finished(OpPhase phase, std::string_view error) {
  if (!enabled()) return;
  const double now = now_s();
  detail::MutexLock lock(mutex_);
  const bool failed_with_error = phase == OpPhase::Failed && !error.empty();
  for (const std::size_t position : list_.batch) {
    const std::int64_t id = list_.ids[position];
    if (id < 0) continue;
    const std::size_t index = static_cast<std::size_t>(id) % capacity_;
    Slot& slot = slots_[index];
    // Overwritten by a newer op, or finished already (phases never move back).
    if (slot.id != id || phase <= slot.phase) continue;
    // The first line only, once: what three updates wrote before.
    slot.negotiated_s = list_.negotiated_s;
    if (list_.executing_s >= 0) {
      slot.executing_s = list_.executing_s;
      slot.backend = list_.backend;
    }
    slot.finished_s = now;
    slot.phase = phase;
    if (failed_with_error) {
      errors_[index].assign(error);
      slot.failed_with_error = true;
    }
  }
  if (!list_.batch_deferred) list_.written += list_.batch.size();
  list_.batch.clear();
}

void FlightRecorder::batch_deferred() {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  apply_pending(list_.batch, /*executing=*/list_.executing_s >= 0);
  // Kept: if handing the batch on fails after all, batch_finished() still fails its records.
  if (!list_.batch_deferred) list_.written += list_.batch.size();
  list_.batch_deferred = true;
}

void FlightRecorder::list_ended() {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  // Every op of a list normally ends in one of its batches: no pass then.
  if (list_.written < list_.ids.size()) {
    for (const std::int64_t id : list_.ids)
      apply(id, OpPhase::Negotiated, list_.negotiated_s, 0, {});
  }
  list_.ids.clear();
  list_.batch.clear();
  list_.written = 0;
}

void FlightRecorder::apply_pending(std::span<const std::size_t> positions, bool executing) {
  for (const std::size_t position : positions) {
    const std::int64_t id = list_.ids[position];
    apply(id, OpPhase::Negotiated, list_.negotiated_s, 0, {});
    if (executing) apply(id, OpPhase::Executing, list_.executing_s, list_.backend, {});
  }
}

std::vector<FlightRecorder::Slot> FlightRecorder::slots_shown() const {
  std::vector<Slot> shown = slots_;
  for (const std::int64_t id : list_.ids)
    advance(shown, id, OpPhase::Negotiated, list_.negotiated_s, 0);
  if (list_.executing_s >= 0) {
    for (const std::size_t position : list_.batch)
      advance(shown, list_.ids[position], OpPhase::Executing, list_.executing_s, list_.backend);
  }
  return shown;
}

std::vector<debug::OpRecord> FlightRecorder::snapshot() const {
  std::vector<debug::OpRecord> records;
  if (!enabled()) return records;
  flush();
  detail::MutexLock lock(mutex_);
  const std::int64_t first =
      std::max<std::int64_t>(0, next_id_ - static_cast<std::int64_t>(capacity_));
  records.reserve(static_cast<std::size_t>(next_id_ - first));
  const std::vector<Slot> shown = slots_shown();
  for (std::int64_t id = first; id < next_id_; ++id) {
    const std::size_t index = static_cast<std::size_t>(id) % capacity_;
    const Slot& slot = shown[index];
    records.push_back(debug::OpRecord{.sequence = slot.sequence,
                                      .name = std::string(name_of(index, slot)),
                                      .op = std::string(to_string(slot.op)),
                                      .dtype = std::string(dtype_name(slot.tensors, slot.dtype)),
                                      .shape = shape_of(index, slot),
                                      .process_set_id = slot.process_set_id,
                                      .state = std::string(to_string(slot.phase)),
                                      .submitted_s = slot.submitted_s,
                                      .finished_s = slot.finished_s});
  }
  return records;
}

void FlightRecorder::set_context(DumpContext context) {
  detail::MutexLock lock(mutex_);
  context_ = std::move(context);
}

void FlightRecorder::set_process_sets(std::map<int, std::vector<int>> sets) {
  detail::MutexLock lock(mutex_);
  sets_ = std::move(sets);
}

std::string FlightRecorder::default_path() const {
  detail::MutexLock lock(mutex_);
  return default_dump_path(context_.dir, context_.rank);
}

std::string FlightRecorder::signal_dump_path(std::string_view signal) const {
  detail::MutexLock lock(mutex_);
  return default_dump_path(context_.dir, context_.rank, error_dumped_ ? signal : "");
}

std::string FlightRecorder::error_dump_path() {
  detail::MutexLock lock(mutex_);
  error_dumped_ = true;
  return default_dump_path(context_.dir, context_.rank);
}

void FlightRecorder::append_json(std::string& out, std::size_t index, const Slot& slot) const {
  out += "{\"sequence\": " + std::to_string(slot.sequence);
  out += ", \"set\": " + std::to_string(slot.process_set_id);
  out += ", \"name\": ";
  detail::append_json_string(out, name_of(index, slot));
  out += ", \"op\": \"";
  out += to_string(slot.op);
  out += "\", \"dtype\": \"";
  out += dtype_name(slot.tensors, slot.dtype);
  out += "\", \"shape\": ";
  out += detail::shape_string(shape_of(index, slot));  // "[3, 2]": a JSON array as it is.
  out += ", \"tensors\": " + std::to_string(slot.tensors);
  out += ", \"state\": \"";
  out += to_string(slot.phase);
  out += "\", \"backend\": ";
  detail::append_json_string(
      out, slot.backend != 0 ? std::string_view(backend_names_[slot.backend - 1u]) : "");
  const std::pair<const char*, double> times[] = {{"submitted_s", slot.submitted_s},
                                                  {"negotiated_s", slot.negotiated_s},
                                                  {"executing_s", slot.executing_s},
                                                  {"finished_s", slot.finished_s}};
  for (const auto& [key, value] : times) {
    out += ", \"";
    out += key;
    out += "\": ";
    append_number(out, value);
  }
  out += ", \"error\": ";
  detail::append_json_string(out, slot.failed_with_error ? std::string_view(errors_[index]) : "");
  out += '}';
}

Status FlightRecorder::dump(const std::string& path, std::string_view reason) const {
  // The OS reads a path up to its first NUL: the dump would go to a file not named.
  if (path.find('\0') != std::string::npos) {
    return Status(ErrorCode::InvalidArgument,
                  "flight recorder dump path contains a NUL character: " +
                      path.substr(0, path.find('\0')) + "\\0...");
  }
  std::string out = "{\"format\": \"tutti-flight-recorder\", \"version\": 1";
  flush();
  {
    detail::MutexLock lock(mutex_);
    out += ", \"job\": ";
    detail::append_json_string(out, context_.job);
    out += ", \"rank\": " + std::to_string(context_.rank);
    out += ", \"size\": " + std::to_string(context_.size);
    out += ", \"host\": ";
    detail::append_json_string(out, this_host());
    out += ", \"pid\": " + std::to_string(getpid());
    out += ", \"reason\": ";
    detail::append_json_string(out, reason);
    out += ", \"dumped_s\": ";
    append_number(out, now_s());
    out += ", \"capacity\": " + std::to_string(capacity_);
    out += ", \"recorded\": " + std::to_string(next_id_);
    out += ", \"sets\": {";
    bool first_set = true;
    for (const auto& [id, ranks] : sets_) {
      out += first_set ? "\"" : ", \"";
      first_set = false;
      out += std::to_string(id) + "\": ";
      out += "[" + detail::join_list(ranks) + "]";
    }
    out += "},\n\"ops\": [";
    const std::int64_t first =
        std::max<std::int64_t>(0, next_id_ - static_cast<std::int64_t>(capacity_));
    const std::vector<Slot> shown = slots_shown();
    for (std::int64_t id = first; id < next_id_; ++id) {
      out += id == first ? "\n  " : ",\n  ";
      const std::size_t index = static_cast<std::size_t>(id) % capacity_;
      append_json(out, index, shown[index]);
    }
  }
  out += "\n]}\n";

  const auto fail = [&](std::string_view what) {
    return invalid_argument(detail::str_cat("cannot write the flight recorder's dump '", path,
                                            "': ", what, ": ", std::strerror(errno)));
  };
  const std::filesystem::path target(path);
  if (target.has_parent_path()) {
    std::error_code ignored;  // An existing directory is fine; fopen below reports the rest.
    std::filesystem::create_directories(target.parent_path(), ignored);
  }
  // Beside the target, so the rename cannot cross file systems. Each dump has a temporary file
  // of its own: the pid tells processes apart, the counter this process's threads (a stall's
  // dump on the communication thread races a SIGTERM's on the dump thread; sharing one file,
  // one truncated the other's, renamed it half-written, or found it gone).
  static std::atomic<std::uint64_t> dumps{0};
  const std::string temporary = detail::str_cat(
      path, ".", getpid(), ".", dumps.fetch_add(1, std::memory_order_relaxed), ".tmp");
  std::FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) return fail("open");
  const bool written = std::fwrite(out.data(), 1, out.size(), file) == out.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) {
    const Status status = fail("write");
    std::remove(temporary.c_str());
    return status;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const Status status = fail("rename");
    std::remove(temporary.c_str());
    return status;
  }
  return Status();
}

}  // namespace tutti::core

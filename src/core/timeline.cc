// SPDX-License-Identifier: Apache-2.0
// Timeline: event formatting on the recording threads, file I/O on the writer thread.
#include "src/core/timeline.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "src/base/json.h"
#include "src/base/strings.h"
#include "src/common/logging.h"

namespace tutti::core {
namespace {

using namespace std::chrono_literals;

// The writer lets events pile up this long (or to this size) before one write, so the
// communication thread wakes it at most about ten times a second and the file sees few writes.
constexpr auto kFlushInterval = 100ms;
constexpr std::size_t kFlushBytes = std::size_t{1} << 16;
constexpr int kCyclesTid = 0;

// `path` opened for writing over its closing bracket, if it ends as stop() leaves a file;
// else null (the caller starts the file afresh).
std::FILE* open_at_end(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "r+");
  if (file == nullptr) return nullptr;
  constexpr std::string_view kEnd = "\n]\n";
  char tail[kEnd.size()];
  const auto back = -static_cast<long>(kEnd.size());
  if (std::fseek(file, back, SEEK_END) == 0 &&
      std::fread(tail, 1, kEnd.size(), file) == kEnd.size() &&
      std::string_view(tail, kEnd.size()) == kEnd && std::fseek(file, back, SEEK_END) == 0) {
    return file;
  }
  std::fclose(file);
  return nullptr;
}

}  // namespace

Status Timeline::start(const std::string& path, bool mark_cycles, const Resume* resume) {
  detail::MutexLock control(control_mutex_);
  stop_writer();
  std::FILE* file = nullptr;
  if (resume != nullptr && resume->path == path) file = open_at_end(path);
  const bool continued = file != nullptr;
  if (!continued) file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return invalid_argument(
        detail::str_cat("cannot open timeline file '", path, "': ", std::strerror(errno)));
  }
  {
    detail::MutexLock lock(mutex_);
    path_ = path;
    origin_ = continued ? resume->origin : Clock::now();
    pid_ = continued ? resume->pid + 1 : 0;
    // A continuation's first event replaces the closing bracket: its separator follows the
    // earlier last event.
    pending_ = continued ? "" : "[\n";
    has_events_ = continued;
    active_ = true;
    const std::string process = pid_ == 0 ? "tutti" : detail::str_cat("tutti session ", pid_ + 1);
    emit(kCyclesTid, 'M', "process_name", {{"name", process}});
    if (mark_cycles) emit(kCyclesTid, 'M', "thread_name", {{"name", "cycles"}});
  }
  file_ = file;
  writer_ = std::thread([this, file] { write_loop(file); });
  mark_cycles_.store(mark_cycles);
  enabled_.store(true);
  return Status();
}

Timeline::Resume Timeline::resume_point() {
  detail::MutexLock lock(mutex_);
  return {.path = path_, .origin = origin_, .pid = pid_};
}

void Timeline::stop() {
  detail::MutexLock control(control_mutex_);
  stop_writer();
}

void Timeline::stop_writer() {
  if (!writer_.joinable()) return;
  {
    detail::MutexLock lock(mutex_);
    enabled_.store(false);
    mark_cycles_.store(false);
    // Close what is open, so that B/E pairs balance on every track.
    for (auto& [name, track] : tracks_) {
      while (!track.open.empty()) close_span(track, track.open.front(), {});
    }
    pending_ += "\n]\n";
    active_ = false;
    stopping_ = true;
  }
  wake_writer_.notify_one();
  writer_.join();
  if (std::fclose(file_) != 0) {
    TUTTI_LOG_WARNING("closing the timeline file failed: ", std::strerror(errno));
  }
  file_ = nullptr;
  detail::MutexLock lock(mutex_);
  stopping_ = false;
  has_events_ = false;
  pending_.clear();
  tracks_.clear();
  next_tid_ = 1;
}

void Timeline::write_loop(std::FILE* file) {
  pthread_setname_np(pthread_self(), "tutti-timeline");
  std::string batch;
  bool failed = false;
  detail::MutexLock lock(mutex_);
  for (;;) {
    while (!stopping_ && pending_.empty()) wake_writer_.wait(mutex_);
    // Then gather more for a while, so that the file is written in batches.
    const auto flush_by = std::chrono::steady_clock::now() + kFlushInterval;
    while (!stopping_ && pending_.size() < kFlushBytes &&
           wake_writer_.wait_until(mutex_, flush_by)) {
    }
    batch.swap(pending_);  // pending_ takes the empty batch's capacity.
    const bool last = stopping_;
    mutex_.unlock();
    // Flushed per batch, so a job that dies keeps what was recorded up to about kFlushInterval.
    if (!failed && (std::fwrite(batch.data(), 1, batch.size(), file) != batch.size() ||
                    std::fflush(file) != 0)) {
      failed = true;
      TUTTI_LOG_WARNING("writing the timeline failed: ", std::strerror(errno));
    }
    batch.clear();
    if (last) {
      mutex_.lock();  // The scoped lock releases it.
      return;
    }
    mutex_.lock();
  }
}

Timeline::Track& Timeline::track(std::string_view tensor) {
  auto it = tracks_.find(tensor);
  if (it != tracks_.end()) return it->second;
  const int tid = next_tid_++;
  emit(tid, 'M', "thread_name", {{"name", tensor}});
  emit(tid, 'M', "thread_sort_index", {{"sort_index", tid}});  // Rows in order of appearance.
  return tracks_.emplace(std::string(tensor), Track{.tid = tid, .open = {}}).first->second;
}

Timeline::Track* Timeline::ended_track(std::string_view tensor) {
  if (!active_) return nullptr;
  auto it = tracks_.find(tensor);
  return it == tracks_.end() ? nullptr : &it->second;
}

void Timeline::open_span(Track& track, Span span, std::string_view name, Args args) {
  // Activities follow each other: a new one ends the previous one.
  if (span == Span::Activity && !track.open.empty() && track.open.back() == Span::Activity) {
    close_span(track, Span::Activity, {});
  }
  emit(track.tid, 'B', name, args);
  track.open.push_back(span);
}

void Timeline::close_span(Track& track, Span span, Args args) {
  if (std::find(track.open.begin(), track.open.end(), span) == track.open.end()) return;
  // E closes the innermost open B of its track, so close the inner spans first.
  for (Span inner = track.open.back(); inner != span; inner = track.open.back()) {
    emit(track.tid, 'E', {}, {});
    track.open.pop_back();
  }
  emit(track.tid, 'E', {}, args);
  track.open.pop_back();
}

void Timeline::emit(int tid, char phase, std::string_view name, Args args) {
  const std::size_t size_before = pending_.size();
  if (has_events_) pending_ += ",\n";
  has_events_ = true;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - origin_);
  const std::string ns_digits = std::to_string(1000 + ns.count() % 1000);  // "1ddd".
  pending_ += "{\"ph\":\"";
  pending_ += phase;
  pending_ += "\",\"ts\":";
  pending_ += std::to_string(ns.count() / 1000);
  pending_ += '.';
  pending_.append(ns_digits, 1, 3);
  pending_ += ",\"pid\":";
  pending_ += std::to_string(pid_);
  pending_ += ",\"tid\":";
  pending_ += std::to_string(tid);
  if (!name.empty()) {
    pending_ += ",\"name\":";
    detail::append_json_string(pending_, name);
  }
  if (phase == 'i') pending_ += ",\"s\":\"t\"";
  if (args.size() != 0) {
    char separator = '{';
    pending_ += ",\"args\":";
    for (const Arg& arg : args) {
      pending_ += separator;
      separator = ',';
      detail::append_json_string(pending_, arg.key);
      pending_ += ':';
      if (arg.is_number) {
        pending_ += std::to_string(arg.number);
      } else {
        detail::append_json_string(pending_, arg.text);
      }
    }
    pending_ += '}';
  }
  pending_ += "}";
  // Wake the writer for the first event after it emptied the buffer (it then waits for a batch)
  // and when the buffer fills; other events cost no system call.
  if (size_before == 0 || (size_before < kFlushBytes && pending_.size() >= kFlushBytes)) {
    wake_writer_.notify_one();
  }
}

void Timeline::negotiate_start(std::string_view tensor, std::string_view op) {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  if (!active_) return;
  std::string name = "NEGOTIATE_";
  name += op;
  open_span(track(tensor), Span::Negotiate, name, {});
}

void Timeline::negotiate_rank_ready(std::string_view tensor, int rank) {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  if (!active_) return;
  emit(track(tensor).tid, 'i', "rank " + std::to_string(rank), {{"rank", rank}});
}

void Timeline::negotiate_end(std::string_view tensor) {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  if (Track* open = ended_track(tensor)) close_span(*open, Span::Negotiate, {});
}

void Timeline::op_start(std::string_view tensor, std::string_view op, std::string_view dtype,
                        std::string_view shape) {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  if (active_) open_span(track(tensor), Span::Op, op, {{"dtype", dtype}, {"shape", shape}});
}

void Timeline::activity_start(std::string_view tensor, std::string_view activity) {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  if (active_) open_span(track(tensor), Span::Activity, activity, {});
}

void Timeline::activity_end(std::string_view tensor) {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  if (Track* open = ended_track(tensor)) close_span(*open, Span::Activity, {});
}

void Timeline::op_end(std::string_view tensor, std::string_view status) {
  if (!enabled()) return;
  detail::MutexLock lock(mutex_);
  if (Track* open = ended_track(tensor)) close_span(*open, Span::Op, {{"status", status}});
}

void Timeline::mark_cycle() {
  if (!mark_cycles_.load(std::memory_order_relaxed)) return;
  detail::MutexLock lock(mutex_);
  if (active_) emit(kCyclesTid, 'i', "CYCLE_START", {});
}

}  // namespace tutti::core

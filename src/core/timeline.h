// SPDX-License-Identifier: Apache-2.0
// The timeline: a Chrome-trace JSON file (Perfetto, chrome://tracing) of each tensor's
// negotiation, op and activities, written by rank 0 on a thread of its own so that the
// communication thread only formats events into memory.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "src/common/mutex.h"
#include "src/common/status.h"

namespace tutti::core {

// Records trace events into a buffer and writes them to one file at a time.
//
// Threads: every method may be called from any thread. The recording methods (negotiate_*,
// op_*, activity_*, mark_cycle) return after one atomic load while no file is open, and
// otherwise only format the event into memory under a mutex; the writer thread
// ("tutti-timeline", one per start()) alone writes the file. start() and stop() block while a
// previous file is finished.
//
// File: the JSON Array Format, `[` then one event per line; the closing `]` is written by
// stop(), and a crashed job's file still opens (the format allows the `]` to be missing). Each
// tensor is a track (pid 0 unless continued, tid assigned in order of first appearance, named by a
// thread_name metadata event); spans are B/E pairs on the tensor's track, instants "i" with
// "s":"t", and "ts" is in microseconds since start(). Spans nest as negotiation, then op containing
// activities; the *_end methods close only a span that is open, and stop() closes every open
// one, so B/E pairs balance on every track even when a file starts or stops mid-op.
class Timeline {
 public:
  Timeline() = default;
  ~Timeline() { stop(); }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  using Clock = std::chrono::steady_clock;

  // Where an earlier Timeline of this process wrote, so that a later one can continue that
  // file: Note [One TUTTI_TIMELINE file per process] in session.cc.
  struct Resume {
    std::string path;
    Clock::time_point origin;  // Of "ts": the continuation keeps the earlier clock.
    int pid = 0;               // The earlier timeline's; the continuation records as pid + 1.
  };

  // Opens (truncates) `path` and starts recording; CYCLE_START markers are recorded only with
  // `mark_cycles`. A timeline already running is stopped first, leaving its file complete.
  // With `resume` for the same path, and that file still ending as stop() left it, the events
  // go on in it instead (its closing bracket replaced): on resume's clock, as pid resume.pid + 1
  // named "tutti session <pid + 1>"; otherwise the file starts afresh.
  // InvalidArgument naming the path and the OS's reason if the file cannot be opened; then
  // nothing is recording.
  Status start(const std::string& path, bool mark_cycles, const Resume* resume = nullptr)
      TUTTI_EXCLUDES(control_mutex_, mutex_);
  // Where the file being written (or last written) continues; for a later start().
  Resume resume_point() TUTTI_EXCLUDES(mutex_);
  // Closes open spans, writes everything recorded and the closing bracket, and closes the file:
  // when it returns the file is complete, valid JSON. Events recorded concurrently with stop()
  // may be dropped. Idempotent; harmless without start().
  void stop() TUTTI_EXCLUDES(control_mutex_, mutex_);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Negotiation of `tensor` for collective `op` ("ALLREDUCE"): the span NEGOTIATE_<op> from the
  // first request's arrival at the coordinator until the tensor is ready, and in it an instant
  // "rank <r>" as each rank's request arrives, so the last one is the late rank.
  void negotiate_start(std::string_view tensor, std::string_view op) TUTTI_EXCLUDES(mutex_);
  void negotiate_rank_ready(std::string_view tensor, int rank) TUTTI_EXCLUDES(mutex_);
  void negotiate_end(std::string_view tensor) TUTTI_EXCLUDES(mutex_);

  // The op span, named `op`, with args dtype ("float32") and shape ("[2, 3]"); its end carries
  // args status ("OK" or the error). An open activity is closed by the next activity_start or
  // by op_end.
  void op_start(std::string_view tensor, std::string_view op, std::string_view dtype,
                std::string_view shape) TUTTI_EXCLUDES(mutex_);
  void activity_start(std::string_view tensor, std::string_view activity)  // "FUSION_PACK"
      TUTTI_EXCLUDES(mutex_);
  void activity_end(std::string_view tensor) TUTTI_EXCLUDES(mutex_);
  void op_end(std::string_view tensor, std::string_view status) TUTTI_EXCLUDES(mutex_);

  // An instant CYCLE_START on its own track ("cycles", tid 0), if started with mark_cycles.
  void mark_cycle() TUTTI_EXCLUDES(mutex_);

 private:
  // One of an event's args: a string, or a number (Chrome reads sort_index only as a number).
  struct Arg {
    Arg(std::string_view arg_key, std::string_view arg_text) : key(arg_key), text(arg_text) {}
    Arg(std::string_view arg_key, int arg_number)
        : key(arg_key), number(arg_number), is_number(true) {}
    std::string_view key;
    std::string_view text;
    int number = 0;
    bool is_number = false;
  };
  using Args = std::initializer_list<Arg>;
  enum class Span : std::uint8_t { Negotiate, Op, Activity };
  struct Track {
    int tid = 0;
    std::vector<Span> open;  // Innermost last.
  };
  // Finds tracks by string_view without building a std::string.
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  void stop_writer() TUTTI_REQUIRES(control_mutex_) TUTTI_EXCLUDES(mutex_);
  void write_loop(std::FILE* file) TUTTI_EXCLUDES(mutex_);  // The writer thread.

  // The helpers below also require active_, all but ended_track().
  // Created, with its metadata, on first use.
  Track& track(std::string_view tensor) TUTTI_REQUIRES(mutex_);
  // The track an *_end method closes a span on; null if not recording or never seen (a span
  // begun before this file started, whose B is not in it).
  Track* ended_track(std::string_view tensor) TUTTI_REQUIRES(mutex_);
  void open_span(Track& track, Span span, std::string_view name, Args args) TUTTI_REQUIRES(mutex_);
  // Closes `span` and any span inside it; nothing if `span` is not open.
  void close_span(Track& track, Span span, Args args) TUTTI_REQUIRES(mutex_);
  void emit(int tid, char phase, std::string_view name, Args args) TUTTI_REQUIRES(mutex_);

  // Serializes start() and stop(), which wait for the writer thread without holding mutex_.
  detail::Mutex control_mutex_;
  std::thread writer_ TUTTI_GUARDED_BY(control_mutex_);
  // Written by writer_ while it runs, which owns it then.
  std::FILE* file_ TUTTI_GUARDED_BY(control_mutex_) = nullptr;

  // Fast-path flags, set only while a file is open.
  std::atomic<bool> enabled_{false};
  std::atomic<bool> mark_cycles_{false};

  detail::Mutex mutex_;
  detail::CondVar wake_writer_;
  // Recording; false once stop() began, so late events are dropped.
  bool active_ TUTTI_GUARDED_BY(mutex_) = false;
  // The closing bracket is in pending_; the writer exits after it.
  bool stopping_ TUTTI_GUARDED_BY(mutex_) = false;
  bool has_events_ TUTTI_GUARDED_BY(mutex_) = false;
  Clock::time_point origin_ TUTTI_GUARDED_BY(mutex_);
  std::string path_ TUTTI_GUARDED_BY(mutex_);
  int pid_ TUTTI_GUARDED_BY(mutex_) = 0;  // Of every event: 0 unless continuing (see Resume).
  std::string pending_ TUTTI_GUARDED_BY(mutex_);  // Formatted, not yet written.
  std::unordered_map<std::string, Track, NameHash, std::equal_to<>> tracks_
      TUTTI_GUARDED_BY(mutex_);
  int next_tid_ TUTTI_GUARDED_BY(mutex_) = 1;
};

}  // namespace tutti::core

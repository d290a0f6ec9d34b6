// SPDX-License-Identifier: Apache-2.0
// The coordinator's fast path for cache hits: ops that the members have so far sent only as
// cache ids, counted per run of consecutive ids instead of filed per name. See Note [Hit fast
// path] in negotiation/coordinator.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

namespace tutti::core {

// Communication thread of the coordinator only.
class HitTable {
 public:
  using Clock = std::chrono::steady_clock;

  // Cache ids [first, first + count), ops of one process set that the same members have sent.
  // Runs never overlap.
  struct Run {
    std::int32_t first = 0;
    std::int32_t count = 0;
    int process_set_id = 0;
    int size = 0;     // Members of the set.
    int members = 0;  // Members that sent the run.
    Clock::time_point first_seen;
    bool queued = false;  // Every member sent it: in the coordinator's ready list.
    // Which set ranks sent the run, a bit each: ranks 0-63 here, the rest (large sets only) in
    // `high`, so that runs of sets up to 64 ranks allocate nothing but their node.
    std::uint64_t low = 0;
    std::vector<std::uint64_t> high;

    std::int32_t end() const { return first + count; }
    bool has(int set_rank) const;
  };

  bool empty() const { return runs_.empty(); }
  // The run holding `id`, or null. Runs stay where they are until taken (a split leaves the
  // first part in place), so pointers and references stay valid until then.
  Run* find(std::int32_t id);
  // The run holding `id`, or else the first run after it; null if neither.
  Run* find_from(std::int32_t id);
  // A new run of ids [first, first + count) (none of which is in a run) of set
  // `process_set_id`, which has `size` members, sent by no member yet.
  Run& start(std::int32_t first, std::int32_t count, int process_set_id, int size,
             Clock::time_point first_seen);
  // Cuts `run` before `at` (run.first < at < run.end()): `run` keeps the ids before it, and the
  // returned run, a copy of its state, holds the rest.
  Run& split(Run& run, std::int32_t at);
  // Counts set rank `set_rank`'s hits on every id of `run`; true when every member has sent
  // them. A rank that sends a pending id twice is a bug (TUTTI_CHECK).
  bool add(Run& run, int set_rank);
  // Removes and returns the run that starts at `first`, which must exist.
  Run take(std::int32_t first);
  // Removes `id` from its run, which must exist (splitting the run around it), and returns
  // what is left for `id` alone: a run of one id.
  Run take_id(std::int32_t id);
  // Calls `visit(const Run&)` for every run, in order of ids.
  template <class Visit>
  void for_each(Visit&& visit) const {
    for (const auto& [first, run] : runs_) visit(run);
  }

 private:
  // By first id. A node per run: a step's worth of ops travels in a few runs per rank, so
  // the tree stays small, and its nodes never move.
  std::map<std::int32_t, Run> runs_;
};

}  // namespace tutti::core

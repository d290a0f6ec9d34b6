// SPDX-License-Identifier: Apache-2.0
// The coordinator's fast path for cache hits: ops that the members have so far sent only as
// cache ids, counted per run of consecutive ids instead of filed per name. See Note [Hit fast
// path] in negotiation/coordinator.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "src/core/id_index.h"

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

  bool empty() const { return runs_.empty() && singles_ == 0; }
  // The run holding `id`, or null. Pointers and references stay valid until the next start() or
  // take (a split leaves the first part in place).
  Run* find(std::int32_t id);
  // The run holding `id`, or else the first run after it that was started with two or more ids
  // (or is a part of one); null if neither. Runs started with one id are found by find() only.
  Run* find_from(std::int32_t id);
  // The run started with `id` alone, or null (a shortcut of find() for ids that no run of the
  // ordered part holds).
  Run* find_single(std::int32_t id) {
    if (singles_ == 0) return nullptr;
    const std::uint32_t* at = single_at_.find(id);
    return at == nullptr ? nullptr : &single_runs_[*at];
  }
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
  // Calls `visit(const Run&)` for every run, in no particular order.
  template <class Visit>
  void for_each(Visit&& visit) const {
    for (const auto& [first, run] : runs_) visit(run);
    for (const Run& run : single_runs_) {
      if (run.count > 0) visit(run);
    }
  }

 private:
  // Runs started with two or more ids, by first id. A node per run: a step's worth of ops
  // travels in a few runs per rank, so the tree stays small, and its nodes never move.
  std::map<std::int32_t, Run> runs_;
  // Runs started with one id: where ranks submit in orders of their own, nearly every hit is
  // one, and a node and a tree walk each cost several times a flat table's probe (P3 with
  // each rank's order shuffled every step: 21 % more instructions per op on the coordinator
  // than per-id counting, before this table). Slots of taken runs (count 0) are reused.
  std::vector<Run> single_runs_;
  std::vector<std::uint32_t> free_singles_;
  IdIndex<std::uint32_t> single_at_;  // Id -> slot in single_runs_ (Note [Id index]).
  std::size_t singles_ = 0;
};

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// The coordinator's fast path for cache hits: ops that the members have so far sent only as one
// cache id, counted per id instead of filed per name. See Note [Hit fast path] in
// negotiation/coordinator.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/core/id_index.h"
#include "src/core/response_cache.h"

namespace tutti::core {

// Communication thread of the coordinator only.
class HitTable {
 public:
  using Clock = std::chrono::steady_clock;

  // One op that members sent as cache id `id`.
  struct Pending {
    std::int32_t id = -1;
    // What the id stands for (set, name, every member's request). Shared with the cache, so it
    // outlives an eviction of the id: the op is then negotiated from these requests.
    std::shared_ptr<const CoordinatorCache::Entry> op;
    int size = 0;   // Members of the set.
    int count = 0;  // Members that sent the id.
    Clock::time_point first_seen;
    bool queued = false;  // Every member sent it: in the coordinator's ready list.
    // Which set ranks sent the id, a bit each: ranks 0-63 here, the rest (large sets only) in
    // `high`, so that records of sets up to 64 ranks allocate nothing.
    std::uint64_t low = 0;
    std::vector<std::uint64_t> high;

    bool has(int set_rank) const;
  };

  bool empty() const { return live_ == 0; }
  // The record of `id`, or null. Records stay where they are until take(), but start() may move
  // them: pointers and references are valid until the next start().
  Pending* find(std::int32_t id);
  // A new record for `id` (which has none), standing for `op`, a set of `size` members.
  Pending& start(std::int32_t id, std::shared_ptr<const CoordinatorCache::Entry> op, int size,
                 Clock::time_point first_seen);
  // Counts set rank `set_rank`'s hit on `pending`; true when every member has sent it. A rank
  // that sends the same pending id twice is a bug (TUTTI_CHECK).
  bool add(Pending& pending, int set_rank);
  // Removes and returns the record of `id`, which must exist.
  Pending take(std::int32_t id);
  // Removes the record of `id`, which must exist, handing back only what it stood for: take()
  // without the copy of the record (the coordinator's replay of a counted hit, once per op).
  std::shared_ptr<const CoordinatorCache::Entry> take_op(std::int32_t id);
  // The ids of every record, in no particular order.
  std::vector<std::int32_t> ids() const;
  // Calls `visit(const Pending&)` for every record, in no particular order.
  template <class Visit>
  void for_each(Visit&& visit) const {
    for (const Pending& pending : records_) {
      if (pending.id >= 0) visit(pending);
    }
  }

 private:
  // Records, live ones with id >= 0; freed ones are reused (a step's worth of records is taken
  // and started again each step, so steady state allocates nothing here).
  std::vector<Pending> records_;
  std::vector<std::uint32_t> free_;
  std::size_t live_ = 0;
  // Each pending id's record index (Note [Id index] in id_index.h). A std::unordered_map cost
  // three times the instructions per op (P3).
  IdIndex<std::uint32_t> index_;
};

}  // namespace tutti::core

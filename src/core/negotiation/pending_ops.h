// SPDX-License-Identifier: Apache-2.0
// The ops the coordinator has filed by name and not yet answered (step 2 of Note [Negotiation]
// in negotiation/coordinator.h).
//
// Note [Pending ops by name]
// Every op that is not a counted cache hit (Note [Hit fast path]) is filed by (set, name) as
// each member's request arrives and taken out when it is answered: on a step of 10,000 uncached
// ops (the cache off, unnamed ops, names a full cache keeps out, every op's first step) that is
// 10,000 lookups, inserts and removals a step on rank 0. A std::unordered_map<std::string,
// Pending> per set did each with a node allocated and freed, the name copied into the node and
// again into the ready list, a vector of request slots allocated per op, and the name hashed
// twice (filed, then taken). Here an op is a record found through a NameIndex (one probe; the
// hash computed once and kept with the record), the ready list holds a pointer to it, and a
// taken record is kept, with its name's and request slots' allocations, for the next op (up to
// kSpare records and kSpareSlots slots among them), so steady traffic allocates nothing here.
// Records live on the heap: a pointer to one stays valid while the index moves its slots. Rank 0
// under perf (P3's driver with the cache off: 10,000 one-float ops a step, 150 steps, 2 ranks on
// the 2-core AMD EPYC VM of family 26; samples at 1 kHz): filing 221 samples before, 119 after; the
// whole coordinator (filing, then answering) 571 before, 453 after, and 399 with Note [Requests'
// blocks kept] in negotiation/coordinator.cc. Figures: examples/BENCHMARK_LOG.md, forty-ninth
// round.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/core/name_index.h"
#include "src/core/op_key.h"
#include "src/core/request.h"

namespace tutti::core {

// One op filed by name: which members have submitted it.
struct PendingOp {
  int process_set_id = 0;
  std::string name;
  std::uint64_t hash = 0;                                // name_hash() of (process_set_id, name).
  std::vector<std::shared_ptr<const Request>> requests;  // By set rank; null until submitted.
  int count = 0;                                         // Non-null requests.
  std::int32_t common_hit = -2;  // -2: nothing yet; -1: not all the same hit; else the id.
  std::chrono::steady_clock::time_point first_seen;
  bool queued = false;  // In the coordinator's ready list.
};

// The coordinator's pending ops of every set (Note [Pending ops by name]). Communication thread
// of the coordinator only.
class PendingOps {
 public:
  bool empty() const { return index_.empty(); }
  std::size_t size() const { return index_.size(); }

  // The op pending under `key` (whose name_hash() is `hash`); null if none.
  PendingOp* find(OpKeyView key, std::uint64_t hash) {
    const std::unique_ptr<PendingOp>* op = index_.find(key, hash);
    return op == nullptr ? nullptr : op->get();
  }
  const PendingOp* find(OpKeyView key, std::uint64_t hash) const {
    const std::unique_ptr<PendingOp>* op = index_.find(key, hash);
    return op == nullptr ? nullptr : op->get();
  }
  // The op pending under `key`, made if there is none: `members` empty request slots, first
  // seen `now`. `*made` says which. The record stays where it is until take() or take_set().
  PendingOp& file(OpKeyView key, std::uint64_t hash, int members,
                  std::chrono::steady_clock::time_point now, bool* made);
  // Takes `op` (pending here) out of the table: the caller decides it, then gives it back
  // with recycle().
  std::unique_ptr<PendingOp> take(const PendingOp& op);
  // A taken op's record, kept for a later file() (up to kSpare of them, with kSpareSlots
  // request slots among them).
  void recycle(std::unique_ptr<PendingOp> op);
  // Drops every op of set `process_set_id` (the set was removed).
  void take_set(int process_set_id);
  // Calls `visit(PendingOp&)` (`visit(const PendingOp&)`) for every pending op, in no
  // particular order.
  template <class Visit>
  void for_each(Visit&& visit) {
    index_.for_each([&](const std::unique_ptr<PendingOp>& op) { visit(*op); });
  }
  template <class Visit>
  void for_each(Visit&& visit) const {
    index_.for_each([&](const std::unique_ptr<PendingOp>& op) { visit(std::as_const(*op)); });
  }

  // Records kept for reuse at most: a step's worth of P3's ops. And request slots kept among
  // them at most (2 MB of them): a record has a slot per member, so in a large job fewer records
  // are kept (kSpareSlots / members), as the response cache grows less (Note [Cache growth]).
  static constexpr std::size_t kSpare = 16384;
  static constexpr std::size_t kSpareSlots = 131072;
  std::size_t spare() const { return spare_.size(); }

 private:
  struct KeyOf {
    OpKeyView operator()(const std::unique_ptr<PendingOp>& op) const {
      return {op->process_set_id, op->name};
    }
  };
  NameIndex<std::unique_ptr<PendingOp>, KeyOf> index_;
  std::vector<std::unique_ptr<PendingOp>> spare_;
  std::size_t spare_slots_ = 0;  // The request slots' capacity of spare_'s records.
};

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// Negotiation: the coordinator's bookkeeping of which ops every member of a set has submitted.
//
// Note [Negotiation]
// 1. Each rank's communication thread drains its newly submitted ops and sends them to the
//    coordinator (global rank 0) as one RequestList: full requests, or cache ids standing for
//    them (see response_cache.h). The coordinator handles its own list without a message.
// 2. The coordinator files each request under (process set, name). When every member of the
//    set has submitted the name, the op is ready: if all members sent the same cache id the
//    cached response is reused, otherwise negotiate_response() validates the requests and
//    builds a Response (an error Response on any disagreement).
// 3. The coordinator sends the ready responses, in the order they became ready, to every rank
//    as one ResponseList, and executes the list itself.
// 4. Every rank executes the responses of a list in list order.
//
// Note [Join]
// join() lets a rank that ran out of data stop submitting while the others go on.
// 1. join() submits a Join request named kJoinName in its set and blocks. The coordinator
//    files it like any op, and also marks the rank joined in the set (remembering it as the
//    last joiner so far).
// 2. While members have joined, an op is ready once every member that has NOT joined has
//    submitted it (the arrival of a join re-checks every pending op of the set). Its Response
//    is always negotiated afresh, never replayed from the cache, and lists in `joined` the
//    set ranks that have no request for it; alltoall, reducescatter and process-set changes
//    fail with InvalidArgument while anyone has joined, and so does a broadcast whose root
//    is absent. Such responses are not cached.
// 3. A joined rank still executes every response of its set at its place in the list, with
//    no Entry of its own: its communication thread contributes zeros of the response's spec
//    to an allreduce (so Average still divides by the full set size), no rows to an
//    allgather, receives a broadcast into scratch memory and enters barriers. Every member
//    thus calls the same collectives in the same order. It also moves its counter of
//    automatic names past those of the ops it missed, so unnamed ops (barrier() has no name)
//    still match after the join (see Note [Automatic names] in tensor_queue.h).
// 4. When every member has joined, the Join is ready: its Response carries last_joined_rank,
//    completes every member's join() with it, and the set's joined state is cleared.
// A rank's requests reach the coordinator in submission order, so an op a rank submitted
// before join() is filed (with its data) before its join.
//
// Process-set changes (add_process_set, remove_process_set) are ops on the global set named
// "tutti.process_set.<n>", n counting each rank's calls. When one is ready the coordinator
// alone decides it: it refuses a duplicate or unknown set, numbers new sets 1, 2, ... and
// updates its own sets at once, so later requests for a new set are understood and those of a
// removed set dropped. Every rank applies the change when it executes the response, at the
// same point of the order, which is what communicator creation (collective over all ranks)
// needs.
//
// Note [Same decision on every rank]
// Only the coordinator decides, and every rank receives its decisions through one FIFO
// channel, so every rank executes the same responses in the same order, across all process
// sets. That total order is what keeps collectives on overlapping sets from deadlocking, and
// it is why fusion planning depends only on the responses, never on local state.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/core/request.h"
#include "src/core/response_cache.h"
#include "src/core/timeline.h"

namespace tutti::core {

using Clock = std::chrono::steady_clock;

// Communication thread of the coordinator only.
class Coordinator {
 public:
  explicit Coordinator(std::int64_t cache_capacity) : cache_(cache_capacity) {}

  // The members (sorted global ranks) of a process set.
  void add_set(int id, std::vector<int> global_ranks);
  // Forgets a set: its pending ops and cache entries. Evicted cache ids go in the next list.
  void remove_set(int id);
  // The id the next AddProcessSet gets: sets are numbered 1, 2, ... in decision order, and the
  // coordinator is the only one who numbers them, so ids are equal on every rank.
  int next_set_id() const { return next_set_id_; }

  // Files one rank's message (step 2). Cache ids the coordinator no longer knows are
  // appended to `resend`.
  void receive(int global_rank, RequestList list, Clock::time_point now,
               std::vector<std::int32_t>* resend);
  bool has_ready() const { return !ready_.empty() || !evicted_.empty(); }
  // The ready responses in readiness order, with cache bookkeeping (step 3).
  ResponseList take_ready();
  // Records negotiation spans (a span per op, an instant per rank's arrival) into `timeline`,
  // which must outlive the coordinator. Null = none.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }
  // Some rank asked to shut down.
  bool shutdown_requested() const { return shutdown_requested_; }

  // An op some members have not submitted after `after`.
  struct Stall {
    int process_set_id = 0;
    std::string name;
    std::vector<int> missing;  // Global ranks.
    Clock::duration waited{};
  };
  std::vector<Stall> stalls(Clock::time_point now, Clock::duration after) const;

 private:
  struct Pending {
    std::vector<std::shared_ptr<const Request>> requests;  // By set rank; null until submitted.
    int count = 0;
    std::int32_t common_hit = -2;  // -2: nothing yet; -1: not all the same hit; else the id.
    Clock::time_point first_seen;
    bool queued = false;  // In ready_.
  };
  struct SetState {
    std::vector<int> ranks;
    std::unordered_map<int, int> set_rank;  // Global rank -> set rank.
    std::unordered_map<std::string, Pending> pending;
    std::vector<bool> joined;  // By set rank; see Note [Join].
    int last_joined = -1;      // Global rank.
  };

  void file(int global_rank, std::shared_ptr<const Request> request, std::int32_t hit,
            Clock::time_point now);
  // Every member has submitted the op or joined.
  static bool is_ready(const SetState& set, const Pending& pending);
  // Marks `global_rank` joined and queues the ops that were waiting only for it.
  void join(int set_id, SetState& set, int global_rank);
  // The response for one ready op (steps 2 and 4 of Note [Join]); cache ids evicted on the
  // way go to `evicted`.
  Response decide(int set_id, SetState& set, const std::string& name, Pending& pending,
                  std::vector<std::int32_t>* evicted);
  // Applies a negotiated AddProcessSet or RemoveProcessSet to the coordinator's sets, or
  // turns it into an error response (a duplicate or unknown set).
  void change_sets(Response& response, std::vector<std::int32_t>* evicted);

  CoordinatorCache cache_;
  Timeline* timeline_ = nullptr;
  std::map<int, SetState> sets_;
  std::vector<std::pair<int, std::string>> ready_;  // (set, name) in readiness order.
  std::vector<std::int32_t> evicted_;
  bool shutdown_requested_ = false;
  int next_set_id_ = 1;
};

}  // namespace tutti::core

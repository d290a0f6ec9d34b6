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

  // Files one rank's message (step 2). Cache ids the coordinator no longer knows are
  // appended to `resend`.
  void receive(int global_rank, RequestList list, Clock::time_point now,
               std::vector<std::int32_t>* resend);
  bool has_ready() const { return !ready_.empty() || !evicted_.empty(); }
  // The ready responses in readiness order, with cache bookkeeping (step 3).
  ResponseList take_ready();
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
  };
  struct SetState {
    std::vector<int> ranks;
    std::unordered_map<int, int> set_rank;  // Global rank -> set rank.
    std::unordered_map<std::string, Pending> pending;
  };

  void file(int global_rank, std::shared_ptr<const Request> request, std::int32_t hit,
            Clock::time_point now);

  CoordinatorCache cache_;
  std::map<int, SetState> sets_;
  std::vector<std::pair<int, std::string>> ready_;  // (set, name) in readiness order.
  std::vector<std::int32_t> evicted_;
  bool shutdown_requested_ = false;
};

}  // namespace tutti::core

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
//    builds a Response (an error Response on any disagreement). Cache hits are counted per id
//    rather than filed by name while nothing needs the name (Note [Hit fast path]).
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
//    still match after the join (see Note [Automatic names] in automatic_name.h).
// 4. When every member has joined, the Join is ready: its Response carries last_joined_rank,
//    completes every member's join() with it, and the set's joined state is cleared.
// A rank's requests reach the coordinator in submission order, so an op a rank submitted
// before join() is filed (with its data) before its join.
// Stalls: a pending join is reported like any op, naming the members that have not joined,
// once the set has seen no other submission for the stall time (while the others still
// submit ops, waiting is what join is for).
//
// Process-set changes (add_process_set, remove_process_set) are ops on the global set named
// "tutti.process_set.<n>", n counting each rank's calls. When one is ready the coordinator
// alone decides it: it refuses a duplicate or unknown set and numbers new sets 1, 2, ....
// Every rank, the coordinator first, applies the change to its ProcessSetTable when it
// executes the response, at the same point of the order, which is what communicator creation
// (collective over all ranks) needs. The coordinator executes each list before it files more
// requests, so a new set's requests always find the set, and a removed set's are dropped.
//
// Note [Hit fast path]
// In steady state every member sends the same cache id for an op, and filing each of them under
// the op's name (a request pointer per rank, a map entry and a name copy per op) costs more than
// the collective of a tiny tensor. So the coordinator counts hits instead (HitTable), and counts
// them per run of consecutive ids: the ops of a step are cached in the order they first became
// ready, and the ranks submit them in that order again, so a rank's list of hits is mostly a
// few runs of ascending ids (P3: 10,000 ops a step in a few dozen runs). A run is one set's ops
// that the same members have sent, with a bit per member; it is cut where a member's run
// starts or ends inside it, and it is ready, as a whole and in the same readiness order, when
// every member has sent it. Its ops then travel to the ranks as one entry of the response list
// (ResponseList::hit). Only the first member's hits on an id are looked at one by one (is the
// id cached, of which set, may it be counted); the other members' runs are counted per run.
// An op leaves its run for the named bookkeeping of step 2 (with the cached request of each
// member counted so far) whenever a hit no longer says enough:
//  - a member sends a full request under the same name (its request differs from the cached
//    one, or its cache lost the id): the op is then negotiated from the requests;
//  - a member of its set joins (Note [Join]): readiness then depends on who has joined;
//  - its id is evicted (by an insert or a set's removal) before every member sent it; with the
//    id gone, later members send full requests, which must find the others' by name.
// Hits go to the named bookkeeping directly while the op's name is pending there, while a
// member of the set has joined, and while the timeline records negotiation spans. A run every
// member has sent stays whole until take_ready(): each of its ids is replayed if it is still
// cached and no member has joined, else negotiated afresh from the requests it stood for (an
// id evicted meanwhile keeps its entry aside for that). The stall inspector sees counted ops
// like named ones, missing ranks being the members whose bit is not set.
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
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/core/negotiation/hit_table.h"
#include "src/core/negotiation/pending_ops.h"
#include "src/core/process_set_table.h"
#include "src/core/request.h"
#include "src/core/response_cache.h"
#include "src/core/timeline.h"

namespace tutti::core {

using Clock = std::chrono::steady_clock;

// The coordinator's negotiation state: which members of each set have submitted which ops,
// who has joined, and the response cache. Set membership is not kept here: it is read from
// the session's ProcessSetTable (its one owner), which every rank, this one included, updates
// when it executes a set change. Communication thread of the coordinator (rank 0) only.
class Coordinator {
 public:
  // `sets` and `timeline` (null = none) must outlive the coordinator. The response cache holds
  // `cache_capacity` entries and grows up to `cache_growth_limit` (Note [Cache growth] in
  // response_cache.h).
  Coordinator(const ProcessSetTable& sets, std::int64_t cache_capacity,
              std::int64_t cache_growth_limit, Timeline* timeline)
      : sets_(sets), cache_(cache_capacity, cache_growth_limit), timeline_(timeline) {}
  // A response cache that never grows.
  Coordinator(const ProcessSetTable& sets, std::int64_t cache_capacity, Timeline* timeline)
      : Coordinator(sets, cache_capacity, cache_capacity, timeline) {}

  // Files one rank's requests and cache hits (step 2). Cache ids the coordinator no longer
  // knows are appended to `resend`. Requests of a set this rank is not in, or of a set that
  // does not exist (any more), are dropped: the rank's own call refused them or failed them.
  void receive(int global_rank, RequestList list, Clock::time_point now,
               std::vector<std::int32_t>* resend);
  bool has_ready() const { return !ready_.empty(); }
  // The ready responses in readiness order, with cache bookkeeping (step 3). Set changes among
  // them are decided here (numbering new sets); the caller must execute the list on this rank
  // before filing further requests, so that the table knows the change.
  ResponseList take_ready();

  // An op some members have not submitted after `after`.
  struct Stall {
    int process_set_id = 0;
    std::string name;
    std::vector<int> missing;  // Global ranks.
    Clock::duration waited{};
  };
  std::vector<Stall> stalls(Clock::time_point now, Clock::duration after) const;
  // No op is pending: nothing submitted by some rank and not yet answered.
  bool empty() const;

 private:
  // A set as negotiation sees it.
  struct SetState {
    SetInfo info;
    int named = 0;             // Its ops in pending_ (filed by name).
    std::vector<bool> joined;  // By set rank; see Note [Join].
    int joined_count = 0;      // Set ranks in `joined`.
    int last_joined = -1;      // Global rank.
    // When a member last submitted an op other than a join: while members still train, a
    // joined rank's wait is not a stall.
    Clock::time_point last_submission{};
  };
  // Set changes decided in the list being built, not yet in the table (take_ready() only).
  struct Decided {
    std::map<int, std::vector<int>> added;  // Id -> sorted global ranks.
    std::set<int> removed;
  };

  // An op in readiness order: an op pending by name in its set, or (`hit` >= 0) a run of counted
  // cache hits, ids [hit, hit + hits).
  struct Ready {
    int process_set_id = 0;
    // In pending_ until take_ready() takes it, unless its set was removed: it is read only
    // while its set exists. Null for a run of hits.
    PendingOp* op = nullptr;
    // op's name_hash(), kept here so that take_ready() can prefetch for an op ahead without
    // reading its record (Note [Admission prefetch] in coordinator.cc). 0 for a run of hits.
    std::uint64_t hash = 0;
    std::int32_t hit = -1;
    std::int32_t hits = 0;
  };

  // The negotiation state of set `id`, created from the table on first use; null if the set
  // does not exist.
  SetState* state(int id);
  void file(int global_rank, std::shared_ptr<const Request> request, std::int32_t hit,
            Clock::time_point now);
  // Whether a hit on cached op `id` of `set` may be counted (Note [Hit fast path]) rather than
  // filed by name. Reads the op's entry only while some op of the set is filed by name.
  bool can_count(const SetState& set, std::int32_t id) const;
  // Files `global_rank`'s hits on cache ids [first, first + count) (Note [Hit fast path]).
  void receive_hits(int global_rank, std::int32_t first, std::int32_t count, Clock::time_point now,
                    std::vector<std::int32_t>* resend);
  // receive_hits() of ids [first, end), which no run of two or more ids holds: counted on runs
  // of one id already there, in new runs where they may be, else filed by name or answered with
  // "resend".
  void start_hits(int global_rank, std::int32_t first, std::int32_t end, Clock::time_point now,
                  std::vector<std::int32_t>* resend);
  // Counts set rank `set_rank`'s hits on `run` (Note [Hit fast path]).
  void count_hit(HitTable::Run& run, SetState& set, int set_rank, Clock::time_point now);
  // `global_rank`'s set rank in `set`, which its cache hit `id` belongs to (TUTTI_CHECK).
  static int member_rank(const SetState& set, int global_rank, std::int32_t id);
  // Moves the counted hits on `id`, which stands for `op`, to the named bookkeeping, unless
  // every member has sent it; drops them if their set is gone.
  void hit_to_named(std::int32_t id, const CoordinatorCache::Entry& op);
  // `id`, which stood for `op`, was evicted: its counted hits move to the named bookkeeping,
  // or, if every member has sent it, `op` is kept for take_ready() (orphans_).
  void evicted_hit(std::int32_t id, std::shared_ptr<const CoordinatorCache::Entry> op);
  // take_ready() of a run of counted hits: each id replayed, or negotiated afresh.
  void take_hits(const Ready& item, Decided& decided, ResponseList& list);
  // Appends replays of cache ids [first, first + count) to `list`, in the run of its last entry
  // if they continue it.
  static void append_hits(ResponseList& list, std::int32_t first, std::int32_t count);
  // Decides one ready op, files it in the cache if cacheable, and appends it to `list`; ids it
  // evicts move their counted hits to the named bookkeeping. `pending.hash` is name_hash() of
  // (set_id, name): the cache files the op under it.
  void respond(int set_id, SetState& set, const std::string& name, PendingOp& pending,
               Decided& decided, ResponseList& list);
  // Every member has submitted the op or joined.
  static bool is_ready(const SetState& set, const PendingOp& pending);
  // Marks `global_rank` joined and queues the ops that were waiting only for it.
  void join(int set_id, SetState& set, int global_rank);
  // The response for one ready op (steps 2 and 4 of Note [Join]); cache ids evicted on the
  // way go to `evicted`.
  Response decide(int set_id, SetState& set, const std::string& name, PendingOp& pending,
                  Decided& decided, std::vector<std::int32_t>* evicted);
  // Decides a negotiated AddProcessSet or RemoveProcessSet, or turns it into an error response
  // (a duplicate or unknown set).
  void change_sets(Response& response, Decided& decided, std::vector<std::int32_t>* evicted);

  const ProcessSetTable& sets_;
  CoordinatorCache cache_;
  Timeline* timeline_;
  std::map<int, SetState> states_;
  PendingOps pending_;              // Ops filed by name, of every set (Note [Pending ops by name]).
  SetState* last_state_ = nullptr;  // state()'s last answer: ops come in runs of one set.
  HitTable hits_;                   // Counted cache hits (Note [Hit fast path]).
  // What the ids of ready runs that were evicted before take_ready() stood for.
  std::unordered_map<std::int32_t, std::shared_ptr<const CoordinatorCache::Entry>> orphans_;
  std::vector<Ready> ready_;   // In readiness order.
  std::vector<Ready> taking_;  // take_ready()'s list of ready_; empty between calls.
  int next_set_id_ = 1;        // Sets are numbered 1, 2, ... in decision order, here only.
};

}  // namespace tutti::core

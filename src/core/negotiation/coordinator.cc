// SPDX-License-Identifier: Apache-2.0
// The coordinator's bookkeeping: filing requests, readiness (with joined ranks), responses,
// process-set changes. See Note [Negotiation] and Note [Join] in negotiation/coordinator.h.
#include "src/core/negotiation/coordinator.h"

#include <algorithm>

#include "src/base/recycling_allocator.h"
#include "src/base/strings.h"
#include "src/common/check.h"
#include "src/common/logging.h"
#include "src/core/automatic_name.h"
#include "src/core/negotiation/validation.h"

namespace tutti::core {
namespace {

using detail::str_cat;

bool is_set_change(Collective op) {
  return op == Collective::AddProcessSet || op == Collective::RemoveProcessSet;
}

// Join responses, set changes and responses shaped by a join are one-offs: replaying them
// from the cache would bypass the coordinator's state.
//
// Note [Automatic names are not cached]
// Nor is an op with an automatic name (Note [Automatic names] in automatic_name.h): it never
// comes back, so its entry could never hit, and while the cache is full each insert evicts an
// entry that could, on every rank. A P3 driver of 10,000 unnamed one-float ops a step (2 ranks
// on the 2-core AMD EPYC VM, median step, five rounds in turns) took 26.5-38.9 ms so, against
// 13.0-19.3 ms with the cache off: the churn cost more than the negotiation itself. Uncached,
// 12.9-23.0 ms.
bool cacheable(const Response& response) {
  return response.ok && response.joined.empty() && response.op != Collective::Join &&
         !is_set_change(response.op) && !automatic_number(response.name).has_value();
}

// Note [Requests' blocks kept]
// Every request the coordinator files by name is moved into a block of its own (shared: a cached
// entry keeps the members' requests), and freed as its op is answered, or as its entry leaves the
// cache: on a step of 10,000 uncached ops with 2 ranks, 20,000 blocks of about 200 bytes made and
// freed by the threads that run rank 0's cycle, thousands of them alive at once. With Note [Pending
// ops by name], glibc's malloc and free still took 149 of the coordinator's 453 samples (rank 0
// under perf, P3's driver with the cache off, the AMD EPYC VM of family 26: see there), nearly all
// for these blocks. A RecyclingAllocator (Note [Blocks kept per thread] in
// src/base/recycling_allocator.h) keeping up to 16,384 of them reuses them from the second step
// on: 8 samples of 399. Its default of 256 kept too few for batches of thousands. The thread
// that frees a block keeps it, one that runs rank 0's cycle (the communication thread, or an
// application thread that drives it while it waits: Note [A waiting thread runs the cycle] in
// loop_driver.h), up to as many as it once made and had out at once: 3 MB at most per such
// thread.
using RequestBlocks = base::RecyclingAllocator<Request, 16384>;

Response error_response(const Response& about, ErrorCode code, std::string message) {
  Response response;
  response.process_set_id = about.process_set_id;
  response.name = about.name;
  response.op = about.op;
  response.ok = false;
  response.error_code = code;
  response.error_message = std::move(message);
  return response;
}

}  // namespace

Coordinator::SetState* Coordinator::state(int id) {
  if (last_state_ != nullptr && last_state_->info.id == id) return last_state_;
  if (auto it = states_.find(id); it != states_.end()) return last_state_ = &it->second;
  Result<SetInfo> info = sets_.find(id);
  if (!info.ok()) return nullptr;
  SetState& set = states_[id];
  set.info = info.value();
  set.joined.assign(static_cast<std::size_t>(set.info.size()), false);
  return last_state_ = &set;
}

void Coordinator::receive(int global_rank, RequestList list, Clock::time_point now,
                          std::vector<std::int32_t>* resend) {
  const std::vector<std::int32_t>& ids = list.cache_hits;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i + 1;
    while (j < ids.size() && static_cast<std::int64_t>(ids[j]) == ids[j - 1] + std::int64_t{1}) ++j;
    receive_hits(global_rank, ids[i], static_cast<std::int32_t>(j - i), now, resend);
    i = j;
  }
  for (Request& request : list.requests) {
    // Other members' counted hits on this op join this request by name (Note [Hit fast path]).
    if (!hits_.empty()) {
      if (std::optional<std::int32_t> id = cache_.id_of({request.process_set_id, request.name}))
        hit_to_named(*id, *cache_.peek(*id));
    }
    file(global_rank, std::allocate_shared<const Request>(RequestBlocks(), std::move(request)), -1,
         now);
  }
}

void Coordinator::receive_hits(int global_rank, std::int32_t first, std::int32_t count,
                               Clock::time_point now, std::vector<std::int32_t>* resend) {
  const std::int32_t end = first + count;
  for (std::int32_t at = first; at < end;) {
    HitTable::Run* run = hits_.find_from(at);
    if (run == nullptr || run->first > at) {
      const std::int32_t gap_end = run == nullptr ? end : std::min(end, run->first);
      start_hits(global_rank, at, gap_end, now, resend);
      at = gap_end;
      continue;
    }
    // Counted already: the ids are still cached (an eviction takes its id out of its run), and
    // counting is still right (Note [Hit fast path]). Count exactly [at, end) of the run.
    if (run->first < at) run = &hits_.split(*run, at);
    if (run->end() > end) hits_.split(*run, end);
    SetState* set = state(run->process_set_id);
    TUTTI_CHECK(set != nullptr, "counted hits of unknown set ", run->process_set_id);
    count_hit(*run, *set, member_rank(*set, global_rank, at), now);
    at = run->end();
  }
}

void Coordinator::start_hits(int global_rank, std::int32_t first, std::int32_t end,
                             Clock::time_point now, std::vector<std::int32_t>* resend) {
  // The countable ids since `from`, all of `from_set`, become one run when the stretch ends.
  std::int32_t from = first;
  SetState* from_set = nullptr;
  int from_rank = -1;
  const auto close = [&](std::int32_t at) {
    if (from_set != nullptr && at > from) {
      count_hit(hits_.start(from, at - from, from_set->info.id, from_set->info.size(), now),
                *from_set, from_rank, now);
    }
    from_set = nullptr;
  };
  for (std::int32_t id = first; id < end; ++id) {
    // Another member's run of this one id (find_from() does not bound the gap by those).
    if (hits_.find_single(id) != nullptr) {
      close(id);
      HitTable::Run* single = hits_.find_single(id);  // Again: close() may have moved it.
      SetState* set = state(single->process_set_id);
      TUTTI_CHECK(set != nullptr, "counted hits of unknown set ", single->process_set_id);
      count_hit(*single, *set, member_rank(*set, global_rank, id), now);
      continue;
    }
    const std::optional<int> set_id = cache_.use_set(id);
    if (!set_id) {
      close(id);
      resend->push_back(id);
      continue;
    }
    // The stretch's set, and this rank's place in it, once per stretch.
    if (from_set != nullptr && *set_id == from_set->info.id && can_count(*from_set, id)) continue;
    SetState* set = state(*set_id);
    TUTTI_CHECK(set != nullptr, "cache entry of unknown set ", *set_id);
    const int set_rank = member_rank(*set, global_rank, id);
    if (!can_count(*set, id)) {
      close(id);
      file(global_rank, cache_.get(id)->requests[static_cast<std::size_t>(set_rank)], id, now);
      continue;
    }
    if (set != from_set) {
      close(id);
      from = id;
      from_set = set;
      from_rank = set_rank;
    }
  }
  close(end);
}

int Coordinator::member_rank(const SetState& set, int global_rank, std::int32_t id) {
  const int set_rank = set.info.set_rank_of(global_rank);
  TUTTI_CHECK(set_rank >= 0, "rank ", global_rank, " sent cache hit ", id, " of process set ",
              set.info.id, " which does not include it");
  return set_rank;
}

bool Coordinator::can_count(const SetState& set, std::int32_t id) const {
  // The timeline's negotiation spans need each rank's arrival by name.
  if (timeline_ != nullptr && timeline_->enabled()) return false;
  if (set.joined_count > 0) return false;
  if (set.named == 0) return true;
  const CoordinatorCache::Entry* op = cache_.get(id);
  if (op == nullptr) return false;
  const OpKeyView key{op->process_set_id, op->name};
  return pending_.find(key, name_hash(key)) == nullptr;
}

void Coordinator::count_hit(HitTable::Run& run, SetState& set, int set_rank,
                            Clock::time_point now) {
  set.last_submission = now;  // A hit is never a join: joins are not cached.
  if (hits_.add(run, set_rank)) {
    run.queued = true;
    ready_.push_back(
        Ready{.process_set_id = set.info.id, .op = nullptr, .hit = run.first, .hits = run.count});
  }
}

void Coordinator::hit_to_named(std::int32_t id, const CoordinatorCache::Entry& op) {
  const HitTable::Run* found = hits_.find(id);
  // Every member sent it: take_ready() decides it (replayed, or negotiated from the requests).
  if (found == nullptr || found->queued) return;
  const HitTable::Run hit = hits_.take_id(id);
  const int set_id = hit.process_set_id;
  auto set_it = states_.find(set_id);
  if (set_it == states_.end()) return;  // The set was removed; its ranks fail the op.
  SetState& set = set_it->second;
  TUTTI_CHECK(set.info.size() == hit.size, "process set ", set_id, " changed size");
  const OpKeyView key{set_id, op.name};
  bool made = false;
  PendingOp& pending = pending_.file(key, name_hash(key), hit.size, hit.first_seen, &made);
  if (made) ++set.named;
  for (int r = 0; r < hit.size; ++r) {
    if (!hit.has(r)) continue;
    std::shared_ptr<const Request>& slot = pending.requests[static_cast<std::size_t>(r)];
    TUTTI_CHECK(slot == nullptr, "set rank ", r, " submitted '", op.name, "' twice");
    slot = op.requests[static_cast<std::size_t>(r)];
    pending.common_hit = (pending.common_hit == -2 || pending.common_hit == id) ? id : -1;
    ++pending.count;
  }
  if (!pending.queued && is_ready(set, pending)) {
    pending.queued = true;
    ready_.push_back(
        Ready{.process_set_id = set_id, .op = &pending, .hash = pending.hash, .hit = -1});
  }
}

void Coordinator::evicted_hit(std::int32_t id, std::shared_ptr<const CoordinatorCache::Entry> op) {
  const HitTable::Run* found = hits_.find(id);
  if (found == nullptr) return;
  if (found->queued) {
    orphans_[id] = std::move(op);
    return;
  }
  hit_to_named(id, *op);
}

bool Coordinator::is_ready(const SetState& set, const PendingOp& pending) {
  for (std::size_t i = 0; i < pending.requests.size(); ++i) {
    if (pending.requests[i] == nullptr && !set.joined[i]) return false;
  }
  return true;
}

void Coordinator::file(int global_rank, std::shared_ptr<const Request> request, std::int32_t hit,
                       Clock::time_point now) {
  const int set_id = request->process_set_id;
  SetState* set = state(set_id);
  if (set == nullptr) return;  // Removed meanwhile; the rank failed the op locally.
  const int set_rank = set->info.set_rank_of(global_rank);
  if (set_rank < 0) return;  // Refused by the rank's own argument checks.
  const bool is_join = request->op == Collective::Join;
  // The request lives on in `pending`, and with it the name.
  const base::InlineString& name = request->name;
  if (!is_join) set->last_submission = now;
  const OpKeyView key{set_id, name};
  bool made = false;
  PendingOp& pending = pending_.file(key, name_hash(key), set->info.size(), now, &made);
  if (made) {
    ++set->named;
    if (timeline_ && timeline_->enabled()) timeline_->negotiate_start(name, to_string(request->op));
  }
  if (timeline_ && timeline_->enabled()) timeline_->negotiate_rank_ready(name, global_rank);
  std::shared_ptr<const Request>& slot = pending.requests[static_cast<std::size_t>(set_rank)];
  TUTTI_CHECK(slot == nullptr, "rank ", global_rank, " submitted '", name, "' twice");
  slot = std::move(request);  // `name` still views its string.
  pending.common_hit = (pending.common_hit == -2 || pending.common_hit == hit) ? hit : -1;
  ++pending.count;
  // A join first releases the ops that waited only for this rank, so they come before the
  // Join response in the order (they still see the rank as joined).
  if (is_join) join(set_id, *set, global_rank);
  if (!pending.queued && is_ready(*set, pending)) {
    pending.queued = true;
    ready_.push_back(
        Ready{.process_set_id = set_id, .op = &pending, .hash = pending.hash, .hit = -1});
  }
}

void Coordinator::join(int set_id, SetState& set, int global_rank) {
  // Readiness now depends on who has joined, which only the named bookkeeping knows.
  if (!hits_.empty()) {
    std::vector<std::int32_t> ids;
    hits_.for_each([&](const HitTable::Run& run) {
      if (run.queued || run.process_set_id != set_id) return;
      for (std::int32_t id = run.first; id < run.end(); ++id) ids.push_back(id);
    });
    // Every id of a run not yet ready is cached (an eviction takes its id out of its run).
    for (std::int32_t id : ids) hit_to_named(id, *cache_.peek(id));
  }
  const std::size_t set_rank = static_cast<std::size_t>(set.info.set_rank_of(global_rank));
  if (!set.joined[set_rank]) ++set.joined_count;
  set.joined[set_rank] = true;
  set.last_joined = global_rank;
  // Queue in submission order (then by name), so the order does not depend on hashing.
  std::vector<PendingOp*> released;
  pending_.for_each([&](PendingOp& pending) {
    if (pending.process_set_id != set_id || pending.name == kJoinName || pending.queued ||
        !is_ready(set, pending))
      return;
    released.push_back(&pending);
  });
  std::sort(released.begin(), released.end(), [](const PendingOp* a, const PendingOp* b) {
    return a->first_seen != b->first_seen ? a->first_seen < b->first_seen : a->name < b->name;
  });
  for (PendingOp* pending : released) {
    pending->queued = true;
    ready_.push_back(
        Ready{.process_set_id = set_id, .op = pending, .hash = pending->hash, .hit = -1});
  }
}

// Note [Admission prefetch]
// An op that misses the response cache is offered to it as it is answered (respond()). Once the
// cache is full that reads the admission's memory (Note [Admission memory] in cache_admission.h,
// 1 MB at the default capacity: larger than a core's cache) and the cache's index by name (as
// large, at large capacities): a cache miss each for each op. The loop below starts loading both
// for the op kAhead places on while it answers this one, from the hash the ready list keeps (its
// record is not read: it may be gone, if its set was removed earlier in the list). On P3's 10,000
// names at a fixed 1,024 entries (rank 0 under perf, the 2-core AMD EPYC VM) the buckets without
// the prefetch (compiled away: Note [Prefetches kept] in src/base/prefetch.h) still waited for
// one miss per op, 411-419 samples of 9K in `admits`; prefetched, 36-44 of 4K
// (examples/BENCHMARK_LOG.md, fiftieth round). A settled cache reads no memory (Note [Settled
// cache] in response_cache.h), and prefetches none.
ResponseList Coordinator::take_ready() {
  ResponseList list;
  // ready_ gets the buffer of the previous list back, so that a steady stream of ops does not
  // grow a new vector each cycle.
  taking_.swap(ready_);
  list.responses.reserve(taking_.size());
  list.cache_ids.reserve(taking_.size());
  list.hit.reserve(taking_.size());
  Decided decided;
  // Note [Admission prefetch].
  constexpr std::size_t kAhead = 8;
  const bool prefetch = cache_.enabled();
  for (std::size_t i = 0; i < taking_.size(); ++i) {
    if (prefetch && i + kAhead < taking_.size() && taking_[i + kAhead].hit < 0)
      cache_.prefetch_insert(taking_[i + kAhead].hash);
    Ready& item = taking_[i];
    if (item.hit >= 0) {
      take_hits(item, decided, list);
      continue;
    }
    auto set_it = states_.find(item.process_set_id);
    if (set_it == states_.end()) continue;  // Removed earlier in this list; ranks fail it locally.
    SetState& set = set_it->second;
    std::unique_ptr<PendingOp> taken = pending_.take(*item.op);
    --set.named;
    PendingOp& pending = *taken;
    if (timeline_ && timeline_->enabled()) timeline_->negotiate_end(pending.name);
    // A hit is replayed only if its id is still cached here; then every rank still has it too
    // (ranks apply a list's evictions after its inserts). Otherwise negotiate afresh. Never
    // while members have joined (see Note [Join]).
    if (pending.common_hit >= 0 && set.joined_count == 0 &&
        cache_.find(pending.common_hit) != nullptr) {
      // Every member sent the same cache id: replay the cached response.
      append_hits(list, pending.common_hit, 1);
      pending_.recycle(std::move(taken));
      continue;
    }
    respond(item.process_set_id, set, pending.name, pending, decided, list);
    pending_.recycle(std::move(taken));
  }
  taking_.clear();
  // Every ready run was taken, and with it what its evicted ids stood for.
  TUTTI_CHECK(orphans_.empty(), orphans_.size(), " evicted ids of ready runs were left behind");
  return list;
}

void Coordinator::take_hits(const Ready& item, Decided& decided, ResponseList& list) {
  const HitTable::Run* run = hits_.find(item.hit);
  TUTTI_CHECK(run != nullptr && run->first == item.hit && run->count == item.hits,
              "no ready run of cache ids at ", item.hit);
  const int set_id = run->process_set_id;
  const int members = run->members;
  const Clock::time_point first_seen = run->first_seen;
  const std::int32_t end = run->end();
  auto set_it = states_.find(set_id);
  // Every id of a ready run is still cached unless an eviction set it aside (evicted_hit()):
  // without such orphans and joined members, the whole run is replayed.
  if (set_it != states_.end() && set_it->second.joined_count == 0 && orphans_.empty()) {
    append_hits(list, item.hit, item.hits);
    hits_.take(item.hit);
    return;
  }
  // The run stays in the table while its ops are decided: an insert on the way may evict its
  // later ids, whose entries are then kept aside (evicted_hit()).
  for (std::int32_t id = item.hit; id < end && set_it != states_.end(); ++id) {
    SetState& set = set_it->second;
    // As for a named op whose members all sent the same id (take_ready()); receive() marked the
    // id as used.
    if (set.joined_count == 0 && cache_.contains(id)) {
      append_hits(list, id, 1);
      continue;
    }
    std::shared_ptr<const CoordinatorCache::Entry> op = cache_.peek(id);
    if (op == nullptr) {
      if (auto kept = orphans_.find(id); kept != orphans_.end()) op = kept->second;
    }
    TUTTI_CHECK(op != nullptr, "ready cache id ", id, " lost what it stood for");
    PendingOp pending{.process_set_id = set_id,
                      .name = {},  // respond() takes the name from `op`.
                      .hash = name_hash(OpKeyView{set_id, op->name}),  // For the cache's insert.
                      .requests = op->requests,
                      .count = members,
                      .common_hit = id,
                      .first_seen = first_seen,
                      .queued = true};
    respond(set_id, set, op->name, pending, decided, list);
  }
  // (A removed set's run is skipped: its ranks fail the ops locally.) Nothing is left to decide
  // for the run's ids set aside, including those evicted after they were decided (the op's own
  // old id among them).
  hits_.take(item.hit);
  if (!orphans_.empty()) {
    std::erase_if(orphans_,
                  [&](const auto& kept) { return kept.first >= item.hit && kept.first < end; });
  }
}

void Coordinator::append_hits(ResponseList& list, std::int32_t first, std::int32_t count) {
  if (!list.hit.empty() && list.hit.back() > 0 &&
      list.cache_ids.back() + list.hit.back() == first) {
    list.hit.back() += count;
    return;
  }
  list.responses.emplace_back();
  list.cache_ids.push_back(first);
  list.hit.push_back(count);
}

void Coordinator::respond(int set_id, SetState& set, const std::string& name, PendingOp& pending,
                          Decided& decided, ResponseList& list) {
  const std::size_t evicted_before = list.evicted.size();
  Response response = decide(set_id, set, name, pending, decided, &list.evicted);
  std::int32_t id = -1;
  if (cache_.enabled() && cacheable(response)) {
    // -1 if a full cache keeps the name out: the response goes uncached then (Note [Cache
    // admission] in cache_admission.h), and `pending` keeps its requests' slots for reuse.
    id = cache_.insert_made(
        {set_id, name}, pending.hash,
        [&] {
          return CoordinatorCache::Entry{.process_set_id = set_id,
                                         .name = name,
                                         .requests = std::move(pending.requests),
                                         .response = response};
        },
        &list.evicted);
    // Notes [Cache thrash] in cache_admission.h and [Cache growth] in response_cache.h.
    if (std::optional<CoordinatorCache::Growth> growth = cache_.take_growth()) {
      TUTTI_LOG_INFO("the response cache grew from ", growth->from, " to ", growth->to,
                     " entries: op names recur among about ", growth->distance,
                     " (TUTTI_CACHE_CAPACITY fixes its size)");
    }
    if (std::optional<CacheAdmission::Report> thrash = cache_.take_thrash_report())
      TUTTI_LOG_WARNING(describe(*thrash));
  }
  list.responses.push_back(std::move(response));
  list.cache_ids.push_back(id);
  list.hit.push_back(0);
  // Hits still being counted on an evicted id must be findable by name from now on: the
  // members that have not sent theirs will send full requests (Note [Hit fast path]).
  std::vector<std::shared_ptr<const CoordinatorCache::Entry>> gone = cache_.take_evicted();
  TUTTI_CHECK(gone.size() == list.evicted.size() - evicted_before,
              "the cache's evicted entries went astray");
  for (std::size_t i = 0; i < gone.size(); ++i)
    evicted_hit(list.evicted[evicted_before + i], std::move(gone[i]));
}

Response Coordinator::decide(int set_id, SetState& set, const std::string& name, PendingOp& pending,
                             Decided& decided, std::vector<std::int32_t>* evicted) {
  if (name == kJoinName && pending.requests.front() != nullptr &&
      pending.requests.front()->op == Collective::Join) {
    // Every member has joined (step 4).
    Response response;
    response.process_set_id = set_id;
    response.name = name;
    response.op = Collective::Join;
    response.last_joined_rank = set.last_joined;
    set.joined.assign(set.joined.size(), false);
    set.joined_count = 0;
    set.last_joined = -1;
    return response;
  }
  std::vector<int> joined;
  for (std::size_t i = 0; i < set.joined.size(); ++i) {
    if (set.joined[i]) joined.push_back(set.info.global_rank_of(static_cast<int>(i)));
  }
  Response response = negotiate_response(*set.info.ranks, pending.requests, joined);
  if (response.ok && is_set_change(response.op)) change_sets(response, decided, evicted);
  return response;
}

void Coordinator::change_sets(Response& response, Decided& decided,
                              std::vector<std::int32_t>* evicted) {
  if (response.op == Collective::AddProcessSet) {
    const std::vector<int>& ranks = response.set_ranks;  // Sorted.
    std::vector<std::pair<int, std::vector<int>>> existing;
    for (const SetInfo& info : sets_.all()) {
      if (!decided.removed.contains(info.id)) existing.emplace_back(info.id, *info.ranks);
    }
    for (const auto& [id, members] : decided.added) {
      if (!decided.removed.contains(id)) existing.emplace_back(id, members);
    }
    for (const auto& [id, members] : existing) {
      if (members == ranks) {
        response = error_response(response, ErrorCode::InvalidArgument,
                                  str_cat("ADD_PROCESS_SET of ranks [", detail::join_list(ranks),
                                          "]: process set ", id, " has the same ranks"));
        return;
      }
    }
    response.target_set_id = next_set_id_++;
    decided.added[response.target_set_id] = ranks;
    return;
  }
  const int id = response.target_set_id;
  const bool exists =
      !decided.removed.contains(id) && (sets_.find(id).ok() || decided.added.contains(id));
  if (id == 0 || !exists) {
    response = error_response(
        response, ErrorCode::InvalidArgument,
        str_cat("REMOVE_PROCESS_SET: process set ", id,
                id == 0 ? " is the global set, which cannot be removed" : " does not exist"));
    return;
  }
  // Later ready ops of the set are skipped by take_ready(); the ranks fail theirs with
  // ShutDown when they execute this response.
  decided.removed.insert(id);
  pending_.take_set(id);
  states_.erase(id);
  last_state_ = nullptr;
  cache_.erase_set(id, evicted);
}

bool Coordinator::empty() const {
  return ready_.empty() && hits_.empty() && orphans_.empty() && pending_.empty();
}

std::vector<Coordinator::Stall> Coordinator::stalls(Clock::time_point now,
                                                    Clock::duration after) const {
  std::vector<Stall> result;
  pending_.for_each([&](const PendingOp& pending) {
    const auto set_it = states_.find(pending.process_set_id);
    if (set_it == states_.end()) return;  // A removed set's ops are dropped with it.
    const SetState& set = set_it->second;
    // A joined rank may wait for the others for as long as they have data (they still submit
    // ops): a join stalls only once the set has seen no other op for `after`. Its missing
    // ranks are the members that have not joined.
    const Clock::time_point since = pending.name == kJoinName
                                        ? std::max(pending.first_seen, set.last_submission)
                                        : pending.first_seen;
    if (now - since < after) return;
    Stall stall{.process_set_id = pending.process_set_id,
                .name = pending.name,
                .missing = {},
                .waited = now - since};
    for (std::size_t i = 0; i < pending.requests.size(); ++i) {
      if (pending.requests[i] == nullptr && !set.joined[i])
        stall.missing.push_back(set.info.global_rank_of(static_cast<int>(i)));
    }
    result.push_back(std::move(stall));
  });
  // Counted hits (Note [Hit fast path]): no member of their set has joined, and every id of a
  // run not yet ready is cached.
  hits_.for_each([&](const HitTable::Run& run) {
    if (run.queued || now - run.first_seen < after) return;
    auto set_it = states_.find(run.process_set_id);
    if (set_it == states_.end()) return;
    const SetState& set = set_it->second;
    std::vector<int> missing;
    for (int r = 0; r < run.size; ++r) {
      if (!run.has(r) && !set.joined[static_cast<std::size_t>(r)])
        missing.push_back(set.info.global_rank_of(r));
    }
    for (std::int32_t id = run.first; id < run.end(); ++id) {
      const std::shared_ptr<const CoordinatorCache::Entry> op = cache_.peek(id);
      result.push_back(Stall{.process_set_id = run.process_set_id,
                             .name = op != nullptr ? op->name : str_cat("cache id ", id),
                             .missing = missing,
                             .waited = now - run.first_seen});
    }
  });
  std::sort(result.begin(), result.end(),
            [](const Stall& a, const Stall& b) { return a.waited > b.waited; });
  return result;
}

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// The coordinator's bookkeeping: filing requests, readiness (with joined ranks), responses,
// process-set changes. See Note [Negotiation] and Note [Join] in negotiation/coordinator.h.
#include "src/core/negotiation/coordinator.h"

#include <algorithm>

#include "src/base/strings.h"
#include "src/common/check.h"
#include "src/core/negotiation/validation.h"

namespace tutti::core {
namespace {

using detail::str_cat;

bool is_set_change(Collective op) {
  return op == Collective::AddProcessSet || op == Collective::RemoveProcessSet;
}

// Join responses, set changes and responses shaped by a join are one-offs: replaying them
// from the cache would bypass the coordinator's state.
bool cacheable(const Response& response) {
  return response.ok && response.joined.empty() && response.op != Collective::Join &&
         !is_set_change(response.op);
}

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
  for (std::int32_t id : list.cache_hits) {
    // Counted already: the id is still cached (an eviction moves its counted hits to the
    // named bookkeeping), and counting is still right (Note [Hit fast path]).
    if (HitTable::Pending* hit = hits_.find(id); hit != nullptr) {
      SetState* set = state(hit->op->process_set_id);
      TUTTI_CHECK(set != nullptr, "counted hits of unknown set ", hit->op->process_set_id);
      count_hit(*hit, *set, member_rank(*set, global_rank, id), now);
      continue;
    }
    std::shared_ptr<const CoordinatorCache::Entry> entry = cache_.use(id);
    if (entry == nullptr) {
      resend->push_back(id);
      continue;
    }
    SetState* set = state(entry->process_set_id);
    TUTTI_CHECK(set != nullptr, "cache entry of unknown set ", entry->process_set_id);
    const int set_rank = member_rank(*set, global_rank, id);
    if (can_count(*set, *entry)) {
      count_hit(hits_.start(id, std::move(entry), set->info.size(), now), *set, set_rank, now);
    } else {
      file(global_rank, entry->requests[static_cast<std::size_t>(set_rank)], id, now);
    }
  }
  for (Request& request : list.requests) {
    // Other members' counted hits on this op join this request by name (Note [Hit fast path]).
    if (!hits_.empty()) {
      if (std::optional<std::int32_t> id = cache_.id_of({request.process_set_id, request.name}))
        hit_to_named(*id);
    }
    file(global_rank, std::make_shared<const Request>(std::move(request)), -1, now);
  }
}

int Coordinator::member_rank(const SetState& set, int global_rank, std::int32_t id) {
  const int set_rank = set.info.set_rank_of(global_rank);
  TUTTI_CHECK(set_rank >= 0, "rank ", global_rank, " sent cache hit ", id, " of process set ",
              set.info.id, " which does not include it");
  return set_rank;
}

bool Coordinator::can_count(const SetState& set, const CoordinatorCache::Entry& op) const {
  // The timeline's negotiation spans need each rank's arrival by name.
  if (timeline_ != nullptr && timeline_->enabled()) return false;
  if (set.joined_count > 0) return false;
  return set.pending.empty() || !set.pending.contains(op.name);
}

void Coordinator::count_hit(HitTable::Pending& hit, SetState& set, int set_rank,
                            Clock::time_point now) {
  set.last_submission = now;  // A hit is never a join: joins are not cached.
  if (hits_.add(hit, set_rank)) {
    hit.queued = true;
    ready_.push_back(Ready{.process_set_id = set.info.id, .name = {}, .hit = hit.id});
  }
}

void Coordinator::hit_to_named(std::int32_t id) {
  const HitTable::Pending* found = hits_.find(id);
  // Every member sent it: take_ready() decides it (replayed, or negotiated from the requests).
  if (found == nullptr || found->queued) return;
  const HitTable::Pending hit = hits_.take(id);
  const int set_id = hit.op->process_set_id;
  auto set_it = states_.find(set_id);
  if (set_it == states_.end()) return;  // The set was removed; its ranks fail the op.
  SetState& set = set_it->second;
  TUTTI_CHECK(set.info.size() == hit.size, "process set ", set_id, " changed size");
  Pending& pending = set.pending[hit.op->name];
  if (pending.requests.empty()) {
    pending.requests.assign(static_cast<std::size_t>(hit.size), nullptr);
    pending.first_seen = hit.first_seen;
  }
  for (int r = 0; r < hit.size; ++r) {
    if (!hit.has(r)) continue;
    std::shared_ptr<const Request>& slot = pending.requests[static_cast<std::size_t>(r)];
    TUTTI_CHECK(slot == nullptr, "set rank ", r, " submitted '", hit.op->name, "' twice");
    slot = hit.op->requests[static_cast<std::size_t>(r)];
    pending.common_hit = (pending.common_hit == -2 || pending.common_hit == id) ? id : -1;
    ++pending.count;
  }
  if (!pending.queued && is_ready(set, pending)) {
    pending.queued = true;
    ready_.push_back(Ready{.process_set_id = set_id, .name = hit.op->name, .hit = -1});
  }
}

bool Coordinator::is_ready(const SetState& set, const Pending& pending) {
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
  const std::string name = request->name;
  if (!is_join) set->last_submission = now;
  Pending& pending = set->pending[name];
  if (pending.requests.empty()) {
    pending.requests.assign(static_cast<std::size_t>(set->info.size()), nullptr);
    pending.first_seen = now;
    if (timeline_ && timeline_->enabled()) timeline_->negotiate_start(name, to_string(request->op));
  }
  if (timeline_ && timeline_->enabled()) timeline_->negotiate_rank_ready(name, global_rank);
  std::shared_ptr<const Request>& slot = pending.requests[static_cast<std::size_t>(set_rank)];
  TUTTI_CHECK(slot == nullptr, "rank ", global_rank, " submitted '", name, "' twice");
  slot = std::move(request);
  pending.common_hit = (pending.common_hit == -2 || pending.common_hit == hit) ? hit : -1;
  ++pending.count;
  // A join first releases the ops that waited only for this rank, so they come before the
  // Join response in the order (they still see the rank as joined).
  if (is_join) join(set_id, *set, global_rank);
  if (!pending.queued && is_ready(*set, pending)) {
    pending.queued = true;
    ready_.push_back(Ready{.process_set_id = set_id, .name = name, .hit = -1});
  }
}

void Coordinator::join(int set_id, SetState& set, int global_rank) {
  // Readiness now depends on who has joined, which only the named bookkeeping knows.
  if (!hits_.empty()) {
    for (std::int32_t id : hits_.ids()) {
      if (hits_.find(id)->op->process_set_id == set_id) hit_to_named(id);
    }
  }
  const std::size_t set_rank = static_cast<std::size_t>(set.info.set_rank_of(global_rank));
  if (!set.joined[set_rank]) ++set.joined_count;
  set.joined[set_rank] = true;
  set.last_joined = global_rank;
  // Queue in submission order (then by name), so the order does not depend on hashing.
  std::vector<std::pair<Clock::time_point, const std::string*>> released;
  for (auto& [name, pending] : set.pending) {
    if (name == kJoinName || pending.queued || !is_ready(set, pending)) continue;
    released.emplace_back(pending.first_seen, &name);
  }
  std::sort(released.begin(), released.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : *a.second < *b.second;
  });
  for (const auto& [when, name] : released) {
    set.pending.at(*name).queued = true;
    ready_.push_back(Ready{.process_set_id = set_id, .name = *name, .hit = -1});
  }
}

ResponseList Coordinator::take_ready() {
  ResponseList list;
  list.evicted = std::move(evicted_);
  evicted_.clear();
  // ready_ gets the buffer of the previous list back, so that a steady stream of ops does not
  // grow a new vector each cycle.
  taking_.swap(ready_);
  list.responses.reserve(taking_.size());
  list.cache_ids.reserve(taking_.size());
  list.hit.reserve(taking_.size());
  Decided decided;
  for (Ready& item : taking_) {
    if (item.hit >= 0) {
      take_hit(item.hit, decided, list);
      continue;
    }
    auto set_it = states_.find(item.process_set_id);
    if (set_it == states_.end()) continue;  // Removed earlier in this list; ranks fail it locally.
    SetState& set = set_it->second;
    auto node = set.pending.extract(item.name);
    Pending& pending = node.mapped();
    if (timeline_ && timeline_->enabled()) timeline_->negotiate_end(item.name);
    // A hit is replayed only if its id is still cached here; then every rank still has it too
    // (ranks apply a list's evictions after its inserts). Otherwise negotiate afresh. Never
    // while members have joined (see Note [Join]).
    if (pending.common_hit >= 0 && set.joined_count == 0 &&
        cache_.find(pending.common_hit) != nullptr) {
      // Every member sent the same cache id: replay the cached response.
      list.responses.emplace_back();
      list.cache_ids.push_back(pending.common_hit);
      list.hit.push_back(1);
      continue;
    }
    respond(item.process_set_id, set, item.name, pending, decided, list);
  }
  taking_.clear();
  return list;
}

void Coordinator::take_hit(std::int32_t id, Decided& decided, ResponseList& list) {
  const HitTable::Pending* hit = hits_.find(id);
  TUTTI_CHECK(hit != nullptr, "cache id ", id, " is not pending");
  const int count = hit->count;
  const Clock::time_point first_seen = hit->first_seen;
  const std::shared_ptr<const CoordinatorCache::Entry> op = hits_.take_op(id);
  auto set_it = states_.find(op->process_set_id);
  if (set_it == states_.end()) return;  // Removed earlier in this list; ranks fail it locally.
  SetState& set = set_it->second;
  // As for a named op whose members all sent the same id (take_ready()); receive() marked the
  // id as used.
  if (set.joined_count == 0 && cache_.contains(id)) {
    list.responses.emplace_back();
    list.cache_ids.push_back(id);
    list.hit.push_back(1);
    return;
  }
  Pending pending{.requests = op->requests,
                  .count = count,
                  .common_hit = id,
                  .first_seen = first_seen,
                  .queued = true};
  respond(op->process_set_id, set, op->name, pending, decided, list);
}

void Coordinator::respond(int set_id, SetState& set, const std::string& name, Pending& pending,
                          Decided& decided, ResponseList& list) {
  const std::size_t evicted_before = list.evicted.size();
  Response response = decide(set_id, set, name, pending, decided, &list.evicted);
  std::int32_t id = -1;
  if (cacheable(response) && cache_.enabled()) {
    id = cache_.insert({.process_set_id = set_id,
                        .name = name,
                        .requests = std::move(pending.requests),
                        .response = response},
                       &list.evicted);
  }
  list.responses.push_back(std::move(response));
  list.cache_ids.push_back(id);
  list.hit.push_back(0);
  // Hits still being counted on an evicted id must be findable by name from now on: the
  // members that have not sent theirs will send full requests (Note [Hit fast path]).
  for (std::size_t i = evicted_before; i < list.evicted.size(); ++i) hit_to_named(list.evicted[i]);
}

Response Coordinator::decide(int set_id, SetState& set, const std::string& name, Pending& pending,
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
  states_.erase(id);
  last_state_ = nullptr;
  cache_.erase_set(id, evicted);
}

std::vector<Coordinator::Stall> Coordinator::stalls(Clock::time_point now,
                                                    Clock::duration after) const {
  std::vector<Stall> result;
  for (const auto& [set_id, set] : states_) {
    for (const auto& [name, pending] : set.pending) {
      // A joined rank may wait for the others for as long as they have data (they still
      // submit ops): a join stalls only once the set has seen no other op for `after`. Its
      // missing ranks are the members that have not joined.
      const Clock::time_point since = name == kJoinName
                                          ? std::max(pending.first_seen, set.last_submission)
                                          : pending.first_seen;
      if (now - since < after) continue;
      Stall stall{.process_set_id = set_id, .name = name, .missing = {}, .waited = now - since};
      for (std::size_t i = 0; i < pending.requests.size(); ++i) {
        if (pending.requests[i] == nullptr && !set.joined[i])
          stall.missing.push_back(set.info.global_rank_of(static_cast<int>(i)));
      }
      result.push_back(std::move(stall));
    }
  }
  // Counted hits (Note [Hit fast path]): no member of their set has joined.
  hits_.for_each([&](const HitTable::Pending& hit) {
    if (hit.queued || now - hit.first_seen < after) return;
    auto set_it = states_.find(hit.op->process_set_id);
    if (set_it == states_.end()) return;
    const SetState& set = set_it->second;
    Stall stall{.process_set_id = hit.op->process_set_id,
                .name = hit.op->name,
                .missing = {},
                .waited = now - hit.first_seen};
    for (int r = 0; r < hit.size; ++r) {
      if (!hit.has(r) && !set.joined[static_cast<std::size_t>(r)])
        stall.missing.push_back(set.info.global_rank_of(r));
    }
    result.push_back(std::move(stall));
  });
  std::sort(result.begin(), result.end(),
            [](const Stall& a, const Stall& b) { return a.waited > b.waited; });
  return result;
}

}  // namespace tutti::core

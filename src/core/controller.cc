// SPDX-License-Identifier: Apache-2.0
#include "src/core/controller.h"

#include <algorithm>

#include "src/common/check.h"
#include "src/core/validation.h"

namespace tutti::core {

void Coordinator::add_set(int id, std::vector<int> global_ranks) {
  SetState state;
  for (std::size_t i = 0; i < global_ranks.size(); ++i) state.set_rank[global_ranks[i]] = static_cast<int>(i);
  state.ranks = std::move(global_ranks);
  sets_[id] = std::move(state);
}

void Coordinator::remove_set(int id) {
  sets_.erase(id);
  std::erase_if(ready_, [id](const auto& item) { return item.first == id; });
  cache_.erase_set(id, &evicted_);
}

void Coordinator::receive(int global_rank, RequestList list, Clock::time_point now,
                          std::vector<std::int32_t>* resend) {
  shutdown_requested_ = shutdown_requested_ || list.shutdown;
  for (std::int32_t id : list.cache_hits) {
    const CoordinatorCache::Entry* entry = cache_.find(id);
    if (entry == nullptr) {
      resend->push_back(id);
      continue;
    }
    auto set = sets_.find(entry->process_set_id);
    TUTTI_CHECK(set != sets_.end(), "cache entry of unknown set ", entry->process_set_id);
    const int set_rank = set->second.set_rank.at(global_rank);
    file(global_rank, entry->requests[set_rank], id, now);
  }
  for (Request& request : list.requests) {
    file(global_rank, std::make_shared<const Request>(std::move(request)), -1, now);
  }
}

void Coordinator::file(int global_rank, std::shared_ptr<const Request> request, std::int32_t hit,
                       Clock::time_point now) {
  auto set_it = sets_.find(request->process_set_id);
  if (set_it == sets_.end()) return;  // Removed meanwhile; the rank failed the op locally.
  SetState& set = set_it->second;
  auto member = set.set_rank.find(global_rank);
  if (member == set.set_rank.end()) return;  // Refused by the rank's own argument checks.
  Pending& pending = set.pending[request->name];
  if (pending.count == 0) {
    pending.requests.assign(set.ranks.size(), nullptr);
    pending.first_seen = now;
  }
  std::shared_ptr<const Request>& slot = pending.requests[member->second];
  TUTTI_CHECK(slot == nullptr, "rank ", global_rank, " submitted '", request->name, "' twice");
  const std::string& name = request->name;
  slot = std::move(request);
  pending.common_hit = (pending.common_hit == -2 || pending.common_hit == hit) ? hit : -1;
  if (++pending.count == static_cast<int>(set.ranks.size())) ready_.emplace_back(set_it->first, name);
}

ResponseList Coordinator::take_ready() {
  ResponseList list;
  list.evicted = std::move(evicted_);
  evicted_.clear();
  for (auto& [set_id, name] : ready_) {
    SetState& set = sets_.at(set_id);
    auto node = set.pending.extract(name);
    Pending& pending = node.mapped();
    // A hit is replayed only if its id is still cached here; then every rank still has it too
    // (ranks apply a list's evictions after its inserts). Otherwise negotiate afresh.
    if (pending.common_hit >= 0 && cache_.find(pending.common_hit) != nullptr) {
      // Every member sent the same cache id: replay the cached response.
      list.responses.emplace_back();
      list.cache_ids.push_back(pending.common_hit);
      list.hit.push_back(1);
      continue;
    }
    Response response = negotiate_response(set.ranks, pending.requests);
    std::int32_t id = -1;
    if (response.ok && cache_.enabled()) {
      id = cache_.insert({.process_set_id = set_id, .name = name, .requests = std::move(pending.requests),
                          .response = response},
                         &list.evicted);
    }
    list.responses.push_back(std::move(response));
    list.cache_ids.push_back(id);
    list.hit.push_back(0);
  }
  ready_.clear();
  return list;
}

std::vector<Coordinator::Stall> Coordinator::stalls(Clock::time_point now, Clock::duration after) const {
  std::vector<Stall> result;
  for (const auto& [set_id, set] : sets_) {
    for (const auto& [name, pending] : set.pending) {
      if (now - pending.first_seen < after) continue;
      Stall stall{.process_set_id = set_id, .name = name, .missing = {}, .waited = now - pending.first_seen};
      for (std::size_t i = 0; i < set.ranks.size(); ++i) {
        if (pending.requests[i] == nullptr) stall.missing.push_back(set.ranks[i]);
      }
      result.push_back(std::move(stall));
    }
  }
  std::sort(result.begin(), result.end(),
            [](const Stall& a, const Stall& b) { return a.waited > b.waited; });
  return result;
}

}  // namespace tutti::core

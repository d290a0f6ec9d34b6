// SPDX-License-Identifier: Apache-2.0
#include "src/core/response_cache.h"

#include <algorithm>
#include <utility>

#include "src/base/prefetch.h"
#include "src/base/strings.h"
#include "src/common/check.h"

namespace tutti::core {

std::int64_t cache_growth_limit(std::int64_t capacity, bool capacity_set, int world_size) {
  if (capacity_set || capacity <= 0) return capacity;
  const std::int64_t fits = kGrownRequests / std::max(world_size, 1);
  return std::clamp(fits, capacity, std::max(capacity, kMaxGrownCapacity));
}

std::string cache_key(int process_set_id, const std::string& name) {
  std::string key = std::to_string(process_set_id);
  key += ':';
  key += name;
  return key;
}

CoordinatorCache::Slot* CoordinatorCache::touch(std::int32_t id) {
  Slot* slot = entries_.find(id);
  if (slot == nullptr) return nullptr;
  slot->used = ++clock_;  // Note [Least recently used by stamps].
  return slot;
}

const CoordinatorCache::Entry* CoordinatorCache::find(std::int32_t id) {
  const Slot* slot = touch(id);
  return slot == nullptr ? nullptr : slot->entry.get();
}

std::optional<int> CoordinatorCache::use_set(std::int32_t id) {
  const Slot* slot = touch(id);
  if (slot == nullptr) return std::nullopt;
  return slot->process_set_id;
}

const CoordinatorCache::Entry* CoordinatorCache::get(std::int32_t id) const {
  const Slot* slot = entries_.find(id);
  return slot == nullptr ? nullptr : slot->entry.get();
}

std::shared_ptr<const CoordinatorCache::Entry> CoordinatorCache::use(std::int32_t id) {
  const Slot* slot = touch(id);
  return slot == nullptr ? nullptr : slot->entry;
}

std::shared_ptr<const CoordinatorCache::Entry> CoordinatorCache::peek(std::int32_t id) const {
  const Slot* slot = entries_.find(id);
  return slot == nullptr ? nullptr : slot->entry;
}

std::vector<std::shared_ptr<const CoordinatorCache::Entry>> CoordinatorCache::take_evicted() {
  return std::exchange(evicted_, {});
}

std::optional<std::int32_t> CoordinatorCache::id_of(OpKeyView key) const {
  const Keyed* keyed = by_key_.find(key, name_hash(key));
  if (keyed == nullptr) return std::nullopt;
  return keyed->id;
}

std::optional<std::uint64_t> CoordinatorCache::admit(OpKeyView key, std::uint64_t hash,
                                                     std::vector<std::int32_t>* evicted) {
  if (const Keyed* old = by_key_.find(key, hash)) erase(old->id, evicted);
  const bool full = static_cast<std::int64_t>(entries_.size()) >= capacity_;
  const std::uint64_t used = ++clock_;
  const std::optional<std::uint64_t> lru_used = full ? oldest_use() : std::nullopt;
  if (settled_ && lru_used) {  // Note [Settled cache].
    if (fresh(*lru_used, used)) return std::nullopt;
    settled_ = false;
    kept_out_ = 0;
  }
  const bool admitted = admission_.admits(hash, lru_used, used);
  if (std::optional<CacheAdmission::Report> report = admission_.take_report()) settle(*report);
  if (!admitted) {
    // Settles again once the names have (Note [Settled cache]); kept out means the cache is full.
    if (stale_after_ > 0 && ++kept_out_ >= capacity_ && fresh(*lru_used, used)) settled_ = true;
    return std::nullopt;
  }
  if (static_cast<std::int64_t>(entries_.size()) >= capacity_) {  // Still full, if it grew.
    // Every live id has a record: a heap without one is a bug.
    const bool evicted_one = evict_least_recent(evicted);
    TUTTI_CHECK(evicted_one, "the response cache's order of use lost an entry");
  }
  return used;
}

std::int32_t CoordinatorCache::store(std::uint64_t hash, std::uint64_t used, Entry entry) {
  const std::int32_t id = next_id_++;
  const int set_id = entry.process_set_id;
  auto stored = std::make_shared<const Entry>(std::move(entry));
  const Entry* keyed = stored.get();
  entries_[id] = Slot{.entry = std::move(stored), .used = used, .process_set_id = set_id};
  push_age(id, used);
  by_key_.insert(hash, Keyed{.id = id, .entry = keyed});  // Its old id, if any, is erased.
  return id;
}

void CoordinatorCache::settle(const CacheAdmission::Report& report) {
  if (capacity_ >= growth_limit_) {
    thrash_ = report;
    thrash_->grown = grows_;
    stale_after_ = 2 * static_cast<std::uint64_t>(report.distance);
    settled_ = true;
    return;
  }
  const std::int64_t to =
      std::min(growth_limit_, std::max(2 * capacity_, report.distance + report.distance / 4));
  growth_ = Growth{.from = capacity_, .to = to, .distance = report.distance};
  capacity_ = to;
  admission_ = CacheAdmission(to);
}

std::optional<std::uint64_t> CoordinatorCache::oldest_use() {
  // See Note [Least recently used by stamps]. Ends: each record is current, stale (pushed back
  // with a larger stamp, at most once per use) or dead (dropped), and a live entry's is current
  // once pushed back.
  while (!by_age_.empty()) {
    const Age oldest = by_age_.front();
    const Slot* slot = entries_.find(oldest.id);
    if (slot != nullptr && slot->used == oldest.stamp) return oldest.stamp;
    std::pop_heap(by_age_.begin(), by_age_.end());
    by_age_.pop_back();
    if (slot != nullptr) push_age(oldest.id, slot->used);  // Used since; else erased since.
  }
  return std::nullopt;
}

bool CoordinatorCache::evict_least_recent(std::vector<std::int32_t>* evicted) {
  if (!oldest_use()) return false;
  std::pop_heap(by_age_.begin(), by_age_.end());
  const Age oldest = by_age_.back();
  by_age_.pop_back();
  const Entry& entry = *entries_.find(oldest.id)->entry;
  admission_.evicted_for_room(name_hash(OpKeyView{entry.process_set_id, entry.name}), oldest.stamp);
  erase(oldest.id, evicted);
  return true;
}

void CoordinatorCache::push_age(std::int32_t id, std::uint64_t used) {
  by_age_.push_back(Age{.stamp = used, .id = id});
  std::push_heap(by_age_.begin(), by_age_.end());
}

void CoordinatorCache::erase_set(int process_set_id, std::vector<std::int32_t>* evicted) {
  std::vector<std::int32_t> ids;
  entries_.for_each([&](std::int32_t id, const Slot& slot) {
    if (slot.entry->process_set_id == process_set_id) ids.push_back(id);
  });
  for (std::int32_t id : ids) erase(id, evicted);
}

void CoordinatorCache::erase(std::int32_t id, std::vector<std::int32_t>* evicted) {
  Slot* slot = entries_.find(id);
  if (slot == nullptr) return;
  const OpKeyView key{slot->entry->process_set_id, slot->entry->name};
  const std::uint64_t hash = name_hash(key);
  if (const Keyed* keyed = by_key_.find(key, hash); keyed != nullptr && keyed->id == id)
    by_key_.take(key, hash);
  evicted_.push_back(std::move(slot->entry));
  entries_.erase(id);
  evicted->push_back(id);
  // Its record in by_age_ stays until it reaches the top, or until the heap is rebuilt from the
  // live ids (kAgeSlack; Note [Least recently used by stamps]).
  if (by_age_.size() > 2 * entries_.size() + kAgeSlack) {
    by_age_.clear();
    entries_.for_each([&](std::int32_t live, const Slot& kept) {
      by_age_.push_back(Age{.stamp = kept.used, .id = live});
    });
    std::make_heap(by_age_.begin(), by_age_.end());
  }
}

std::optional<std::int32_t> RankCache::lookup(const Request& request,
                                              std::uint64_t name_hash) const {
  const Newest* newest = by_key_.find(OpKeyView{request.process_set_id, request.name}, name_hash);
  // The index matched (set, name).
  if (newest == nullptr || !equal_but_key(newest->slot->request, request)) return std::nullopt;
  return newest->id;
}

void RankCache::prefetch_request(std::uint64_t name_hash) const {
  if (const Newest* newest = by_key_.peek(name_hash))
    base::prefetch_lines(&newest->slot->request, sizeof(Request));
}

bool RankCache::matches(std::int32_t id, const Request& request, std::uint64_t name_hash) const {
  const std::unique_ptr<Slot>* found = entries_.find(id);
  if (found == nullptr) return false;
  const Slot& slot = **found;
  // A (set, name) has one id at a time: the coordinator evicts an old id of the name in the list
  // that inserts the new one, and a list's inserts and evictions are applied together.
  return slot.name_hash == name_hash && slot.request.process_set_id == request.process_set_id &&
         slot.request.name == request.name && equal_but_key(slot.request, request);
}

void RankCache::prefetch_id(std::int32_t id) const {
  if (const std::unique_ptr<Slot>* found = entries_.find(id)) {
    base::prefetch_lines(found->get(), &(*found)->facts + 1);
    base::prefetch_lines(&(*found)->request, sizeof(Request));
  }
}

std::optional<std::int32_t> RankCache::lookup(const Request& request) const {
  return lookup(request, name_hash(OpKeyView{request.process_set_id, request.name}));
}

const Response* RankCache::response(std::int32_t id, std::uint64_t* name_hash,
                                    ResponseFacts* facts) const {
  const std::unique_ptr<Slot>* slot = entries_.find(id);
  if (slot == nullptr) return nullptr;
  if (name_hash != nullptr) *name_hash = (*slot)->name_hash;
  if (facts != nullptr) *facts = (*slot)->facts;
  return &(*slot)->response;
}

void RankCache::prefetch_response(std::int32_t id) const {
  // The response's set, name, op and scale factors, and its first tensor's spec: two lines.
  constexpr std::size_t kResponseHead = 2 * base::kCacheLine;
  if (const std::unique_ptr<Slot>* slot = entries_.find(id)) {
    const auto* response = reinterpret_cast<const char*>(&(*slot)->response);
    base::prefetch_lines(slot->get(), response + kResponseHead);
  }
}

void RankCache::insert(std::int32_t id, const Request& request, const Response& response,
                       ResponseFacts facts) {
  std::unique_ptr<Slot>& owned = entries_[id];
  if (owned == nullptr) owned = std::make_unique<Slot>();
  Slot& slot = *owned;
  slot = Slot{.name_hash = name_hash(OpKeyView{request.process_set_id, request.name}),
              .facts = facts,
              .response = response,
              .request = request};
  const Newest newest{.id = id, .slot = &slot};
  const auto [stored, inserted] = by_key_.insert(slot.name_hash, newest);
  if (!inserted) *stored = newest;  // Same key: the stored one's slot has the same name.
}

void RankCache::erase(std::int32_t id) {
  const std::unique_ptr<Slot>* slot = entries_.find(id);
  if (slot == nullptr) return;
  const OpKeyView key{(*slot)->request.process_set_id, (*slot)->request.name};
  const std::uint64_t hash = name_hash(key);
  if (const Newest* newest = by_key_.find(key, hash); newest != nullptr && newest->id == id)
    by_key_.take(key, hash);
  entries_.erase(id);
}

}  // namespace tutti::core

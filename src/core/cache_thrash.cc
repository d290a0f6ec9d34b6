// SPDX-License-Identifier: Apache-2.0
#include "src/core/cache_thrash.h"

#include <algorithm>

#include "src/base/strings.h"
#include "src/core/name_index.h"

namespace tutti::core {

CacheThrashWatch::CacheThrashWatch(std::int64_t capacity)
    : limit_(static_cast<std::size_t>(std::clamp<std::int64_t>(
          8 * std::min<std::int64_t>(capacity, kMaxRemembered),
          static_cast<std::int64_t>(kMinRemembered), static_cast<std::int64_t>(kMaxRemembered)))) {
  seen_.capacity = capacity;
}

void CacheThrashWatch::evicted_for_room(OpKeyView key) {
  if (reported_) return;
  const std::uint64_t key_hash = name_hash(key);
  by_hash_[key_hash] = inserts_;
  order_.push_back({key_hash, inserts_});
  if (order_.size() <= limit_) return;
  const Evicted oldest = order_.front();
  order_.pop_front();
  // Forgotten unless the name was evicted again since (a newer record stands for it then).
  auto it = by_hash_.find(oldest.hash);
  if (it != by_hash_.end() && it->second == oldest.at) by_hash_.erase(it);
}

std::optional<CacheThrashWatch::Report> CacheThrashWatch::inserted(OpKeyView key) {
  ++inserts_;
  if (reported_ || by_hash_.empty()) return std::nullopt;  // No hashing while nothing churns.
  auto it = by_hash_.find(name_hash(key));
  if (it == by_hash_.end()) return std::nullopt;
  // The inserts since its eviction, this one excluded, evicted as many names; with the
  // capacity's worth it was among, that is the names it recurs among.
  const std::int64_t distance = inserts_ - 1 - it->second + seen_.capacity;
  by_hash_.erase(it);
  ++seen_.recurrences;
  seen_.distance = std::max(seen_.distance, distance);
  if (seen_.recurrences < seen_.capacity) return std::nullopt;
  reported_ = true;
  by_hash_.clear();
  order_.clear();
  return seen_;
}

std::string describe(const CacheThrashWatch::Report& report) {
  return detail::str_cat(
      "the response cache thrashes (TUTTI_CACHE_CAPACITY=", report.capacity,
      "): op names came back ", report.recurrences,
      " times after it evicted them to make room, and they recur among about ", report.distance,
      " names, so their ops are negotiated in full and churn every rank's cache, which costs more "
      "than no cache. Set TUTTI_CACHE_CAPACITY to at least ",
      report.distance, ", or to 0 to turn the cache off");
}

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
#include "src/core/cache_admission.h"

#include <algorithm>
#include <bit>
#include <string>

#include "src/base/strings.h"
#include "src/core/name_index.h"

namespace tutti::core {

CacheAdmission::CacheAdmission(std::int64_t capacity)
    : limit_(static_cast<std::size_t>(std::clamp<std::int64_t>(
          8 * std::min<std::int64_t>(capacity, kMaxRemembered),
          static_cast<std::int64_t>(kMinRemembered), static_cast<std::int64_t>(kMaxRemembered)))) {
  seen_.capacity = capacity;
}

bool CacheAdmission::admits(std::uint64_t hash, std::optional<std::uint64_t> lru_used,
                            std::uint64_t now) {
  ++misses_;
  if (remembered_ == 0) return true;  // Nothing has left.
  const std::size_t at = slot_of(hash);
  if (index_[at].hash == 0) return true;  // New, or forgotten: in, as least-recently-used has it.
  const Departure& gone = ring_[index_[at].record];
  recurred(gone.at);
  // Note [Cache admission]: kept out if even the least recently used entry was used since.
  if (lru_used && gone.used < *lru_used) {
    remember(hash, now);
    return false;
  }
  erase_slot(at);  // Its record goes stale.
  return true;
}

void CacheAdmission::remember(std::uint64_t hash, std::uint64_t used) {
  if (ring_.empty()) {
    ring_.resize(limit_);
    index_.resize(std::bit_ceil(2 * limit_));
  }
  Departure& record = ring_[next_];
  if (record.hash != 0) {
    // The oldest departure, forgotten unless its name left again since (or got in: then its
    // hash is not in the index, or points to another record).
    const std::size_t oldest = slot_of(record.hash);
    if (index_[oldest].hash != 0 && index_[oldest].record == next_) erase_slot(oldest);
  }
  record = Departure{.hash = hash, .used = used, .at = misses_};
  const std::size_t at = slot_of(hash);
  if (index_[at].hash == 0) {
    index_[at].hash = hash;
    ++remembered_;
  }
  index_[at].record = static_cast<std::uint32_t>(next_);
  next_ = next_ + 1 == limit_ ? 0 : next_ + 1;
}

std::size_t CacheAdmission::slot_of(std::uint64_t hash) const {
  const std::size_t mask = index_.size() - 1;
  std::size_t at = hash & mask;
  while (index_[at].hash != 0 && index_[at].hash != hash) at = (at + 1) & mask;
  return at;
}

void CacheAdmission::erase_slot(std::size_t at) {
  erase_probed_slot(index_, at);
  --remembered_;
}

void CacheAdmission::recurred(std::int64_t left_at) {
  if (reported_) return;
  // The misses since it left, with the capacity's worth of names cached meanwhile: about the
  // names it recurs among (exactly, for names that recur in a fixed cycle).
  const std::int64_t distance = misses_ - left_at + seen_.capacity;
  ++seen_.recurrences;
  seen_.distance = std::max(seen_.distance, distance);
  if (seen_.recurrences < seen_.capacity) return;
  reported_ = true;
  due_ = seen_;
}

std::string describe(const CacheAdmission::Report& report) {
  const std::string size =
      report.grown ? detail::str_cat(report.capacity,
                                     " entries, the most it grows to with TUTTI_CACHE_CAPACITY "
                                     "unset at this job's size")
                   : detail::str_cat("TUTTI_CACHE_CAPACITY=", report.capacity);
  return detail::str_cat(
      "the response cache is too small for the op names that recur (", size, "): names came back ",
      report.recurrences, " times after they left it, and they recur among about ", report.distance,
      " names. It keeps ", report.capacity,
      " of them and negotiates the others in full each time. Set TUTTI_CACHE_CAPACITY to at "
      "least ",
      report.distance, " for every one to hit");
}

}  // namespace tutti::core

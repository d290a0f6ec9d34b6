// SPDX-License-Identifier: Apache-2.0
#include "src/core/cache_admission.h"

#include <algorithm>
#include <bit>
#include <string>

#include "src/base/strings.h"

namespace tutti::core {

CacheAdmission::CacheAdmission(std::int64_t capacity)
    : limit_(static_cast<std::uint32_t>(std::clamp<std::int64_t>(
          8 * std::min<std::int64_t>(capacity, kMaxRemembered),
          static_cast<std::int64_t>(kMinRemembered), static_cast<std::int64_t>(kMaxRemembered)))) {
  seen_.capacity = capacity;
}

bool CacheAdmission::admits(std::uint64_t hash, std::optional<std::uint64_t> lru_used,
                            std::uint64_t now) {
  ++misses_;
  if (buckets_.empty()) return true;  // Nothing has left.
  sweep();
  Record* gone = find(bucket_of(hash), tag_of(hash));
  if (gone == nullptr) return true;  // New, or forgotten: in, as least-recently-used has it.
  recurred(gone->left);
  // Note [Cache admission]: kept out if even the least recently used entry was used since.
  if (lru_used && gone->used < *lru_used) {
    gone->used = now;  // Remembered again, in its own record.
    gone->left = static_cast<std::uint32_t>(misses_);
    return false;
  }
  *gone = Record{};  // In: forgotten.
  return true;
}

CacheAdmission::Record* CacheAdmission::find(Bucket& bucket, std::uint32_t tag) {
  for (Record& record : bucket.way) {
    if (record.tag == tag && live(record)) return &record;
  }
  return nullptr;
}

void CacheAdmission::remember(std::uint64_t hash, std::uint64_t used) {
  if (buckets_.empty())
    buckets_.resize(std::bit_ceil(std::size_t{limit_}) * kRecordsPerName / kWays);
  Bucket& bucket = bucket_of(hash);
  const std::uint32_t tag = tag_of(hash);
  Record* to = find(bucket, tag);
  if (to == nullptr) {  // Else a free record, or the one that left first (the most misses ago).
    Record* free = std::ranges::find_if(bucket.way, [this](const Record& r) { return !live(r); });
    if (free != std::end(bucket.way)) to = free;
  }
  if (to == nullptr) {
    to = &*std::ranges::max_element(bucket.way, {}, [this](const Record& record) {
      return static_cast<std::uint32_t>(misses_) - record.left;
    });
    ++forgotten_early_;
  }
  *to = Record{.used = used, .tag = tag, .left = static_cast<std::uint32_t>(misses_)};
}

void CacheAdmission::sweep() {
  for (Record& record : buckets_[sweep_].way) {
    if (!live(record)) record = Record{};
  }
  sweep_ = (sweep_ + 1) & (buckets_.size() - 1);
}

std::size_t CacheAdmission::remembered() const {
  std::size_t count = 0;
  for (const Bucket& bucket : buckets_) {
    count += static_cast<std::size_t>(
        std::ranges::count_if(bucket.way, [this](const Record& r) { return live(r); }));
  }
  return count;
}

void CacheAdmission::recurred(std::uint32_t left) {
  if (reported_) return;
  // The misses since it left, with the capacity's worth of names cached meanwhile: about the
  // names it recurs among (exactly, for names that recur in a fixed cycle).
  const std::int64_t distance =
      static_cast<std::int64_t>(static_cast<std::uint32_t>(misses_) - left) + seen_.capacity;
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

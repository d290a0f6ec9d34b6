// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/hit_table.h"

#include <algorithm>

#include "src/common/check.h"

namespace tutti::core {
namespace {

constexpr int kWordBits = 64;

}  // namespace

bool HitTable::Pending::has(int set_rank) const {
  if (set_rank < kWordBits) return (low >> set_rank) & 1;
  const std::size_t word = static_cast<std::size_t>(set_rank / kWordBits - 1);
  return word < high.size() && ((high[word] >> (set_rank % kWordBits)) & 1);
}

HitTable::Pending* HitTable::find(std::int32_t id) {
  const std::uint32_t* at = index_.find(id);
  return at == nullptr ? nullptr : &records_[*at];
}

HitTable::Pending& HitTable::start(std::int32_t id,
                                   std::shared_ptr<const CoordinatorCache::Entry> op, int size,
                                   Clock::time_point first_seen) {
  TUTTI_CHECK(id >= 0, "cache id ", id, " is negative");
  TUTTI_CHECK(!index_.contains(id), "cache id ", id, " is already pending");
  std::uint32_t at = 0;
  if (free_.empty()) {
    at = static_cast<std::uint32_t>(records_.size());
    records_.emplace_back();
  } else {
    at = free_.back();
    free_.pop_back();
  }
  Pending& pending = records_[at];
  pending.id = id;
  pending.op = std::move(op);
  pending.size = size;
  pending.count = 0;
  pending.first_seen = first_seen;
  pending.queued = false;
  pending.low = 0;
  pending.high.clear();
  index_[id] = at;
  ++live_;
  return pending;
}

bool HitTable::add(Pending& pending, int set_rank) {
  TUTTI_CHECK(set_rank >= 0 && set_rank < pending.size, "set rank ", set_rank, " outside a set of ",
              pending.size);
  TUTTI_CHECK(!pending.has(set_rank), "set rank ", set_rank, " sent cache id ", pending.id,
              " twice");
  if (set_rank < kWordBits) {
    pending.low |= std::uint64_t{1} << set_rank;
  } else {
    const std::size_t word = static_cast<std::size_t>(set_rank / kWordBits - 1);
    if (pending.high.size() <= word) pending.high.resize(word + 1, 0);
    pending.high[word] |= std::uint64_t{1} << (set_rank % kWordBits);
  }
  return ++pending.count == pending.size;
}

HitTable::Pending HitTable::take(std::int32_t id) {
  const std::uint32_t* found = index_.find(id);
  TUTTI_CHECK(found != nullptr, "cache id ", id, " is not pending");
  const std::uint32_t at = *found;
  index_.erase(id);
  Pending& record = records_[at];
  Pending pending{.id = record.id,
                  .op = std::move(record.op),
                  .size = record.size,
                  .count = record.count,
                  .first_seen = record.first_seen,
                  .queued = record.queued,
                  .low = record.low,
                  .high = record.high};  // Copied: the record keeps its buffer for reuse.
  record.id = -1;
  free_.push_back(at);
  --live_;
  return pending;
}

std::shared_ptr<const CoordinatorCache::Entry> HitTable::take_op(std::int32_t id) {
  const std::uint32_t* found = index_.find(id);
  TUTTI_CHECK(found != nullptr, "cache id ", id, " is not pending");
  const std::uint32_t at = *found;
  index_.erase(id);
  Pending& record = records_[at];
  record.id = -1;
  free_.push_back(at);
  --live_;
  return std::move(record.op);
}

std::vector<std::int32_t> HitTable::ids() const {
  std::vector<std::int32_t> result;
  result.reserve(live_);
  for_each([&](const Pending& pending) { result.push_back(pending.id); });
  return result;
}

}  // namespace tutti::core

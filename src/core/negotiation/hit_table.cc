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

std::size_t HitTable::home(std::int32_t id) const {
  // Fibonacci hashing: ids are mostly consecutive, and the product's high bits spread them.
  const std::uint64_t spread =
      static_cast<std::uint64_t>(static_cast<std::uint32_t>(id)) * 0x9e3779b97f4a7c15ULL;
  return static_cast<std::size_t>(spread >> 32) & (index_.size() - 1);
}

std::size_t HitTable::slot_of(std::int32_t id) const {
  const std::size_t mask = index_.size() - 1;
  std::size_t slot = home(id);
  for (; index_[slot] != 0; slot = (slot + 1) & mask) {
    if (records_[index_[slot] - 1].id == id) return slot;
  }
  return slot;
}

HitTable::Pending* HitTable::find(std::int32_t id) {
  if (live_ == 0) return nullptr;
  const std::uint32_t at = index_[slot_of(id)];
  return at == 0 ? nullptr : &records_[at - 1];
}

void HitTable::grow() {
  std::vector<std::uint32_t> old = std::move(index_);
  index_.assign(std::max<std::size_t>(64, old.size() * 2), 0);
  for (std::uint32_t at : old) {
    if (at != 0) index_[slot_of(records_[at - 1].id)] = at;
  }
}

HitTable::Pending& HitTable::start(std::int32_t id,
                                   std::shared_ptr<const CoordinatorCache::Entry> op, int size,
                                   Clock::time_point first_seen) {
  TUTTI_CHECK(id >= 0, "cache id ", id, " is negative");
  if (2 * (live_ + 1) > index_.size()) grow();
  const std::size_t slot = slot_of(id);
  TUTTI_CHECK(index_[slot] == 0, "cache id ", id, " is already pending");
  std::uint32_t at = 0;
  if (free_.empty()) {
    records_.emplace_back();
    at = static_cast<std::uint32_t>(records_.size());
  } else {
    at = free_.back() + 1;
    free_.pop_back();
  }
  Pending& pending = records_[at - 1];
  pending.id = id;
  pending.op = std::move(op);
  pending.size = size;
  pending.count = 0;
  pending.first_seen = first_seen;
  pending.queued = false;
  pending.low = 0;
  pending.high.clear();
  index_[slot] = at;
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
  TUTTI_CHECK(live_ > 0, "cache id ", id, " is not pending");
  std::size_t slot = slot_of(id);
  const std::uint32_t at = index_[slot];
  TUTTI_CHECK(at != 0, "cache id ", id, " is not pending");
  Pending& record = records_[at - 1];
  Pending pending{.id = record.id,
                  .op = std::move(record.op),
                  .size = record.size,
                  .count = record.count,
                  .first_seen = record.first_seen,
                  .queued = record.queued,
                  .low = record.low,
                  .high = record.high};  // Copied: the record keeps its buffer for reuse.
  record.id = -1;
  free_.push_back(at - 1);
  --live_;
  // Backward-shift deletion: move later entries of the probe run into the hole, so that
  // lookups never need tombstones.
  const std::size_t mask = index_.size() - 1;
  index_[slot] = 0;
  for (std::size_t next = (slot + 1) & mask; index_[next] != 0; next = (next + 1) & mask) {
    const std::size_t start_at = home(records_[index_[next] - 1].id);
    // Move the entry if its home is not cyclically within (slot, next].
    const bool stays = slot <= next ? (slot < start_at && start_at <= next)
                                    : (slot < start_at || start_at <= next);
    if (stays) continue;
    index_[slot] = index_[next];
    index_[next] = 0;
    slot = next;
  }
  return pending;
}

std::vector<std::int32_t> HitTable::ids() const {
  std::vector<std::int32_t> result;
  result.reserve(live_);
  for_each([&](const Pending& pending) { result.push_back(pending.id); });
  return result;
}

}  // namespace tutti::core

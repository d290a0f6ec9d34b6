// SPDX-License-Identifier: Apache-2.0
#include "src/core/hit_table.h"

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
  auto it = table_.find(id);
  return it == table_.end() ? nullptr : &it->second;
}

HitTable::Pending& HitTable::start(std::int32_t id,
                                   std::shared_ptr<const CoordinatorCache::Entry> op, int size,
                                   Clock::time_point first_seen) {
  Pending pending;
  pending.id = id;
  pending.op = std::move(op);
  pending.size = size;
  pending.first_seen = first_seen;
  if (spare_.empty()) return table_.emplace(id, std::move(pending)).first->second;
  auto node = std::move(spare_.back());
  spare_.pop_back();
  node.key() = id;
  node.mapped() = std::move(pending);
  auto inserted = table_.insert(std::move(node));
  TUTTI_CHECK(inserted.inserted, "cache id ", id, " is already pending");
  return inserted.position->second;
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
  auto node = table_.extract(id);
  TUTTI_CHECK(!node.empty(), "cache id ", id, " is not pending");
  Pending pending = std::move(node.mapped());
  spare_.push_back(std::move(node));
  return pending;
}

std::vector<std::int32_t> HitTable::ids() const {
  std::vector<std::int32_t> result;
  result.reserve(table_.size());
  for (const auto& [id, pending] : table_) result.push_back(id);
  return result;
}

}  // namespace tutti::core

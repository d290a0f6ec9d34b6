// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/hit_table.h"

#include <utility>

#include "src/common/check.h"

namespace tutti::core {
namespace {

constexpr int kWordBits = 64;

}  // namespace

bool HitTable::Run::has(int set_rank) const {
  if (set_rank < kWordBits) return (low >> set_rank) & 1;
  const std::size_t word = static_cast<std::size_t>(set_rank / kWordBits - 1);
  return word < high.size() && ((high[word] >> (set_rank % kWordBits)) & 1);
}

HitTable::Run* HitTable::find(std::int32_t id) {
  Run* run = find_from(id);
  return run != nullptr && run->first <= id ? run : nullptr;
}

HitTable::Run* HitTable::find_from(std::int32_t id) {
  if (singles_ > 0) {
    if (const std::uint32_t* at = single_at_.find(id)) return &single_runs_[*at];
  }
  if (runs_.empty()) return nullptr;
  auto it = runs_.upper_bound(id);  // The first run that starts after `id`.
  if (it != runs_.begin()) {
    Run& before = std::prev(it)->second;
    if (id < before.end()) return &before;
  }
  return it == runs_.end() ? nullptr : &it->second;
}

HitTable::Run& HitTable::start(std::int32_t first, std::int32_t count, int process_set_id, int size,
                               Clock::time_point first_seen) {
  TUTTI_CHECK(first >= 0 && count > 0, "cache ids ", first, " + ", count, " are no run");
  const Run* next = find_from(first);
  TUTTI_CHECK(next == nullptr || next->first >= first + static_cast<std::int64_t>(count),
              "cache ids from ", first, " are already pending");
  // find_from() saw a run of one id at `first`; those after it it does not see.
  for (std::int32_t id = first + 1; singles_ > 0 && id < first + count; ++id) {
    TUTTI_CHECK(!single_at_.contains(id), "cache id ", id, " is already pending");
  }
  Run* made = nullptr;
  if (count == 1) {
    std::uint32_t at = 0;
    if (free_singles_.empty()) {
      at = static_cast<std::uint32_t>(single_runs_.size());
      single_runs_.emplace_back();
    } else {
      at = free_singles_.back();
      free_singles_.pop_back();
      single_runs_[at] = Run{};  // Keeps nothing of the run it held.
    }
    single_at_[first] = at;
    ++singles_;
    made = &single_runs_[at];
  } else {
    made = &runs_.try_emplace(first).first->second;
  }
  Run& run = *made;
  run.first = first;
  run.count = count;
  run.process_set_id = process_set_id;
  run.size = size;
  run.first_seen = first_seen;
  return run;
}

HitTable::Run& HitTable::split(Run& run, std::int32_t at) {
  TUTTI_CHECK(run.first < at && at < run.end(), "cache id ", at, " does not split run ", run.first,
              " + ", run.count);
  Run& rest = runs_.try_emplace(at, run).first->second;
  rest.first = at;
  rest.count = run.end() - at;
  run.count = at - run.first;
  return rest;
}

bool HitTable::add(Run& run, int set_rank) {
  TUTTI_CHECK(set_rank >= 0 && set_rank < run.size, "set rank ", set_rank, " outside a set of ",
              run.size);
  TUTTI_CHECK(!run.has(set_rank), "set rank ", set_rank, " sent cache id ", run.first, " twice");
  if (set_rank < kWordBits) {
    run.low |= std::uint64_t{1} << set_rank;
  } else {
    const std::size_t word = static_cast<std::size_t>(set_rank / kWordBits - 1);
    if (run.high.size() <= word) run.high.resize(word + 1, 0);
    run.high[word] |= std::uint64_t{1} << (set_rank % kWordBits);
  }
  return ++run.members == run.size;
}

HitTable::Run HitTable::take(std::int32_t first) {
  if (singles_ > 0) {
    if (const std::uint32_t* at = single_at_.find(first)) {
      const std::uint32_t slot = *at;
      single_at_.erase(first);
      Run run = std::move(single_runs_[slot]);
      single_runs_[slot].count = 0;  // Free.
      free_singles_.push_back(slot);
      --singles_;
      return run;
    }
  }
  auto it = runs_.find(first);
  TUTTI_CHECK(it != runs_.end(), "no run of cache ids starts at ", first);
  Run run = std::move(it->second);
  runs_.erase(it);
  return run;
}

HitTable::Run HitTable::take_id(std::int32_t id) {
  Run* run = find(id);
  TUTTI_CHECK(run != nullptr, "cache id ", id, " is not pending");
  if (run->first < id) run = &split(*run, id);
  if (run->count > 1) split(*run, id + 1);
  return take(id);
}

}  // namespace tutti::core

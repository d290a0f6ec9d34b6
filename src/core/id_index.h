// SPDX-License-Identifier: Apache-2.0
// An open-addressing table from response-cache ids to values, for the tables every cache hit
// looks up (the coordinator's cache, the rank's cached responses). See Note [Name index] in
// name_index.h for why not std::unordered_map: here the key is the id itself, stored beside
// the value, so a lookup reads one array slot.
//
// Note [Id index]
// An id's home slot is the id itself (modulo the table's size): the coordinator hands ids out
// in order, so the live ones are mostly one window of consecutive ids, which then sit in
// consecutive slots, and a step that looks its ops up in id order walks the array in order
// (P3: about a millisecond a step faster than spreading the ids with Fibonacci hashing). Such a
// window is one long run of occupied slots, and erasing from a run of plain linear probing
// scans it to its end (a cache of 10,000 ids taking 100 ms a step). So the table keeps the
// Robin Hood order: along a run, slots hold ids ever farther from home or not nearer, so that
// erasing shifts back only the ids that sit away from their home (none, in the window) and a
// lookup stops at the first id nearer its home than the one sought would be.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace tutti::core {

// Not thread-safe: the owner locks. Ids are >= 0.
template <class T>
class IdIndex {
 public:
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool contains(std::int32_t id) const { return find(id) != nullptr; }

  // The value of `id`, or null. Valid until the next insert or erase.
  T* find(std::int32_t id) { return const_cast<T*>(std::as_const(*this).find(id)); }
  const T* find(std::int32_t id) const {
    const std::size_t at = position(id);
    return at == kNone ? nullptr : &slots_[at].value;
  }

  // The value of `id`, default-constructed first if absent.
  T& operator[](std::int32_t id) {
    if (const std::size_t at = position(id); at != kNone) return slots_[at].value;
    if (2 * (size_ + 1) > slots_.size()) grow();
    ++size_;
    return slots_[place(Slot{.id = id, .value = T{}})].value;
  }

  // Removes `id` if present; true if it was.
  bool erase(std::int32_t id) {
    std::size_t at = position(id);
    if (at == kNone) return false;
    // Backward shift: the ids after it that sit away from their home move one slot back.
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t next = (at + 1) & mask;
         slots_[next].id >= 0 && distance(slots_[next].id, next) > 0; next = (next + 1) & mask) {
      slots_[at] = std::move(slots_[next]);
      at = next;
    }
    slots_[at] = Slot{};
    --size_;
    return true;
  }

  // Calls `visit(std::int32_t id, const T&)` for every value, in no particular order.
  template <class Visit>
  void for_each(Visit&& visit) const {
    for (const Slot& slot : slots_) {
      if (slot.id >= 0) visit(slot.id, slot.value);
    }
  }

 private:
  struct Slot {
    std::int32_t id = -1;  // -1: empty.
    T value{};
  };
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  std::size_t home(std::int32_t id) const {
    return static_cast<std::size_t>(id) & (slots_.size() - 1);
  }
  // How far slot `at` is from `id`'s home.
  std::size_t distance(std::int32_t id, std::size_t at) const {
    return (at - home(id)) & (slots_.size() - 1);
  }

  // The slot holding `id`, or kNone.
  std::size_t position(std::int32_t id) const {
    if (size_ == 0) return kNone;
    const std::size_t mask = slots_.size() - 1;
    std::size_t at = home(id);
    for (std::size_t d = 0;; ++d, at = (at + 1) & mask) {
      const std::int32_t there = slots_[at].id;
      if (there == id) return at;
      // An empty slot, or one whose id is nearer its home than `id` would be: not here.
      if (there < 0 || distance(there, at) < d) return kNone;
    }
  }

  // Stores `slot` (an id not in the table; there is room) and returns where it went: walking
  // from its home, it takes the place of the first id nearer its own home, which walks on.
  std::size_t place(Slot slot) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t at = home(slot.id);
    std::size_t placed = kNone;
    for (std::size_t d = 0;; ++d, at = (at + 1) & mask) {
      if (slots_[at].id < 0) {
        slots_[at] = std::move(slot);
        return placed == kNone ? at : placed;
      }
      const std::size_t theirs = distance(slots_[at].id, at);
      if (theirs < d) {
        std::swap(slots_[at], slot);
        if (placed == kNone) placed = at;
        d = theirs;
      }
    }
  }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_ = std::vector<Slot>(std::max<std::size_t>(64, old.size() * 2));
    for (Slot& slot : old) {
      if (slot.id >= 0) place(std::move(slot));
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace tutti::core

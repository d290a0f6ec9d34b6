// SPDX-License-Identifier: Apache-2.0
// An open-addressing table from response-cache ids to values, for the tables every cache hit
// looks up (the coordinator's cache, the rank's cached responses). See Note [Name index] in
// name_index.h for why not std::unordered_map: here the key is the id itself, stored beside
// the value, so a lookup reads one array slot.
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
    if (size_ == 0) return nullptr;
    const Slot& slot = slots_[slot_of(id)];
    return slot.id < 0 ? nullptr : &slot.value;
  }

  // The value of `id`, default-constructed first if absent.
  T& operator[](std::int32_t id) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    Slot& slot = slots_[slot_of(id)];
    if (slot.id < 0) {
      slot.id = id;
      ++size_;
    }
    return slot.value;
  }

  // Removes `id` if present; true if it was.
  bool erase(std::int32_t id) {
    if (size_ == 0) return false;
    std::size_t at = slot_of(id);
    if (slots_[at].id < 0) return false;
    // Backward-shift deletion: no tombstones (see Note [Name index]).
    const std::size_t mask = slots_.size() - 1;
    slots_[at] = Slot{};
    --size_;
    for (std::size_t next = (at + 1) & mask; slots_[next].id >= 0; next = (next + 1) & mask) {
      const std::size_t start = home(slots_[next].id);
      const bool stays = at <= next ? (at < start && start <= next) : (at < start || start <= next);
      if (stays) continue;
      slots_[at] = std::move(slots_[next]);
      slots_[next] = Slot{};
      at = next;
    }
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

  // The id itself: the coordinator hands ids out in order, so the live ones are mostly a
  // window of consecutive ids (distinct modulo the table's size, which is at least twice their
  // count), and a step that looks its ops up in id order walks the array in order too.
  std::size_t home(std::int32_t id) const {
    return static_cast<std::size_t>(id) & (slots_.size() - 1);
  }

  // The slot holding `id`, or the empty slot where it would go. slots_ is not empty.
  std::size_t slot_of(std::int32_t id) const {
    const std::size_t mask = slots_.size() - 1;
    std::size_t at = home(id);
    while (slots_[at].id >= 0 && slots_[at].id != id) at = (at + 1) & mask;
    return at;
  }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_ = std::vector<Slot>(std::max<std::size_t>(64, old.size() * 2));
    for (Slot& slot : old) {
      if (slot.id >= 0) slots_[slot_of(slot.id)] = std::move(slot);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace tutti::core

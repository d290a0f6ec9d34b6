// SPDX-License-Identifier: Apache-2.0
// An open-addressing table from (process set, name) to a small value that knows its own key, for
// the tables every op looks up by name (the queue's ops in flight, the rank's response cache).
//
// Note [Name index]
// P3 (10,000 tiny named ops per step) spent a third of its communication thread in
// std::unordered_map lookups by name: the bucket, then the node, then the key's string, each a
// cache miss on a table of 10,000 ops, and a string compare on every hit. Here a lookup reads
// one array slot holding the key's 64-bit hash beside the value; only on an equal hash does it
// compare the names (the value gives its key: the table stores no strings of its own), so a
// lookup costs one probe and the one compare that confirms the match, and inserting a name that
// is absent compares no strings at all. The caller computes the hash once (name_hash()) and may
// keep it: the queue stores it in the op's entry and the response cache reuses it.
// Linear probing over a power-of-two array kept at most half full; erasing shifts the rest of
// the probe run back, so there are no tombstones and lookups stay short whatever the churn.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "src/core/op_key.h"

namespace tutti::core {

// The hash NameIndex's find() and insert() take for `key`. Never 0 (0 marks an empty slot).
inline std::uint64_t name_hash(OpKeyView key) {
  const std::uint64_t hash = OpKeyHash()(key);
  return hash == 0 ? 1 : hash;
}

// Empties slot `at` of a linear-probing array and moves later members of its probe run back
// (backward-shift deletion), so that no tombstones are left. The array's size is a power of two;
// each slot has a `hash` member, 0 when empty, and its home is hash & (size - 1). NameIndex's
// (CacheAdmission's memory used it too until it became buckets updated in place).
template <class Slot>
void erase_probed_slot(std::vector<Slot>& slots, std::size_t at) {
  const std::size_t mask = slots.size() - 1;
  slots[at] = Slot{};
  for (std::size_t next = (at + 1) & mask; slots[next].hash != 0; next = (next + 1) & mask) {
    const std::size_t start = slots[next].hash & mask;
    // The value at `next` stays if its home lies cyclically within (at, next].
    const bool stays = at <= next ? (at < start && start <= next) : (at < start || start <= next);
    if (stays) continue;
    slots[at] = std::move(slots[next]);
    slots[next] = Slot{};
    at = next;
  }
}

// `KeyOf` is a functor: OpKeyView operator()(const T&) const. Not thread-safe: the owner locks.
template <class T, class KeyOf>
class NameIndex {
 public:
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Slots in the array: at least twice size(); see Note [An index that shrinks].
  std::size_t capacity() const { return slots_.size(); }
  // The capacity below which the index does not shrink.
  static constexpr std::size_t kShrinkFloor = 4096;

  // The value stored under `key` (whose hash is `hash`), or null. Valid until the next insert
  // or erase.
  T* find(OpKeyView key, std::uint64_t hash) {
    return const_cast<T*>(std::as_const(*this).find(key, hash));
  }
  const T* find(OpKeyView key, std::uint64_t hash) const {
    if (size_ == 0) return nullptr;
    const std::size_t at = slot_of(key, hash);
    return slots_[at].hash == 0 ? nullptr : &slots_[at].value;
  }

  // Starts loading the slot where a lookup of `hash` begins, so that a loop over many keys can
  // overlap their cache misses (the index is larger than a core's cache at 10,000 names).
  // Always inlined: Note [Prefetches kept] in src/base/prefetch.h.
  [[gnu::always_inline]] void prefetch(std::uint64_t hash) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[home(hash)]);
  }

  // The value in the first slot of `hash`'s probe run that holds `hash`, or null, without
  // comparing keys (which would read what the value points to): for a caller that prefetches
  // what a later find() reads. Mostly find()'s value; nothing may rely on it.
  const T* peek(std::uint64_t hash) const {
    if (size_ == 0) return nullptr;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t at = home(hash); slots_[at].hash != 0; at = (at + 1) & mask) {
      if (slots_[at].hash == hash) return &slots_[at].value;
    }
    return nullptr;
  }

  // Stores `value` under its key, whose hash is `hash`, unless the key is there already.
  // Returns the stored value (the old one if present) and whether `value` was inserted. An
  // rvalue is moved from only when inserted: a refused one stays the caller's.
  template <class V>
  std::pair<T*, bool> insert(std::uint64_t hash, V&& value) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    const std::size_t at = slot_of(KeyOf()(std::as_const(value)), hash);
    if (slots_[at].hash != 0) return {&slots_[at].value, false};
    slots_[at].hash = hash;
    slots_[at].value = std::forward<V>(value);
    ++size_;
    return {&slots_[at].value, true};
  }

  // Removes and returns the value under `key`, or T{} if there is none.
  T take(OpKeyView key, std::uint64_t hash) {
    if (size_ == 0) return T{};
    const std::size_t at = slot_of(key, hash);
    if (slots_[at].hash == 0) return T{};
    T value = std::move(slots_[at].value);
    erase_slot(at);
    shrink_if_sparse();
    return value;
  }

  // Removes every value for which `pred(value)` holds, passing it to `out(T&&)` first.
  template <class Pred, class Out>
  void take_if(Pred&& pred, Out&& out) {
    // Erasing moves later members of the probe run back into the hole, so the slot is looked
    // at again after an erase. Nothing moves from an unvisited slot to a visited one: a run
    // that wraps past the end moves values from the array's start (visited, kept) to its end.
    for (std::size_t at = 0; at < slots_.size() && size_ > 0;) {
      if (slots_[at].hash != 0 && pred(std::as_const(slots_[at].value))) {
        out(std::move(slots_[at].value));
        erase_slot(at);
      } else {
        ++at;
      }
    }
    shrink_if_sparse();
  }

  // Calls `visit(const T&)` for every value, in no particular order.
  template <class Visit>
  void for_each(Visit&& visit) const {
    for (const Slot& slot : slots_) {
      if (slot.hash != 0) visit(slot.value);
    }
  }

  void clear() {
    slots_.clear();
    size_ = 0;
  }

 private:
  struct Slot {
    std::uint64_t hash = 0;  // 0: empty.
    T value{};
  };

  std::size_t home(std::uint64_t hash) const { return hash & (slots_.size() - 1); }

  // The slot holding `key`, or the empty slot where it would go. slots_ is not empty.
  std::size_t slot_of(OpKeyView key, std::uint64_t hash) const {
    const std::size_t mask = slots_.size() - 1;
    std::size_t at = home(hash);
    for (; slots_[at].hash != 0; at = (at + 1) & mask) {
      if (slots_[at].hash == hash && OpKeyEqual()(KeyOf()(slots_[at].value), key)) return at;
    }
    return at;
  }

  void grow() { rehash(std::max<std::size_t>(64, slots_.size() * 2)); }

  // Note [An index that shrinks]
  // The queue's table of ops in flight grew to 32,768 slots (768 KB) in P3's first step, when
  // all 10,000 ops waited for their first negotiation, and kept that size while later steps had
  // a few hundred in flight (Note [A submitting thread keeps its backlog short] in
  // submission_window.h): every push then probed a random slot of an array larger than the
  // core's L2 cache, and missed (perf: 69 % of TensorQueue::push()'s time, 6.5 % of all of the
  // step's cycles, on the AMD EPYC VM of family 25 model 1). So an index less than an eighth
  // full shrinks to a quarter full, not below kShrinkFloor slots (96 KB of the queue's). Growing at
  // half full and shrinking at an eighth, a size that stays put rehashes at most once.
  void shrink_if_sparse() {
    if (slots_.size() <= kShrinkFloor || 8 * size_ >= slots_.size()) return;
    rehash(std::max(kShrinkFloor, std::bit_ceil(4 * size_)));
  }

  // Moves every value into a new array of `slots` slots (a power of two, more than twice size_).
  void rehash(std::size_t slots) {
    std::vector<Slot> old = std::move(slots_);
    slots_ = std::vector<Slot>(slots);
    const std::size_t mask = slots_.size() - 1;
    for (Slot& slot : old) {
      if (slot.hash == 0) continue;
      std::size_t at = home(slot.hash);
      while (slots_[at].hash != 0) at = (at + 1) & mask;
      slots_[at] = std::move(slot);
    }
  }

  void erase_slot(std::size_t at) {
    erase_probed_slot(slots_, at);
    --size_;
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace tutti::core

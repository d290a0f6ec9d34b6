// SPDX-License-Identifier: Apache-2.0
// A vector that keeps its first N elements inside itself: an op's tensor views (nearly always
// one) then cost no allocation of their own (per-op allocations dominated P3, issue 12).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace tutti::base {

// The subset of std::vector's interface that core uses, contiguous like it (data(), spans).
// Up to N elements live in place; past that, all of them move to a heap buffer and stay there.
// Not thread-safe, like std::vector.
//
// Note [Compact inline vector]
// The in-place elements and the heap buffer's pointer share their bytes, and the size and
// capacity are 32-bit: the whole overhead is 8 bytes beside max(N elements, a pointer). Every
// op's Request holds one of these (its tensor specs) holding another (a spec's dims), and every
// entry one more (its views); a std::vector kept beside the in-place elements, as before, made
// a Request 248 bytes and an entry 440 (now 168 and 320, with their members reordered to leave
// no padding). At 10,000 tiny ops a step (P3) an op's records are out of the core's cache when
// each stage comes back to them, so their size is paid in cache misses on every pass: this
// layout made P3's step 0.90 of what it was (examples/BENCHMARK_LOG.md, thirteenth round).
template <class T, std::size_t N>
class InlineVector {
  static_assert(N > 0, "an InlineVector keeps at least one element in place");
  static_assert(std::is_nothrow_move_constructible_v<T>, "moves must not throw (see take())");

 public:
  InlineVector() {}  // NOLINT(modernize-use-equals-default): the union is left uninitialized.
  InlineVector(std::initializer_list<T> values) { append(values.begin(), values.end()); }
  explicit InlineVector(std::span<const T> values) { append(values.begin(), values.end()); }
  // Implicit, as a copy: core fills in place what callers hand over as std::vector.
  InlineVector(const std::vector<T>& values) { append(values.begin(), values.end()); }
  InlineVector(const InlineVector& other) { append(other.begin(), other.end()); }
  InlineVector(InlineVector&& other) noexcept { take(other); }
  InlineVector& operator=(const InlineVector& other) {
    if (this != &other) {
      clear();
      append(other.begin(), other.end());
    }
    return *this;
  }
  InlineVector& operator=(InlineVector&& other) noexcept {
    if (this != &other) {
      clear();
      release();
      take(other);
    }
    return *this;
  }
  InlineVector& operator=(std::initializer_list<T> values) {
    clear();
    append(values.begin(), values.end());
    return *this;
  }
  ~InlineVector() {
    clear();
    release();
  }

  T* data() { return on_heap() ? heap_ : local(); }
  const T* data() const { return on_heap() ? heap_ : local(); }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }
  // Bounds-checked, as std::vector::at: throws std::out_of_range.
  const T& at(std::size_t i) const {
    if (i >= size_) throw std::out_of_range("InlineVector::at");
    return data()[i];
  }
  // A std::vector of the elements (for the APIs that take one).
  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }

  // Room for `n` elements without another allocation. Throws std::length_error past 2^32 - 1.
  void reserve(std::size_t n) {
    if (n > capacity_) move_to(allocate(n), n);
  }
  void push_back(const T& value) { emplace_back(value); }
  void push_back(T&& value) { emplace_back(std::move(value)); }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    if (size_ < capacity_) {
      T* slot = ::new (static_cast<void*>(data() + size_)) T(std::forward<Args>(args)...);
      ++size_;
      return *slot;
    }
    // Full: the new element is made in the new buffer before the old ones move, since `args`
    // may refer to one of them (as in v.push_back(v[0])).
    // At least N + 1: GCC 12 at -O3 cannot tell capacity_ is never 0 and warned of a
    // zero-length buffer (-Warray-bounds) in resize().
    const std::size_t capacity = std::max(2 * static_cast<std::size_t>(capacity_), N + 1);
    T* buffer = allocate(capacity);
    T* slot = nullptr;
    try {
      slot = ::new (static_cast<void*>(buffer + size_)) T(std::forward<Args>(args)...);
    } catch (...) {
      std::allocator<T>().deallocate(buffer, capacity);
      throw;
    }
    move_to(buffer, capacity);
    ++size_;
    return *slot;
  }
  // `n` elements: the first ones kept, new ones value-initialized (zero for numbers).
  void resize(std::size_t n) {
    if (n < size_) {
      std::destroy(data() + n, data() + size_);
      size_ = static_cast<std::uint32_t>(n);
      return;
    }
    reserve(n);
    while (size_ < n) emplace_back();
  }
  void assign(std::span<const T> values) {
    clear();
    append(values.begin(), values.end());
  }
  friend bool operator==(const InlineVector& a, const InlineVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const InlineVector& a, const std::vector<T>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  // Leaves the vector empty; a spilled one keeps its heap buffer.
  void clear() {
    std::destroy_n(data(), size_);
    size_ = 0;
  }

 private:
  bool on_heap() const { return capacity_ > N; }
  T* local() { return std::launder(reinterpret_cast<T*>(storage_)); }
  const T* local() const { return std::launder(reinterpret_cast<const T*>(storage_)); }

  static T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::uint32_t>::max()) {
      throw std::length_error("InlineVector: more than 2^32 - 1 elements");
    }
    return std::allocator<T>().allocate(n);
  }
  // Moves the elements to `buffer` (room for `capacity`, allocate()'s), which they then live
  // in, and frees the old heap buffer if there was one.
  void move_to(T* buffer, std::size_t capacity) noexcept {
    T* old = data();
    std::uninitialized_move_n(old, size_, buffer);
    std::destroy_n(old, size_);
    release();
    heap_ = buffer;
    capacity_ = static_cast<std::uint32_t>(capacity);
  }
  // Frees the heap buffer, if any, and goes back in place; the vector must be empty or its
  // elements moved out.
  void release() noexcept {
    if (on_heap()) std::allocator<T>().deallocate(heap_, capacity_);
    capacity_ = N;
  }
  template <class It>
  void append(It first, It last) {
    reserve(static_cast<std::size_t>(last - first));
    for (; first != last; ++first) emplace_back(*first);
  }
  // Moves `other`'s elements here (this one is empty and in place) and leaves `other` empty
  // and in place: a heap buffer changes owner, in-place elements move one by one.
  void take(InlineVector& other) noexcept {
    if (other.on_heap()) {
      heap_ = other.heap_;
      capacity_ = other.capacity_;
      size_ = other.size_;
      other.size_ = 0;
      other.capacity_ = N;
      return;
    }
    std::uninitialized_move_n(other.local(), other.size_, local());
    size_ = other.size_;
    other.clear();
  }

  union {
    alignas(T) std::byte storage_[N * sizeof(T)];  // The elements while capacity_ == N.
    T* heap_;                                      // Their buffer while capacity_ > N.
  };
  std::uint32_t size_ = 0;
  std::uint32_t capacity_ = N;
};

}  // namespace tutti::base

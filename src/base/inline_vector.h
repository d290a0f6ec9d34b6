// SPDX-License-Identifier: Apache-2.0
// A vector that keeps its first N elements inside itself: an op's tensor views (nearly always
// one) then cost no allocation of their own (per-op allocations dominated P3, issue 12).
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace tutti::base {

// The subset of std::vector's interface that core uses, contiguous like it (data(), spans).
// Up to N elements live in place; past that, all of them move to a std::vector and stay there.
// Not thread-safe, like std::vector.
template <class T, std::size_t N>
class InlineVector {
  static_assert(std::is_nothrow_move_constructible_v<T>, "moves must not throw (see take())");

 public:
  InlineVector() = default;
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
      take(other);
    }
    return *this;
  }
  InlineVector& operator=(std::initializer_list<T> values) {
    clear();
    append(values.begin(), values.end());
    return *this;
  }
  ~InlineVector() { clear(); }

  T* data() { return on_heap_ ? heap_.data() : local(); }
  const T* data() const { return on_heap_ ? heap_.data() : local(); }
  std::size_t size() const { return on_heap_ ? heap_.size() : count_; }
  bool empty() const { return size() == 0; }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size() - 1]; }
  const T& back() const { return data()[size() - 1]; }
  // Bounds-checked, as std::vector::at: throws std::out_of_range.
  const T& at(std::size_t i) const {
    if (i >= size()) throw std::out_of_range("InlineVector::at");
    return data()[i];
  }
  // A std::vector of the elements (for the APIs that take one).
  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }

  void reserve(std::size_t n) {
    if (n > N && !on_heap_) spill(n);
    if (on_heap_) heap_.reserve(n);
  }
  void push_back(const T& value) { emplace_back(value); }
  void push_back(T&& value) { emplace_back(std::move(value)); }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    if (!on_heap_ && count_ == N) spill(2 * N);
    if (on_heap_) return heap_.emplace_back(std::forward<Args>(args)...);
    T* slot = ::new (static_cast<void*>(local() + count_)) T(std::forward<Args>(args)...);
    ++count_;
    return *slot;
  }
  // `n` elements: the first ones kept, new ones value-initialized (zero for numbers).
  void resize(std::size_t n) {
    if (n < size()) {
      if (on_heap_) {
        heap_.resize(n);
      } else {
        std::destroy(local() + n, local() + count_);
        count_ = n;
      }
      return;
    }
    reserve(n);
    while (size() < n) emplace_back();
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
  // Leaves the vector empty and in place (a spilled one keeps its heap buffer).
  void clear() {
    if (on_heap_) {
      heap_.clear();
      return;
    }
    std::destroy_n(local(), count_);
    count_ = 0;
  }

 private:
  T* local() { return std::launder(reinterpret_cast<T*>(storage_)); }
  const T* local() const { return std::launder(reinterpret_cast<const T*>(storage_)); }

  template <class It>
  void append(It first, It last) {
    reserve(static_cast<std::size_t>(last - first));
    for (; first != last; ++first) emplace_back(*first);
  }
  // Moves `other`'s elements here (this one is empty) and leaves `other` empty.
  void take(InlineVector& other) noexcept {
    if (other.on_heap_) {
      heap_ = std::move(other.heap_);
      on_heap_ = true;
      other.heap_.clear();
      return;
    }
    for (T& value : other) emplace_back(std::move(value));
    other.clear();
  }
  // Moves the elements in place to heap_, with room for `capacity`.
  void spill(std::size_t capacity) {
    heap_.reserve(capacity);
    for (std::size_t i = 0; i < count_; ++i) heap_.push_back(std::move(local()[i]));
    std::destroy_n(local(), count_);
    count_ = 0;
    on_heap_ = true;
  }

  alignas(T) std::byte storage_[N * sizeof(T)];
  std::size_t count_ = 0;  // Elements in storage_ (while !on_heap_).
  bool on_heap_ = false;
  std::vector<T> heap_;
};

}  // namespace tutti::base

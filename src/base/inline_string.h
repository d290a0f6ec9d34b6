// SPDX-License-Identifier: Apache-2.0
// A string that keeps up to 31 characters inside its own 32 bytes: an op's name, copied from the
// submission into the request list, the coordinator's records and the response, then costs no
// allocation where it would as a std::string (which keeps 15).
#pragma once

#include <compare>
#include <cstddef>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace tutti::base {

// Note [Names in place]
// An op's name is copied on every rank into the list of requests a cycle sends and out of the
// response that runs it, and on rank 0 also out of each rank's request and into the response.
// A name longer than the 15 characters std::string keeps in place (every automatic name,
// "allreduce.noname.17" in API.md's form, and most parameters' names, "layer3.0.conv1.weight")
// made each copy an allocation, some freed on another thread than made them (glibc malloc's
// slow case): at 10,000 one-float unnamed ops a step, 2 ranks, rank 0 allocated 6 small blocks
// per op and rank 1 4, against 1 each with names of 6 to 9 characters, and the step took 1.3
// times as long (examples/BENCHMARK_LOG.md, fifty-first round). Here a name of up to 31
// characters is copied with its 32 bytes, the size of a std::string, and those ops allocate as
// the short-named ones do; a longer name lives on the heap, one allocation a copy as before.
//
// Layout: in place, bytes_[0, size) are the characters, bytes_[size] is '\0', and the last
// byte holds 31 - size, which is itself the terminator at 31 characters. On the heap, the last
// byte is kOnHeap and the first 16 hold the buffer's pointer and the size.
class InlineString {
 public:
  static constexpr std::size_t kInPlace = 31;

  InlineString() noexcept { set_in_place(0); }
  // Implicit, like std::string's: names arrive as std::string, views and literals.
  // NOLINTBEGIN(google-explicit-constructor)
  InlineString(std::string_view s) { init(s); }
  InlineString(const std::string& s) { init(s); }
  InlineString(const char* s) { init(std::string_view(s)); }
  // NOLINTEND(google-explicit-constructor)
  InlineString(const InlineString& other) {
    if (other.on_heap()) {
      init(other.view());
    } else {
      std::memcpy(bytes_, other.bytes_, sizeof bytes_);
    }
  }
  InlineString(InlineString&& other) noexcept {
    std::memcpy(bytes_, other.bytes_, sizeof bytes_);
    other.set_in_place(0);
  }
  InlineString& operator=(const InlineString& other) {
    if (this != &other) assign(other.view());
    return *this;
  }
  InlineString& operator=(InlineString&& other) noexcept {
    if (this != &other) {
      release();
      std::memcpy(bytes_, other.bytes_, sizeof bytes_);
      other.set_in_place(0);
    }
    return *this;
  }
  InlineString& operator=(std::string_view s) {
    assign(s);
    return *this;
  }
  InlineString& operator=(const std::string& s) { return *this = std::string_view(s); }
  InlineString& operator=(const char* s) { return *this = std::string_view(s); }
  ~InlineString() { release(); }

  // `s` may be a part of this string: its characters are moved in (memmove) before the heap
  // buffer they may be in is freed. One call for a name in place, the common case (every op's
  // submission assigns its name).
  void assign(std::string_view s) {
    const char* const old_heap = on_heap() ? heap_data() : nullptr;
    if (s.size() <= kInPlace) {
      if (!s.empty()) std::memmove(bytes_, s.data(), s.size());
      set_in_place(s.size());
    } else {
      set_heap(allocate(s), s.size());
    }
    delete[] old_heap;
  }

  std::size_t size() const noexcept {
    return on_heap() ? heap_size() : kInPlace - static_cast<unsigned char>(bytes_[kInPlace]);
  }
  bool empty() const noexcept { return size() == 0; }
  const char* data() const noexcept { return on_heap() ? heap_data() : bytes_; }
  const char* c_str() const noexcept { return data(); }
  const char* begin() const noexcept { return data(); }
  const char* end() const noexcept { return data() + size(); }
  std::string_view view() const noexcept { return {data(), size()}; }
  // Implicit, as std::string's: a name goes wherever a view of one does.
  // NOLINTNEXTLINE(google-explicit-constructor)
  operator std::string_view() const noexcept { return view(); }
  std::string str() const { return std::string(view()); }

  // One overload per kind of text, so that none needs a conversion (which could go to either
  // InlineString or std::string_view, an ambiguity) or makes a temporary InlineString.
  friend bool operator==(const InlineString& a, const InlineString& b) noexcept {
    return a.view() == b.view();
  }
  friend bool operator==(const InlineString& a, std::string_view b) noexcept {
    return a.view() == b;
  }
  friend bool operator==(const InlineString& a, const std::string& b) noexcept {
    return a.view() == std::string_view(b);
  }
  friend bool operator==(const InlineString& a, const char* b) noexcept {
    return a.view() == std::string_view(b);
  }
  friend std::strong_ordering operator<=>(const InlineString& a, const InlineString& b) noexcept {
    return a.view() <=> b.view();
  }
  friend std::strong_ordering operator<=>(const InlineString& a, std::string_view b) noexcept {
    return a.view() <=> b;
  }
  friend std::strong_ordering operator<=>(const InlineString& a, const std::string& b) noexcept {
    return a.view() <=> std::string_view(b);
  }
  friend std::strong_ordering operator<=>(const InlineString& a, const char* b) noexcept {
    return a.view() <=> std::string_view(b);
  }
  friend std::ostream& operator<<(std::ostream& out, const InlineString& s) {
    return out << s.view();
  }

 private:
  static constexpr unsigned char kOnHeap = 0xFF;

  bool on_heap() const noexcept { return static_cast<unsigned char>(bytes_[kInPlace]) == kOnHeap; }
  const char* heap_data() const noexcept {
    const char* data;
    std::memcpy(&data, bytes_, sizeof data);
    return data;
  }
  std::size_t heap_size() const noexcept {
    std::size_t size;
    std::memcpy(&size, bytes_ + sizeof(char*), sizeof size);
    return size;
  }
  // Nothing for an empty view, whose data() may be null: memcpy()'s arguments must not be, even
  // for 0 bytes (UndefinedBehaviorSanitizer reports it).
  static void copy_chars(char* to, std::string_view s) noexcept {
    if (!s.empty()) std::memcpy(to, s.data(), s.size());
  }
  void init(std::string_view s) {
    if (s.size() <= kInPlace) {
      copy_chars(bytes_, s);
      set_in_place(s.size());
    } else {
      set_heap(allocate(s), s.size());
    }
  }
  static char* allocate(std::string_view s) {
    char* buffer = new char[s.size() + 1];
    std::memcpy(buffer, s.data(), s.size());
    buffer[s.size()] = '\0';
    return buffer;
  }
  void set_in_place(std::size_t size) noexcept {
    bytes_[size] = '\0';
    bytes_[kInPlace] = static_cast<char>(kInPlace - size);
  }
  void set_heap(char* data, std::size_t size) noexcept {
    std::memcpy(bytes_, &data, sizeof data);
    std::memcpy(bytes_ + sizeof data, &size, sizeof size);
    bytes_[kInPlace] = static_cast<char>(kOnHeap);
  }
  void release() noexcept {
    if (on_heap()) delete[] heap_data();
  }

  alignas(8) char bytes_[kInPlace + 1];
};

}  // namespace tutti::base

template <>
struct std::hash<tutti::base::InlineString> {
  std::size_t operator()(const tutti::base::InlineString& s) const noexcept {
    return std::hash<std::string_view>()(s.view());
  }
};

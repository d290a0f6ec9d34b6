// SPDX-License-Identifier: Apache-2.0
// ByteWriter and ByteReader: a small binary format for the bytes of broadcast_object(),
// allgather_object() and the like. Tutti's own messages, the optimizer state broadcast and the
// RPC agent's frames use it too. Header-only.
//
// Format: values in the machine's native byte order and size (every rank of a job runs the
// same build on the same architecture); a string or vector is its element count as a uint64
// followed by its elements. Reading is bounds-checked: a short, truncated or corrupt input
// makes the reader fail (ok() false) and every later read fail too; it never reads past the
// end or allocates more than the input could hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace tutti {

// Appends values to a byte string. Not thread-safe; one writer per thread.
class ByteWriter {
 public:
  ByteWriter() = default;
  // Tutti addition: writes into `buffer`, emptied first; its room is kept, so a writer given a
  // buffer with room for everything it writes allocates nothing.
  explicit ByteWriter(std::string buffer) : bytes_(std::move(buffer)) { bytes_.clear(); }

  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& value) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &value, sizeof(T));
  }
  // `size` raw bytes, without a count (the reader must know how many to take).
  void put_bytes(const void* data, std::size_t size) {
    if (size > 0) bytes_.append(static_cast<const char*>(data), size);
  }
  void put_string(std::string_view s) {
    put<std::uint64_t>(s.size());
    bytes_.append(s);
  }
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put_vector(const std::vector<T>& values) {
    put<std::uint64_t>(values.size());
    const std::size_t at = bytes_.size();
    bytes_.resize(at + values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(bytes_.data() + at, values.data(), values.size() * sizeof(T));
  }

  // Room for `size` bytes in all, so that a writer of known size allocates once.
  void reserve(std::size_t size) { bytes_.reserve(size); }
  const std::string& bytes() const { return bytes_; }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// Reads values written by ByteWriter, in the same order. `bytes` must outlive the reader.
// Each get returns false (and the reader fails) if the input does not hold the value.
class ByteReader {
 public:
  explicit ByteReader(std::string_view bytes) : bytes_(bytes) {}

  template <class T>
  requires std::is_trivially_copyable_v<T>
  bool get(T* value) {
    if (failed_ || remaining() < sizeof(T)) return fail();
    std::memcpy(value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  // An enumerator stored as a uint8 below `count` (the number of enumerators).
  template <class E>
  requires std::is_enum_v<E>
  bool get_enum(E* value, int count) {
    std::uint8_t raw = 0;
    if (!get(&raw)) return false;
    if (raw >= count) return fail();
    *value = static_cast<E>(raw);
    return true;
  }
  // A count of elements that each take at least `element_bytes` of the rest of the input, and
  // at most `max_count`: anything else is corrupt.
  bool get_count(std::size_t* count, std::size_t element_bytes,
                 std::uint64_t max_count = UINT64_MAX) {
    std::uint64_t n = 0;
    if (!get(&n)) return false;
    if (n > max_count || (element_bytes > 0 && n > remaining() / element_bytes)) return fail();
    *count = static_cast<std::size_t>(n);
    return true;
  }
  // `size` raw bytes written by put_bytes().
  bool get_bytes(void* data, std::size_t size) {
    if (failed_ || remaining() < size) return fail();
    if (size > 0) std::memcpy(data, bytes_.data() + at_, size);
    at_ += size;
    return true;
  }
  bool get_string(std::string* s) {
    std::string_view view;
    if (!get_string_view(&view)) return false;
    s->assign(view);
    return true;
  }
  // A string written by put_string(), seen in place: valid while the reader's bytes are.
  bool get_string_view(std::string_view* s) {
    std::size_t n = 0;
    if (!get_count(&n, 1)) return false;
    *s = bytes_.substr(at_, n);
    at_ += n;
    return true;
  }
  template <class T>
  requires std::is_trivially_copyable_v<T>
  bool get_vector(std::vector<T>* values) {
    std::size_t n = 0;
    if (!get_count(&n, sizeof(T))) return false;
    values->resize(n);
    if (n > 0) std::memcpy(values->data(), bytes_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return true;
  }

  bool ok() const { return !failed_; }
  // Everything was read, without error.
  bool done() const { return !failed_ && at_ == bytes_.size(); }
  std::size_t remaining() const { return bytes_.size() - at_; }
  // Marks the input corrupt, for a caller whose own check of a value failed: every later read
  // fails. Returns false, so that `return reader.fail();` reads naturally.
  bool fail() {
    failed_ = true;
    return false;
  }

 private:
  std::string_view bytes_;
  std::size_t at_ = 0;
  bool failed_ = false;
};

}  // namespace tutti

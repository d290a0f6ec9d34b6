// SPDX-License-Identifier: Apache-2.0
// Large byte buffers kept for reuse (Note [Byte buffers kept for reuse] in
// src/common/byte_buffers.h): a buffer given back is taken again for a size it has room for
// (with at most a quarter to spare), only while the host memory cache's capacity allows, at most
// kMaxBuffers of them, the oldest leaving first; small ones are never kept.
#include "src/common/byte_buffers.h"

#include <cstddef>
#include <string>

#include <catch2/catch.hpp>

#include "src/base/host_memory_cache.h"

using tutti::base::kMinCachedBytes;
using tutti::base::set_host_cache_capacity;
using tutti::detail::give_back_byte_buffer;
using tutti::detail::kept_byte_buffers;
using tutti::detail::kMaxBuffers;
using tutti::detail::release_byte_buffers;
using tutti::detail::take_byte_buffer;

// A namespace of its own: the test build compiles this file in one unit with others (unity),
// where another file's kMiB or CapacityForTest would clash.
namespace byte_buffers_test {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Sets the capacity for one test case and leaves the pool empty and the cache off after it.
struct PoolCapacityForTest {
  explicit PoolCapacityForTest(std::size_t bytes) {
    release_byte_buffers();
    set_host_cache_capacity(bytes);
  }
  ~PoolCapacityForTest() {
    set_host_cache_capacity(0);
    release_byte_buffers();
  }
};

// Where a buffer's bytes are (Catch would compare a char pointer as a string).
const void* at(const std::string& buffer) { return buffer.data(); }

// Gives back a buffer of `bytes` and returns where its bytes were.
const void* give_back_new(std::size_t bytes) {
  std::string buffer = take_byte_buffer(bytes);
  const void* data = at(buffer);
  give_back_byte_buffer(std::move(buffer));
  return data;
}

TEST_CASE("A buffer given back is taken again for a size it has room for", "[byte_buffers]") {
  const PoolCapacityForTest capacity(64 * kMiB);
  const void* data = give_back_new(4 * kMiB);
  CHECK(kept_byte_buffers() == 1);
  std::string again = take_byte_buffer(4 * kMiB - 100);  // A frame a few bytes shorter.
  CHECK(again.size() == 4 * kMiB - 100);
  CHECK(at(again) == data);
  CHECK(kept_byte_buffers() == 0);
  give_back_byte_buffer(std::move(again));
  // A size a quarter and more below the buffer's room, or above it, gets a new one: the kept
  // buffer stays. (Addresses of new buffers prove nothing: malloc may reuse a freed one's.)
  const std::string small = take_byte_buffer(2 * kMiB);
  const std::string large = take_byte_buffer(8 * kMiB);
  CHECK(kept_byte_buffers() == 1);
  CHECK(at(take_byte_buffer(4 * kMiB)) == data);
}

TEST_CASE("A new buffer has the size asked for and room up to its size class", "[byte_buffers]") {
  const PoolCapacityForTest capacity(64 * kMiB);
  const std::string buffer = take_byte_buffer(4 * kMiB + 1);
  CHECK(buffer.size() == 4 * kMiB + 1);
  CHECK(buffer.capacity() >= 4 * kMiB + kMiB / 2);  // The next eighth of 4 MiB.
  CHECK(buffer.find_first_not_of('\0') == std::string::npos);
}

TEST_CASE("Buffers are kept only while the capacity allows, kMaxBuffers at most",
          "[byte_buffers]") {
  SECTION("capacity 0 keeps none") {
    const PoolCapacityForTest capacity(0);
    give_back_new(4 * kMiB);
    CHECK(kept_byte_buffers() == 0);
  }
  SECTION("small buffers are malloc's") {
    const PoolCapacityForTest capacity(64 * kMiB);
    give_back_new(kMinCachedBytes / 2);
    CHECK(kept_byte_buffers() == 0);
  }
  SECTION("the oldest leaves first past kMaxBuffers") {
    const PoolCapacityForTest capacity(64 * kMiB);
    give_back_new(1 * kMiB);
    for (std::size_t i = 1; i <= kMaxBuffers; ++i) give_back_new((i + 1) * kMiB);
    CHECK(kept_byte_buffers() == kMaxBuffers);
    const std::string first = take_byte_buffer(1 * kMiB);  // Gone: not served from the pool.
    CHECK(kept_byte_buffers() == kMaxBuffers);
    const std::string second = take_byte_buffer(2 * kMiB);  // Kept: served from the pool.
    CHECK(kept_byte_buffers() == kMaxBuffers - 1);
  }
  SECTION("past the capacity in bytes the oldest leaves") {
    const PoolCapacityForTest capacity(10 * kMiB);
    give_back_new(4 * kMiB);
    give_back_new(5 * kMiB);
    CHECK(kept_byte_buffers() == 2);
    give_back_new(3 * kMiB);  // 4 + 5 + 3 MiB of room: the first goes.
    CHECK(kept_byte_buffers() == 2);
    give_back_new(16 * kMiB);  // Larger than the capacity: not kept; the others stay.
    CHECK(kept_byte_buffers() == 2);
  }
  SECTION("release frees them all") {
    const PoolCapacityForTest capacity(64 * kMiB);
    give_back_new(4 * kMiB);
    give_back_new(8 * kMiB);
    release_byte_buffers();
    CHECK(kept_byte_buffers() == 0);
  }
}

}  // namespace byte_buffers_test

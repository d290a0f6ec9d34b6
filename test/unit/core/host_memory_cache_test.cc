// SPDX-License-Identifier: Apache-2.0
// The host memory cache (Note [Host memory cache] in src/base/host_memory_cache.h): freed large
// blocks are handed out again for their size class, only up to the capacity, the least
// recently freed leaving first, and nothing is kept at capacity 0.
#include "src/base/host_memory_cache.h"

#include <tutti/tensor.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include <catch2/catch.hpp>

#if defined(TUTTI_ADDRESS_SANITIZER)
#include <sanitizer/asan_interface.h>
#endif

using tutti::base::allocate_host;
using tutti::base::host_cache_stats;
using tutti::base::kMinCachedBytes;
using tutti::base::set_host_cache_capacity;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Sets the capacity for one test case and leaves the cache empty and off after it.
struct CapacityForTest {
  explicit CapacityForTest(std::size_t bytes) {
    set_host_cache_capacity(0);
    set_host_cache_capacity(bytes);
  }
  ~CapacityForTest() { set_host_cache_capacity(0); }
};

// The address of a fresh block of `bytes`, which is freed again before this returns.
std::uintptr_t address_of_block(std::size_t bytes) {
  const std::shared_ptr<void> block = allocate_host(bytes);
  return reinterpret_cast<std::uintptr_t>(block.get());
}

}  // namespace

TEST_CASE("a freed large block serves the next request of its size class", "[host_cache]") {
  const CapacityForTest capacity(64 * kMiB);
  const auto before = host_cache_stats();
  std::shared_ptr<void> first = allocate_host(kMiB);
  REQUIRE(reinterpret_cast<std::uintptr_t>(first.get()) % 64 == 0);
  std::memset(first.get(), 0x5a, kMiB);  // The whole request is writable.
  void* const address = first.get();
  first.reset();
  CHECK(host_cache_stats().cached_bytes >= kMiB);
  // Classes are an eighth of a power of two wide: 1 MiB and a little more share one.
  const std::shared_ptr<void> again = allocate_host(kMiB + 4096);
  CHECK(again.get() == address);
  CHECK(host_cache_stats().cached_bytes == 0);
  const auto after = host_cache_stats();
  CHECK(after.hits == before.hits + 1);
  CHECK(after.misses == before.misses + 1);
  // A request of another class gets other memory while that block is in use.
  const std::shared_ptr<void> larger = allocate_host(2 * kMiB);
  CHECK(larger.get() != address);
}

TEST_CASE("blocks below the threshold and at capacity 0 are not kept", "[host_cache]") {
  SECTION("small blocks") {
    const CapacityForTest capacity(64 * kMiB);
    const auto before = host_cache_stats();
    static_cast<void>(address_of_block(kMinCachedBytes / 2));
    CHECK(host_cache_stats().cached_bytes == 0);
    CHECK(host_cache_stats().misses == before.misses);  // Not even looked up.
  }
  SECTION("capacity 0") {
    const CapacityForTest capacity(0);
    static_cast<void>(address_of_block(4 * kMiB));
    CHECK(host_cache_stats().cached_bytes == 0);
  }
  SECTION("a block larger than the capacity") {
    const CapacityForTest capacity(kMiB);
    static_cast<void>(address_of_block(4 * kMiB));
    CHECK(host_cache_stats().cached_bytes == 0);
  }
}

TEST_CASE("past the capacity the least recently freed blocks go first", "[host_cache]") {
  // Room for two 1 MiB blocks (a 1 MiB request takes the class just above 1 MiB).
  const CapacityForTest capacity(3 * kMiB);
  std::shared_ptr<void> a = allocate_host(kMiB);
  std::shared_ptr<void> b = allocate_host(kMiB);
  std::shared_ptr<void> c = allocate_host(kMiB);
  void* const a_address = a.get();
  void* const b_address = b.get();
  void* const c_address = c.get();
  a.reset();
  b.reset();
  c.reset();  // Evicts a.
  const std::size_t cached = host_cache_stats().cached_bytes;
  CHECK(cached > 2 * kMiB);
  CHECK(cached <= 3 * kMiB);
  // The most recently freed comes back first; a is gone, so the third request misses.
  const std::shared_ptr<void> first = allocate_host(kMiB);
  const std::shared_ptr<void> second = allocate_host(kMiB);
  CHECK(first.get() == c_address);
  CHECK(second.get() == b_address);
  const auto before = host_cache_stats();
  const std::shared_ptr<void> third = allocate_host(kMiB);
  CHECK(host_cache_stats().misses == before.misses + 1);
  static_cast<void>(a_address);
}

TEST_CASE("lowering the capacity frees the cached blocks at once", "[host_cache]") {
  const CapacityForTest capacity(64 * kMiB);
  static_cast<void>(address_of_block(4 * kMiB));
  static_cast<void>(address_of_block(8 * kMiB));
  CHECK(host_cache_stats().cached_bytes >= 12 * kMiB);
  set_host_cache_capacity(8 * kMiB + kMiB);  // The 8 MiB block, freed last, stays.
  CHECK(host_cache_stats().cached_bytes >= 8 * kMiB);
  CHECK(host_cache_stats().cached_bytes < 12 * kMiB);
  set_host_cache_capacity(0);
  CHECK(host_cache_stats().cached_bytes == 0);
}

TEST_CASE("Tensor::empty's large storage comes from the cache", "[host_cache]") {
  const CapacityForTest capacity(64 * kMiB);
  void* address = nullptr;
  {
    const tutti::Tensor t = tutti::Tensor::empty(tutti::DataType::Float32, {1024, 1024});
    address = t.data();
  }
  const auto before = host_cache_stats();
  const tutti::Tensor u = tutti::Tensor::empty(tutti::DataType::Int32, {512, 2048});
  CHECK(u.data() == address);
  CHECK(host_cache_stats().hits == before.hits + 1);
}

#if defined(TUTTI_ADDRESS_SANITIZER)
TEST_CASE("under AddressSanitizer a cached block reads as freed until handed out", "[host_cache]") {
  const CapacityForTest capacity(64 * kMiB);
  std::shared_ptr<void> block = allocate_host(kMiB);
  auto* const first_byte = static_cast<char*>(block.get());
  CHECK(__asan_address_is_poisoned(first_byte) == 0);
  block.reset();
  CHECK(__asan_address_is_poisoned(first_byte) != 0);
  CHECK(__asan_address_is_poisoned(first_byte + kMiB - 1) != 0);
  const std::shared_ptr<void> again = allocate_host(kMiB);
  REQUIRE(again.get() == first_byte);
  CHECK(__asan_address_is_poisoned(first_byte + kMiB - 1) == 0);
}
#endif

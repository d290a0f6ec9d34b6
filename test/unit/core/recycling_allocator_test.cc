// SPDX-License-Identifier: Apache-2.0
// RecyclingAllocator: a thread's freed blocks come back to its next allocations, at most
// kKeptBlocks of them, and no more than the thread once had out beyond kMinKept; arrays do not;
// shared_ptr's blocks use it.
// Kept blocks left at a thread's exit are LeakSanitizer's to report in the sanitizer suites.
#include "src/base/recycling_allocator.h"

#include <cstdint>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::base {
namespace {

// Each test case has a type of its own, so that blocks another case kept do not count here.
template <int Case>
struct Block {
  std::int64_t values[6] = {};
};
struct alignas(64) Wide {
  double values[16] = {};
};

template <class T>
using Alloc = RecyclingAllocator<T>;

TEST_CASE("A freed block is the thread's next allocation", "[recycling_allocator]") {
  using T = Block<1>;
  Alloc<T> alloc;
  REQUIRE(Alloc<T>::kept_blocks() == 0);
  T* first = alloc.allocate(1);
  T* second = alloc.allocate(1);
  REQUIRE(first != second);
  alloc.deallocate(first, 1);
  alloc.deallocate(second, 1);
  CHECK(Alloc<T>::kept_blocks() == 2);
#if defined(TUTTI_ADDRESS_SANITIZER)
  CHECK(__asan_address_is_poisoned(first));  // A use after free is still reported.
#endif
  // Last in, first out: the block freed last is the one most likely still in the cache.
  CHECK(alloc.allocate(1) == second);
  CHECK(alloc.allocate(1) == first);
  CHECK(Alloc<T>::kept_blocks() == 0);
  T* fresh = alloc.allocate(1);  // None kept: a new block.
  CHECK(fresh != first);
  CHECK(fresh != second);
  fresh->values[5] = 7;  // Writable to its end.
  for (T* block : {first, second, fresh}) alloc.deallocate(block, 1);
}

TEST_CASE("A thread keeps at most kKeptBlocks", "[recycling_allocator]") {
  using T = Block<2>;
  Alloc<T> alloc;
  constexpr std::uint32_t kOver = Alloc<T>::kKeptBlocks + 10;
  std::vector<T*> blocks;
  for (std::uint32_t i = 0; i < kOver; ++i) blocks.push_back(alloc.allocate(1));
  for (T* block : blocks) alloc.deallocate(block, 1);
  CHECK(Alloc<T>::kept_blocks() == Alloc<T>::kKeptBlocks);

  // Taken back: distinct blocks, the kept ones first (those freed last), then new ones.
  std::set<T*> again;
  for (std::uint32_t i = 0; i < kOver; ++i) {
    T* block = alloc.allocate(1);
    block->values[0] = i;
    again.insert(block);
  }
  CHECK(again.size() == kOver);
  CHECK(Alloc<T>::kept_blocks() == 0);
  for (T* block : again) alloc.deallocate(block, 1);
}

TEST_CASE("Arrays are not kept", "[recycling_allocator]") {
  using T = Block<3>;
  Alloc<T> alloc;
  T* array = alloc.allocate(4);
  array[3].values[5] = 1;
  alloc.deallocate(array, 4);
  CHECK(Alloc<T>::kept_blocks() == 0);
  T* one = alloc.allocate(1);
  alloc.deallocate(one, 1);
  CHECK(Alloc<T>::kept_blocks() == 1);
  CHECK(alloc.allocate(1) == one);
  alloc.deallocate(one, 1);
}

TEST_CASE("A block freed on another thread is kept there", "[recycling_allocator]") {
  using T = Block<4>;
  Alloc<T> alloc;
  T* made_here = alloc.allocate(1);
  std::uint32_t kept_there = 0;
  std::thread other([&] {
    alloc.deallocate(made_here, 1);
    kept_there = Alloc<T>::kept_blocks();
    // The thread exits with the block kept: its exit frees it (LeakSanitizer checks).
  });
  other.join();
  CHECK(kept_there == 1);
  CHECK(Alloc<T>::kept_blocks() == 0);
}

// Frees its block from a thread_local destructor that runs after the thread's kept blocks
// were freed (it was made before the first of them was kept, so it is destroyed after).
struct LateFree {
  Block<5>* block = nullptr;
  ~LateFree() {
    if (block != nullptr) Alloc<Block<5>>().deallocate(block, 1);
  }
};

TEST_CASE("A block freed after the thread's kept blocks were freed is not kept",
          "[recycling_allocator]") {
  using T = Block<5>;
  std::uint32_t kept_there = 0;
  std::thread other([&kept_there] {
    thread_local LateFree late;
    Alloc<T> alloc;
    late.block = alloc.allocate(1);
    alloc.deallocate(alloc.allocate(1), 1);  // Kept: the thread's kept blocks are set up.
    kept_there = Alloc<T>::kept_blocks();
    // At exit: the kept block is freed, then `late` frees its own; were it kept then, nothing
    // would free it (LeakSanitizer would report it in the sanitizer suites).
  });
  other.join();
  CHECK(kept_there == 1);
}

TEST_CASE("Over-aligned types keep their alignment", "[recycling_allocator]") {
  Alloc<Wide> alloc;
  std::vector<Wide*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(alloc.allocate(1));
  for (Wide* block : blocks) alloc.deallocate(block, 1);
  for (int i = 0; i < 8; ++i) {
    Wide* block = alloc.allocate(1);
    CHECK(reinterpret_cast<std::uintptr_t>(block) % 64 == 0);
    blocks[static_cast<std::size_t>(i)] = block;
  }
  for (Wide* block : blocks) alloc.deallocate(block, 1);
}

TEST_CASE("allocate_shared's blocks come back to the thread", "[recycling_allocator]") {
  using T = Block<6>;
  const T* first = nullptr;
  {
    auto shared = std::allocate_shared<T>(Alloc<T>());
    shared->values[0] = 3;
    first = shared.get();
  }
  // The control block and the object are one block, kept as the last owner let go.
  auto again = std::allocate_shared<T>(Alloc<T>());
  CHECK(again.get() == first);
  CHECK(again->values[0] == 0);  // Constructed afresh.
}

TEST_CASE("An allocator that keeps more blocks keeps them, shared_ptr's blocks too",
          "[recycling_allocator]") {
  // As the coordinator's requests (Note [Requests' blocks kept] in negotiation/coordinator.cc):
  // a batch far larger than the default's 256 made, then freed.
  using T = Block<7>;
  constexpr std::uint32_t kKept = 1000;
  using Many = RecyclingAllocator<T, kKept>;
  static_assert(Many::kKeptBlocks == kKept);
  Many alloc;
  std::vector<T*> blocks;
  for (std::uint32_t i = 0; i < kKept + 50; ++i) blocks.push_back(alloc.allocate(1));
  for (T* block : blocks) alloc.deallocate(block, 1);
  CHECK(Many::kept_blocks() == kKept);
  CHECK(Alloc<T>::kept_blocks() == 0);  // The default's blocks are counted apart.
  for (std::uint32_t i = 0; i < kKept; ++i) CHECK(alloc.allocate(1) == blocks[kKept - 1 - i]);
  CHECK(Many::kept_blocks() == 0);
  for (std::uint32_t i = 0; i < kKept; ++i) alloc.deallocate(blocks[i], 1);

  // shared_ptr rebinds it to its own block type, keeping the count (rebind is spelt out).
  using Shared = RecyclingAllocator<const Block<8>, kKept>;
  const Block<8>* first = nullptr;
  {
    auto shared = std::allocate_shared<const Block<8>>(Shared());
    first = shared.get();
  }
  CHECK(std::allocate_shared<const Block<8>>(Shared()).get() == first);
}

TEST_CASE("A thread keeps as many blocks as it once had out, within its bounds",
          "[recycling_allocator]") {
  using T = Block<9>;
  constexpr std::uint32_t kKept = 1000;
  using Many = RecyclingAllocator<T, kKept>;
  static_assert(Many::kMinKept == 256);
  static_assert(RecyclingAllocator<T, 100>::kMinKept == 100);  // Never above MaxKept.
  static_assert(Alloc<T>::kMinKept == Alloc<T>::kKeptBlocks);  // The default keeps 256 alike.
  Many alloc;
  CHECK(Many::keeps_at_most() == 256);  // Nothing out yet: the floor.

  // A batch of 600 out at once, freed: all kept, and taken back the next time.
  std::vector<T*> blocks;
  for (int i = 0; i < 600; ++i) blocks.push_back(alloc.allocate(1));
  CHECK(Many::keeps_at_most() == 600);
  for (T* block : blocks) alloc.deallocate(block, 1);
  CHECK(Many::kept_blocks() == 600);
  const std::set<T*> first(blocks.begin(), blocks.end());
  for (T*& block : blocks) block = alloc.allocate(1);
  CHECK(std::set<T*>(blocks.begin(), blocks.end()) == first);
  CHECK(Many::kept_blocks() == 0);

  // The peak stays: a smaller batch later still finds them kept. One past the peak is the new
  // peak; past MaxKept it stops there.
  for (int i = 0; i < 500; ++i) blocks.push_back(alloc.allocate(1));
  CHECK(Many::keeps_at_most() == 1000);
  for (T* block : blocks) alloc.deallocate(block, 1);
  CHECK(Many::kept_blocks() == 1000);
  blocks.clear();
  for (int i = 0; i < 1000; ++i) alloc.deallocate(alloc.allocate(1), 1);  // One out at a time.
  CHECK(Many::kept_blocks() == 1000);
  CHECK(Many::keeps_at_most() == 1000);
}

TEST_CASE("A thread that frees blocks others made keeps at most kMinKept",
          "[recycling_allocator]") {
  // The communication thread, for ops whose Handles were dropped before they finished: it makes
  // none of them, and would never reuse more.
  using T = Block<10>;
  using Many = RecyclingAllocator<T, 1000>;
  Many alloc;
  std::vector<T*> blocks;
  for (int i = 0; i < 700; ++i) blocks.push_back(alloc.allocate(1));
  std::uint32_t kept_there = 0;
  std::uint32_t keeps_there = 0;
  std::thread other([&] {
    for (T* block : blocks) alloc.deallocate(block, 1);
    kept_there = Many::kept_blocks();
    keeps_there = Many::keeps_at_most();
  });
  other.join();
  CHECK(kept_there == 256);
  CHECK(keeps_there == 256);
  CHECK(Many::kept_blocks() == 0);
  CHECK(Many::keeps_at_most() == 700);  // This thread had 700 out, and keeps them if it frees them.
}

}  // namespace
}  // namespace tutti::base

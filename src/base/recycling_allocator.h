// SPDX-License-Identifier: Apache-2.0
// RecyclingAllocator: a standard allocator for objects made one at a time at a high rate, that
// keeps the blocks a thread frees for that thread's next allocations (Note [Blocks kept per
// thread]).
//
// Note [Blocks kept per thread]
// Every API op makes one block (its Entry and OpState with shared_ptr's counts: make_entry() in
// src/core/tensor_queue.cc) and frees it when the last of its Handle and the queue lets go,
// nearly always on the thread that holds the Handle, the one that made it. glibc 2.36 takes
// some 150 instructions for that malloc and free even on the fast path of its own per-thread
// cache (its checks against heap corruption), of the ~3,200 a rank spends per op in P3 (10,000
// tiny allreduces a step; callgrind, examples/BENCHMARK_LOG.md twenty-fourth round); past that
// cache's seven blocks of a size, a block of a few hundred bytes goes through the arena's bins,
// which costs more. So the thread that frees a block keeps it, and that thread's next allocation
// of the type takes it back in a few instructions.
//
// How many: as many as the thread has had out at once (made by it and not yet freed by it), at
// least kMinKept (256, or MaxKept if less) and at most MaxKept. A thread that submits a step of
// thousands of ops, then waits for them all, frees them all and takes them all back the next
// step: with 256 kept, P3's 10,000 ops malloc'd 9,744 blocks a step on each rank, and glibc's
// malloc and free took 12.5 % of rank 0's samples; 3.4 % with the blocks kept (a P3 driver, 2 ranks
// on the 2-core AMD EPYC VM of family 26: examples/BENCHMARK_LOG.md, fifty-second round). A thread
// keeps no more than it once used together, so the memory kept is memory the application's peak
// needed anyway, freed as the thread exits. A thread that frees blocks others made and makes few
// itself (the communication thread, for an op whose Handle was dropped before it finished) has a
// peak of few or none and keeps at most kMinKept it may never reuse: a few hundred KB at most. Past
// the bound, and for arrays, blocks go to std::allocator. A block freed after the thread's kept
// blocks were freed (by a later thread_local's destructor) goes straight back. Under
// AddressSanitizer a kept block is poisoned, so a use after free is still reported.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "src/base/asan.h"
#include "src/base/fast_tls.h"

namespace tutti::base {

// `MaxKept`: the most freed blocks of T one thread keeps (a type made in larger batches before
// they are freed keeps more: Note [Requests' blocks kept] in negotiation/coordinator.cc); a
// thread keeps fewer if it never had as many out at once (Note [Blocks kept per thread]).
template <class T, std::uint32_t MaxKept = 256>
class RecyclingAllocator {
 public:
  using value_type = T;
  // Spelt out: std::allocator_traits rebinds only templates whose parameters are all types.
  template <class U>
  struct rebind {
    using other = RecyclingAllocator<U, MaxKept>;
  };

  static constexpr std::uint32_t kKeptBlocks = MaxKept;
  // What a thread may keep whatever it has had out: a thread that only frees keeps this many.
  static constexpr std::uint32_t kMinKept = std::min<std::uint32_t>(256, MaxKept);

  RecyclingAllocator() noexcept = default;
  template <class U>
  RecyclingAllocator(const RecyclingAllocator<U, MaxKept>& /*other*/) noexcept {}  // NOLINT

  // A block for `n` objects of T: one this thread kept when n is 1 and it has one.
  T* allocate(std::size_t n) {
    if (n != 1) return std::allocator<T>().allocate(n);
    Kept& kept = kept_;
    T* made = nullptr;
    if (kept.head != nullptr) {
      FreeBlock* block = kept.head;
      unpoison_memory(block, sizeof(T));
      kept.head = block->next;
      --kept.count;
      made = reinterpret_cast<T*>(block);
    } else {
      made = std::allocator<T>().allocate(1);
    }
    // Counted once made: std::allocator may throw.
    if (++kept.out > kept.peak) kept.peak = kept.out;
    return made;
  }

  // Any thread, for a block from allocate(n) on any thread.
  void deallocate(T* pointer, std::size_t n) noexcept {
    Kept& kept = kept_;
    if (n == 1) --kept.out;
    if (n != 1 || kept.closed || kept.count >= kept.keeps()) {
      std::allocator<T>().deallocate(pointer, n);
      return;
    }
    if (!kept.registered) register_drain(kept);
    auto* block = reinterpret_cast<FreeBlock*>(pointer);
    block->next = kept.head;
    kept.head = block;
    ++kept.count;
    poison_memory(block, sizeof(T));
  }

  // How many blocks of T the calling thread keeps now (for tests).
  static std::uint32_t kept_blocks() { return kept_.count; }
  // The most blocks of T the calling thread would keep now (for tests).
  static std::uint32_t keeps_at_most() { return kept_.keeps(); }

  friend bool operator==(const RecyclingAllocator&, const RecyclingAllocator&) noexcept {
    return true;  // Stateless: any one frees what another allocated.
  }

 private:
  struct FreeBlock {
    FreeBlock* next;
  };
  static_assert(sizeof(T) >= sizeof(FreeBlock) && alignof(T) >= alignof(FreeBlock),
                "a kept block holds the link to the next one");

  // One thread's kept blocks. Trivially destructible, so that it is read without a guard, and
  // still read correctly after the thread's Drain has run (`closed`).
  struct Kept {
    FreeBlock* head = nullptr;
    std::uint32_t count = 0;
    bool registered = false;  // This thread's Drain exists.
    bool closed = false;      // It has run: the thread is exiting; keep nothing more.
    // Blocks this thread made less those it freed (negative if it frees others' blocks), and
    // the most that ever was.
    std::int64_t out = 0;
    std::int64_t peak = 0;
    // The most blocks it keeps now (Note [Blocks kept per thread]).
    std::uint32_t keeps() const {
      return static_cast<std::uint32_t>(std::clamp<std::int64_t>(peak, kMinKept, MaxKept));
    }
  };
  // Frees the thread's kept blocks as it exits.
  struct Drain {
    Drain() {}  // NOLINT(modernize-use-equals-default): user-provided, so that it is not trivial.
    ~Drain() {
      Kept& kept = kept_;
      kept.closed = true;
      while (kept.head != nullptr) {
        FreeBlock* block = kept.head;
        unpoison_memory(block, sizeof(T));
        kept.head = block->next;
        std::allocator<T>().deallocate(reinterpret_cast<T*>(block), 1);
      }
      kept.count = 0;
    }
  };

  // The first block a thread keeps makes its Drain, registered to run as the thread exits.
  static void register_drain(Kept& kept) noexcept {
    static thread_local Drain drain;
    static_cast<void>(drain);
    kept.registered = true;
  }

  // Note [Thread-locals read without a call]: allocate() is on every op's submission path.
  TUTTI_FAST_TLS static inline thread_local Kept kept_;
};

}  // namespace tutti::base

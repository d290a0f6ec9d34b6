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
// tiny allreduces a step; callgrind, examples/BENCHMARK_LOG.md twenty-fourth round). So the
// thread that frees a block keeps it, up to kKeptBlocks per type (256, or the allocator's
// MaxKept), and that thread's next allocation of the type takes it back in a few instructions.
// Past kKeptBlocks, and for arrays, blocks go to std::allocator. A thread that frees blocks
// others made (the communication thread, for an op whose Handle was dropped before it finished)
// keeps at most kKeptBlocks it may never reuse: a few hundred KB at most at the default. A thread's
// kept blocks are freed as it exits; a block freed after that (by a later thread_local's
// destructor) goes straight back. Under AddressSanitizer a kept block is poisoned, so a use after
// free is still reported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "src/base/asan.h"
#include "src/base/fast_tls.h"

namespace tutti::base {

// `MaxKept`: the most freed blocks of T one thread keeps (a type made in larger batches before
// they are freed keeps more: Note [Requests' blocks kept] in negotiation/coordinator.cc).
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

  RecyclingAllocator() noexcept = default;
  template <class U>
  RecyclingAllocator(const RecyclingAllocator<U, MaxKept>& /*other*/) noexcept {}  // NOLINT

  // A block for `n` objects of T: one this thread kept when n is 1 and it has one.
  T* allocate(std::size_t n) {
    Kept& kept = kept_;
    if (n == 1 && kept.head != nullptr) {
      FreeBlock* block = kept.head;
      unpoison_memory(block, sizeof(T));
      kept.head = block->next;
      --kept.count;
      return reinterpret_cast<T*>(block);
    }
    return std::allocator<T>().allocate(n);
  }

  // Any thread, for a block from allocate(n) on any thread.
  void deallocate(T* pointer, std::size_t n) noexcept {
    Kept& kept = kept_;
    if (n != 1 || kept.closed || kept.count >= kKeptBlocks) {
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

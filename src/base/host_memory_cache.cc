// SPDX-License-Identifier: Apache-2.0
#include "src/base/host_memory_cache.h"

#include <bit>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <new>

namespace tutti::base {
namespace {

// 64-byte alignment suits vector loads.
constexpr std::size_t kAlignment = 64;

void* allocate_block(std::size_t bytes) {
  void* block = std::aligned_alloc(kAlignment, bytes);
  if (block == nullptr) throw std::bad_alloc();
  return block;
}

class Cache {
 public:
  // A freed block of `bytes` (a size class), or null when there is none.
  void* take(std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    const auto it = free_.find(bytes);
    if (it == free_.end()) {
      ++misses_;
      return nullptr;
    }
    // The most recently freed: the likeliest to be still in the CPU's caches.
    void* block = it->second.back().block;
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    cached_ -= bytes;
    ++hits_;
    unpoison_memory(block, bytes);
    return block;
  }

  // Keeps `block` of `bytes` (a size class) for reuse, or frees it when it does not fit. Runs
  // in a tensor's deleter, so it does not throw: a block it cannot record is freed.
  void give_back(void* block, std::size_t bytes) noexcept {
    const std::lock_guard lock(mutex_);
    if (bytes > capacity_) {
      std::free(block);
      return;
    }
    try {
      free_[bytes].push_back({block, next_stamp_++});
    } catch (...) {
      std::free(block);
      return;
    }
    poison_memory(block, bytes);
    cached_ += bytes;
    evict_to(capacity_);
  }

  void set_capacity(std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    capacity_ = bytes;
    evict_to(capacity_);
  }

  std::size_t capacity() {
    const std::lock_guard lock(mutex_);
    return capacity_;
  }

  HostCacheStats stats() {
    const std::lock_guard lock(mutex_);
    return {.cached_bytes = cached_, .hits = hits_, .misses = misses_};
  }

 private:
  struct Freed {
    void* block;
    std::uint64_t stamp;  // Order of freeing, across classes.
  };

  // Frees the least recently freed blocks until at most `limit` bytes are cached. A scan of the
  // classes' oldest blocks per eviction: there are a few dozen classes at most.
  void evict_to(std::size_t limit) {
    while (cached_ > limit) {
      auto oldest = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (oldest == free_.end() || it->second.front().stamp < oldest->second.front().stamp) {
          oldest = it;
        }
      }
      void* block = oldest->second.front().block;
      oldest->second.pop_front();
      cached_ -= oldest->first;
      unpoison_memory(block, oldest->first);
      std::free(block);
      if (oldest->second.empty()) free_.erase(oldest);
    }
  }

  std::mutex mutex_;
  std::size_t capacity_ = 0;
  std::size_t cached_ = 0;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
  std::uint64_t next_stamp_ = 0;
  // Freed blocks by size class, each class's in the order freed; a class with none has no entry.
  std::map<std::size_t, std::deque<Freed>> free_;
};

// Never destroyed: tensors that outlive static destruction still give their blocks back to it.
Cache& cache() {
  static Cache* const the_cache = new Cache();
  return *the_cache;
}

}  // namespace

std::size_t size_class(std::size_t bytes) {
  const std::size_t step = std::bit_floor(bytes) / 8;
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<void> allocate_host(std::size_t bytes) {
  // Room for at least one byte, so that data() is never null.
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment + kAlignment;
  if (rounded < kMinCachedBytes) {
    return std::shared_ptr<void>(allocate_block(rounded), [](void* p) { std::free(p); });
  }
  const std::size_t block_bytes = size_class(rounded);
  void* block = cache().take(block_bytes);
  if (block == nullptr) block = allocate_block(block_bytes);
  return std::shared_ptr<void>(block,
                               [block_bytes](void* p) { cache().give_back(p, block_bytes); });
}

void set_host_cache_capacity(std::size_t bytes) { cache().set_capacity(bytes); }

std::size_t host_cache_capacity() { return cache().capacity(); }

HostCacheStats host_cache_stats() { return cache().stats(); }

}  // namespace tutti::base

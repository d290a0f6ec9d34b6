// SPDX-License-Identifier: Apache-2.0
#include "src/common/byte_buffers.h"

#include <deque>
#include <utility>

#include "src/base/host_memory_cache.h"
#include "src/common/mutex.h"

namespace tutti::detail {
namespace {

class Pool {
 public:
  // The kept buffer with the least room of at least `bytes` (and at most a quarter more), or
  // false.
  bool take(std::size_t bytes, std::string* out) TUTTI_EXCLUDES(mutex_) {
    const MutexLock lock(mutex_);
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      const std::size_t room = it->capacity();
      if (room >= bytes && room - bytes <= bytes / 4 &&
          (best == kept_.end() || room < best->capacity())) {
        best = it;
      }
    }
    if (best == kept_.end()) return false;
    kept_bytes_ -= best->capacity();
    *out = std::move(*best);
    kept_.erase(best);
    return true;
  }

  void give_back(std::string buffer, std::size_t limit) TUTTI_EXCLUDES(mutex_) {
    const std::size_t room = buffer.capacity();
    if (room > limit) return;  // Freed on return; the kept ones stay.
    const MutexLock lock(mutex_);
    while (!kept_.empty() && (kept_.size() >= kMaxBuffers || kept_bytes_ + room > limit)) {
      kept_bytes_ -= kept_.front().capacity();
      kept_.pop_front();
    }
    kept_bytes_ += room;
    kept_.push_back(std::move(buffer));
  }

  void release() TUTTI_EXCLUDES(mutex_) {
    std::deque<std::string> freed;
    const MutexLock lock(mutex_);
    freed.swap(kept_);
    kept_bytes_ = 0;
  }

  std::size_t size() TUTTI_EXCLUDES(mutex_) {
    const MutexLock lock(mutex_);
    return kept_.size();
  }

 private:
  Mutex mutex_;
  std::deque<std::string> kept_ TUTTI_GUARDED_BY(mutex_);  // Oldest first.
  std::size_t kept_bytes_ TUTTI_GUARDED_BY(mutex_) = 0;    // Their capacities.
};

// Never destroyed: buffers given back during static destruction still find it.
Pool& pool() {
  static Pool* const the_pool = new Pool();
  return *the_pool;
}

}  // namespace

std::string take_byte_buffer(std::size_t bytes) {
  if (bytes < base::kMinCachedBytes) return std::string(bytes, '\0');
  std::string buffer;
  if (pool().take(bytes, &buffer)) {
    buffer.resize(bytes);  // Shrinks, or zero-fills only what the last user left short.
    return buffer;
  }
  buffer.reserve(base::size_class(bytes));
  buffer.resize(bytes);
  return buffer;
}

void give_back_byte_buffer(std::string buffer) noexcept {
  if (buffer.capacity() < base::kMinCachedBytes) return;
  try {
    pool().give_back(std::move(buffer), base::host_cache_capacity());
  } catch (...) {  // A buffer the pool cannot record is freed.
  }
}

void release_byte_buffers() noexcept { pool().release(); }

std::size_t kept_byte_buffers() { return pool().size(); }

}  // namespace tutti::detail

// SPDX-License-Identifier: Apache-2.0
// The persistent host buffer fused ops are packed into. Grows to the largest batch seen and
// is kept for the session, so steady state allocates nothing. Communication thread only.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace tutti::core {

class FusionBuffer {
 public:
  // At least `bytes` of 64-byte-aligned memory; contents are not preserved across growth.
  std::byte* get(std::size_t bytes) {
    if (bytes > capacity_) {
      capacity_ = (bytes + 4095) / 4096 * 4096;
      memory_.reset(static_cast<std::byte*>(std::aligned_alloc(64, capacity_)));
    }
    return memory_.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> memory_;
  std::size_t capacity_ = 0;
};

}  // namespace tutti::core

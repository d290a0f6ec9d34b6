// SPDX-License-Identifier: Apache-2.0
#include "ops/shm/staging.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tutti::ops::shm {

void stream_copy(void* to, const void* from, std::size_t bytes) {
#if defined(__SSE2__)
  auto* out = static_cast<std::byte*>(to);
  const auto* in = static_cast<const std::byte*>(from);
  // Streaming stores need 16-byte aligned destinations: the head up to the first boundary and
  // the tail past the last whole 64-byte block take ordinary stores.
  const std::size_t misaligned = reinterpret_cast<std::uintptr_t>(out) % 16;
  std::size_t head = misaligned == 0 ? 0 : 16 - misaligned;
  if (head > bytes) head = bytes;
  std::memcpy(out, in, head);
  out += head;
  in += head;
  bytes -= head;
  const std::size_t body = bytes / 64 * 64;
  for (std::size_t i = 0; i < body; i += 64) {
    for (std::size_t j = 0; j < 64; j += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + j),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + j)));
    }
  }
  std::memcpy(out + body, in + body, bytes - body);
  // Streaming stores are weakly ordered, even on x86: without the fence a peer could see the
  // counter published next before the data.
  _mm_sfence();
#else
  std::memcpy(to, from, bytes);
#endif
}

namespace {

// A cost as the board holds it: the collective's number in the high half (so that a reader can
// tell it from an older cost in the same word, or from none) and the nanoseconds per byte as a
// float in the low half. One word, so a reader sees both halves of one write.
std::uint64_t tagged(std::uint64_t n, double per_byte) {
  return (n << 32) | std::bit_cast<std::uint32_t>(static_cast<float>(per_byte));
}

bool untag(std::uint64_t word, std::uint64_t n, double* per_byte) {
  if ((word >> 32) != (n & 0xFFFF'FFFFu)) return false;
  *per_byte = std::bit_cast<float>(static_cast<std::uint32_t>(word));
  return true;
}

}  // namespace

bool StagingChoice::streaming(std::size_t bytes) {
  bool streaming = false;
  if (mode_ == ShmStores::Streaming) {
    streaming = true;
  } else if (measures(bytes)) {
    const std::uint64_t n = measured_++;
    if (n >= kLag && learn(n - kLag)) {
      last_try_ = n;  // A switch measured both kinds lately, and may have been a mistake:
      period_ = kMinExplorePeriod;  // the kind left is tried again soon.
    }
    if (n <= 1) {
      streaming = false;  // The warm-up, then ordinary stores measured once,
    } else if (n == 2) {
      streaming = true;  // and streaming ones.
      last_try_ = n;
    } else if (cost_[0] == 0 || cost_[1] == 0) {
      streaming = use_streaming_;  // Their costs are not in yet.
    } else {
      const std::uint64_t budget = explore_period();
      const bool try_other = n - last_try_ >= std::min(period_, budget);
      if (try_other) {
        last_try_ = n;
        period_ = std::min(2 * period_, budget);
      }
      streaming = try_other ? !use_streaming_ : use_streaming_;
    }
    streamed_at_[n % kBoardWords] = streaming;
  }
  if (streaming) ++streamed_;
  return streaming;
}

void StagingChoice::record(std::size_t bytes, std::chrono::nanoseconds took) {
  if (!measures(bytes) || measured_ == 0) return;
  const std::uint64_t n = measured_ - 1;
  const double per_byte =
      std::max(1e-6, static_cast<double>(took.count()) / static_cast<double>(bytes));
  const std::uint64_t word = tagged(n, per_byte);
  own_[n % kBoardWords] = word;
  if (board_ != nullptr && writes_board_) {
    // Relaxed: what orders it for the readers is the ring's next release (Note [Streaming
    // stores]); and a reader that sees an older word falls back on its own cost.
    std::atomic_ref<std::uint64_t>(board_[n % kBoardWords]).store(word, std::memory_order_relaxed);
  }
}

std::uint64_t StagingChoice::explore_period() const {
  // A try costs `extra` of a collective more than the kind in use would have.
  const double extra = cost_[use_streaming_ ? 0 : 1] / cost_[use_streaming_ ? 1 : 0] - 1;
  return static_cast<std::uint64_t>(std::clamp(std::ceil(extra / kExploreBudget),
                                               static_cast<double>(kMinExplorePeriod),
                                               static_cast<double>(kMaxExplorePeriod)));
}

bool StagingChoice::learn(std::uint64_t n) {
  if (n == 0) return false;  // The warm-up is not learned (Note [Streaming stores]).
  double per_byte = 0;
  const bool on_board =
      board_ != nullptr &&
      untag(std::atomic_ref<std::uint64_t>(board_[n % kBoardWords]).load(std::memory_order_relaxed),
            n, &per_byte);
  if (!on_board) {
    // Every collective has a cost of its own (StagingRun records each); one that had none
    // would better be left out than guessed.
    if (!untag(own_[n % kBoardWords], n, &per_byte)) return false;
    ++own_costs_;
  }
  const bool streaming = streamed_at_[n % kBoardWords];
  // Weight of a new sample of the kind in use: a few collectives' worth of memory, so that one
  // disturbed collective (the rank descheduled) does not switch kinds.
  constexpr double kWeight = 0.25;
  double& cost = cost_[streaming ? 1 : 0];
  cost = (cost == 0 || streaming != use_streaming_) ? per_byte : cost + kWeight * (per_byte - cost);
  // The other kind takes over only when clearly cheaper: collectives of different make-up
  // (many small tensors, pieces of one large one) and the wait for the last rank to arrive
  // scatter the samples, and a switch on that noise would cost a kind's whole difference.
  constexpr double kSwitchRatio = 0.8;
  const double in_use = cost_[use_streaming_ ? 1 : 0];
  const double other = cost_[use_streaming_ ? 0 : 1];
  if (in_use > 0 && other > 0 && other < kSwitchRatio * in_use) {
    use_streaming_ = !use_streaming_;
    return true;
  }
  return false;
}

}  // namespace tutti::ops::shm

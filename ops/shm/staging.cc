// SPDX-License-Identifier: Apache-2.0
#include "ops/shm/staging.h"

#include <algorithm>
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

bool StagingChoice::streaming(std::size_t bytes) {
  bool streaming = false;
  if (mode_ == ShmStores::Streaming) {
    streaming = true;
  } else if (measures(bytes)) {
    const std::uint64_t n = measured_++;
    if (cost_[0] == 0) {
      streaming = false;  // The warm-up, then each kind is measured once.
    } else if (cost_[1] == 0) {
      streaming = true;
    } else {
      const bool far = cost_[use_streaming_ ? 0 : 1] >= 2 * cost_[use_streaming_ ? 1 : 0];
      const std::uint64_t period = far ? kFarExplorePeriod : kExplorePeriod;
      streaming = n % period == 0 ? !use_streaming_ : use_streaming_;
    }
  }
  if (streaming) ++streamed_;
  return streaming;
}

void StagingChoice::record(bool streaming, std::size_t bytes, std::chrono::nanoseconds took) {
  if (!measures(bytes)) return;
  if (!warmed_up_) {  // The warm-up (Note [Streaming stores]): the next one measures again.
    warmed_up_ = true;
    return;
  }
  // Weight of a new sample of the kind in use: a few collectives' worth of memory, so that one
  // disturbed collective (the rank descheduled) does not switch kinds.
  constexpr double kWeight = 0.25;
  const double per_byte =
      std::max(1e-6, static_cast<double>(took.count()) / static_cast<double>(bytes));
  double& cost = cost_[streaming ? 1 : 0];
  cost = (cost == 0 || streaming != use_streaming_) ? per_byte : cost + kWeight * (per_byte - cost);
  // The other kind takes over only when clearly cheaper: collectives of different make-up
  // (many small tensors, pieces of one large one) and the wait for the last rank to arrive
  // scatter the samples, and a switch on that noise would cost a kind's whole difference.
  constexpr double kSwitchRatio = 0.8;
  const double in_use = cost_[use_streaming_ ? 1 : 0];
  const double other = cost_[use_streaming_ ? 0 : 1];
  if (in_use > 0 && other > 0 && other < kSwitchRatio * in_use) use_streaming_ = !use_streaming_;
}

}  // namespace tutti::ops::shm

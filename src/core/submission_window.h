// SPDX-License-Identifier: Apache-2.0
// How far one thread's submissions may run ahead of their completion where the thread shares
// its CPU with the communication thread.
//
// Note [A submitting thread keeps its backlog short]
// Where the communication thread shares a CPU with the submitting thread, it batches by
// yielding while ops keep coming (Note [Batching on a shared CPU] in
// negotiation/request_sender.cc), so a burst of 10,000 tiny ops (P3) went out as one list once
// the submitter waited: every stage then passed over 10,000 ops' records, each pass finding
// them out of the core's cache, and a step cost twice as much per op as one of 1,000 ops. So
// every kChunk pushes, a submitting thread that shares its CPU looks at the op it pushed
// kLagChunks chunks before, and if that op is not done yet, runs the loop's cycle itself (Note
// [A waiting thread runs the cycle] in loop_driver.h) until it is, for at most kMaxWait. The
// ops then move through the stages a few hundred at a time, while their records are still in
// the cache; the CPU does the same work, sooner. The wait is bounded, so ranks that submit in
// different orders (an op may wait for a peer that submits it last) lose at most kMaxWait per
// chunk and never hang. Ops pushed in a burst shorter than the lag never wait. P3's driver
// (10,000 ops a step, 2 ranks each bound to a core of the 2-core AMD EPYC VM): the figures are
// in examples/BENCHMARK_LOG.md, "Issue 26's tenth round".
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <utility>

#include "src/core/op_state.h"

namespace tutti::core {

// One submitting thread's window. Not thread-safe: each thread keeps its own.
class SubmissionWindow {
 public:
  static constexpr int kChunk = 256;
  static constexpr std::size_t kLagChunks = 2;
  static constexpr std::chrono::microseconds kMaxWait{200};

  // Counts a push; true at every kChunk-th, which the caller then marks with mark().
  bool count() {
    if (++pushes_ < kChunk) return false;
    pushes_ = 0;
    return true;
  }
  // Keeps `pushed` (the op of the push count() chose) and returns the op marked kLagChunks marks
  // before, if it is not done yet: the one to wait for. Null otherwise.
  std::shared_ptr<const detail::OpState> mark(std::shared_ptr<const detail::OpState> pushed) {
    std::shared_ptr<const detail::OpState> oldest = std::exchange(marks_[next_], std::move(pushed));
    next_ = (next_ + 1) % kLagChunks;
    if (oldest != nullptr && oldest->done()) oldest.reset();
    return oldest;
  }

 private:
  int pushes_ = 0;
  std::array<std::shared_ptr<const detail::OpState>, kLagChunks> marks_;
  std::size_t next_ = 0;  // The mark to replace next: the oldest.
};

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// Rounds of collectives that several application threads of every rank run at once, each
// thread with ops of its own names, of every size, waited for in and out of order. Values are
// closed forms of rank, thread and round.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/tutti.h"

namespace tutti::test {

// Small integers, exact in float: what `rank` contributes to element `i` of thread `t`'s op in
// round `round`.
inline float round_term(int rank, int t, int round, std::int64_t i) {
  return static_cast<float>(rank + 1 + t + round + static_cast<int>(i % 3));
}

// The allreduce sum of round_term() over `size` ranks.
inline float round_sum(int size, int t, int round, std::int64_t i) {
  return static_cast<float>(size * (size + 1) / 2 + size * (t + round + static_cast<int>(i % 3)));
}

// Sizes from one float to past the default fusion threshold's pieces.
inline std::int64_t round_elements(int round) {
  constexpr std::int64_t kSizes[] = {1, 7, 1000, 70000};
  return kSizes[round % 4];
}

// Thread `t`'s `rounds` rounds on rank `rank` of `size`: a blocking allreduce; every third
// round two async allreduces waited for in reverse order; every fifth an allgather. Makes no
// MPI call of its own. Returns the number of wrong elements.
inline int run_thread_rounds(int rank, int size, int t, int rounds) {
  int wrong = 0;
  const std::string name = "t" + std::to_string(t);
  for (int round = 0; round < rounds; ++round) {
    const std::int64_t n = round_elements(round);
    std::vector<float> a(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      a[static_cast<std::size_t>(i)] = round_term(rank, t, round, i);
    if (round % 3 == 0) {
      std::vector<float> b = a;
      Handle first = allreduce_async(TensorView(a.data(), {n}), name + ".a", {.op = ReduceOp::Sum});
      Handle second =
          allreduce_async(TensorView(b.data(), {n}), name + ".b", {.op = ReduceOp::Sum});
      second.wait();
      first.wait();
      for (std::int64_t i = 0; i < n; ++i)
        wrong += b[static_cast<std::size_t>(i)] != round_sum(size, t, round, i);
    } else {
      allreduce(TensorView(a.data(), {n}), name, {.op = ReduceOp::Sum});
    }
    for (std::int64_t i = 0; i < n; ++i)
      wrong += a[static_cast<std::size_t>(i)] != round_sum(size, t, round, i);
    if (round % 5 == 0) {
      float mine = static_cast<float>(rank * 10 + t);
      const Tensor all = allgather(TensorView(&mine, {1}), name + ".g");
      const auto* got = static_cast<const float*>(all.data());
      for (int r = 0; r < size; ++r) wrong += got[r] != static_cast<float>(r * 10 + t);
    }
  }
  return wrong;
}

}  // namespace tutti::test

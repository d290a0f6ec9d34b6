// SPDX-License-Identifier: Apache-2.0
// Issue 11's first defect, run by mixed_settings_test.py with different TUTTI_FUSION_THRESHOLD
// and TUTTI_CACHE_CAPACITY per rank: two allreduce_async (10 and 20 floats, Max) per step,
// 100 steps. Before Job knobs were agreed at init(), rank 0 died with "double free or
// corruption" or MPI_ERR_TRUNCATE while rank 1 sat in MPI_Allreduce. Exits 1 on a wrong value.
#include <cstdio>
#include <vector>

#include "tutti/tutti.h"

int main() {
  tutti::init();
  const int n = tutti::size();
  int wrong = 0;
  for (int step = 0; step < 100; ++step) {
    // Rank r holds r + step + i: the Max over ranks is n - 1 + step + i.
    std::vector<float> a(10), b(20);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(tutti::rank() + step + i);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(tutti::rank() + step + i);
    tutti::Handle ha = tutti::allreduce_async(tutti::TensorView(a.data(), {10}), "mixed.a",
                                              {.op = tutti::ReduceOp::Max});
    tutti::Handle hb = tutti::allreduce_async(tutti::TensorView(b.data(), {20}), "mixed.b",
                                              {.op = tutti::ReduceOp::Max});
    ha.wait();
    hb.wait();
    for (std::size_t i = 0; i < a.size(); ++i)
      wrong += a[i] != static_cast<float>(n - 1 + step + i);
    for (std::size_t i = 0; i < b.size(); ++i)
      wrong += b[i] != static_cast<float>(n - 1 + step + i);
  }
  std::printf("rank %d: %d wrong values\n", tutti::rank(), wrong);
  tutti::shutdown();
  return wrong == 0 ? 0 : 1;
}

// SPDX-License-Identifier: Apache-2.0
// P3's workload (DESIGN.md section 6): 10,000 tiny named tensors a step, each a one-float
// Sum allreduce, through Tutti (allreduce_async, then all waited) or raw MPI (a per-tensor
// MPI_Allreduce loop). Shared by allreduce_benchmark's P3 and its --recorder mode.
#pragma once

#include <tutti/tutti.h>

#include <string>
#include <vector>

namespace tutti::examples {

class P3Workload {
 public:
  static constexpr int kTensors = 10000;

  P3Workload();

  // One step through Tutti (an initialized session) or raw MPI_Allreduce on MPI_COMM_WORLD, in
  // milliseconds, max over ranks. Collective. Each tensor is 1 before the step (set outside the
  // timing) and must be the number of ranks after it; a step that leaves one otherwise marks the
  // workload wrong().
  double tutti_step_ms();
  double raw_step_ms();

  // Whether any step so far left a sum other than the number of ranks, on any rank. Collective.
  bool wrong() const;

 private:
  void reset();
  void check();

  std::vector<float> values_;
  std::vector<std::string> names_;  // "tiny.<i>": the same names every step (the cache warm).
  std::vector<tutti::Handle> handles_;
  float expected_ = 0;  // The number of ranks.
  bool wrong_ = false;
};

}  // namespace tutti::examples

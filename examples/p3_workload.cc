// SPDX-License-Identifier: Apache-2.0
#include "examples/p3_workload.h"

#include <algorithm>
#include <chrono>

#include <mpi.h>

#include "examples/figures.h"

namespace tutti::examples {

P3Workload::P3Workload() : values_(kTensors, 1.0f), names_(kTensors), handles_(kTensors) {
  for (int i = 0; i < kTensors; ++i) names_[i] = "tiny." + std::to_string(i);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  expected_ = static_cast<float>(size);
}

void P3Workload::reset() { std::fill(values_.begin(), values_.end(), 1.0f); }

void P3Workload::check() {
  // Sums of ones are exact in float32 at any job size this runs at.
  wrong_ = wrong_ || std::any_of(values_.begin(), values_.end(),
                                 [&](float value) { return value != expected_; });
}

double P3Workload::tutti_step_ms() {
  reset();
  MPI_Barrier(MPI_COMM_WORLD);
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  for (int i = 0; i < kTensors; ++i) {
    handles_[i] = tutti::allreduce_async(tutti::TensorView(&values_[i], {1}), names_[i],
                                         {.op = tutti::ReduceOp::Sum});
  }
  for (tutti::Handle& handle : handles_) handle.wait();
  const double ms = max_over_ranks(ms_since(start));
  check();
  return ms;
}

double P3Workload::raw_step_ms() {
  reset();
  MPI_Barrier(MPI_COMM_WORLD);
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  for (float& value : values_)
    MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double ms = max_over_ranks(ms_since(start));
  check();
  return ms;
}

bool P3Workload::wrong() const {
  int mine = wrong_ ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0;
}

}  // namespace tutti::examples

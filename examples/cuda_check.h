// SPDX-License-Identifier: Apache-2.0
// The CUDA examples' error checks (one home: allreduce_benchmark's CUDA build compiles
// fusion_kernel_figures.cc and nccl_reference.cc into one unity translation unit).
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "src/common/status.h"

namespace tutti::examples {

// Throws std::runtime_error naming `what` and the failure, if `code` or `status` is one.
inline void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(code));
}
inline void check(const Status& status, const char* what) {
  if (!status.ok())
    throw std::runtime_error(std::string(what) + " failed: " + std::string(status.message()));
}

}  // namespace tutti::examples

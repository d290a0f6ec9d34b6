// SPDX-License-Identifier: Apache-2.0
// CUDA runtime return codes to Status, naming the failing call and quoting CUDA's message.
#pragma once

#include <cuda_runtime.h>

#include "src/common/status.h"

namespace tutti::ops::cuda {

// OK for cudaSuccess; otherwise Status(Communication) "<call> failed: <message> (<name>)".
// Also clears the runtime's last-error state (cudaGetLastError), so a non-sticky error does
// not resurface from the next unrelated call; a sticky one (a kernel fault) stays with the
// context and fails every later call, which then reports it too.
Status cuda_status(cudaError_t code, const char* call);

}  // namespace tutti::ops::cuda

#define TUTTI_CUDA_RETURN_IF_ERROR(call) \
  TUTTI_RETURN_IF_ERROR(::tutti::ops::cuda::cuda_status((call), #call))

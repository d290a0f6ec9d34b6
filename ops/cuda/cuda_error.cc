// SPDX-License-Identifier: Apache-2.0
#include "ops/cuda/cuda_error.h"

#include <string>

#include "src/base/strings.h"

namespace tutti::ops::cuda {

Status cuda_status(cudaError_t code, const char* call) {
  if (code == cudaSuccess) return Status();
  static_cast<void>(cudaGetLastError());  // Clears the error we are reporting; see the header.
  // Only the function name: the argument list says nothing to a user.
  std::string name(call);
  name = name.substr(0, name.find('('));
  return Status(ErrorCode::Communication,
                detail::str_cat(name, " failed: ", cudaGetErrorString(code), " (",
                                cudaGetErrorName(code), ")"));
}

}  // namespace tutti::ops::cuda

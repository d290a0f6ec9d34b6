// SPDX-License-Identifier: Apache-2.0
#include "ops/nccl/nccl_error.h"

#include <string>

#include "src/base/strings.h"

namespace tutti::ops::nccl {

Status nccl_status(ncclResult_t code, const char* call, ncclComm_t comm) {
  if (code == ncclSuccess || code == ncclInProgress) return Status();
  // Only the function name: the argument list says nothing to a user.
  std::string name(call);
  name = name.substr(0, name.find('('));
  std::string message = detail::str_cat(name, " failed: ", ncclGetErrorString(code));
  // NCCL's detail (which peer, which CUDA call); it may also describe an earlier failure.
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') message = detail::str_cat(message, ": ", detail);
  return Status(ErrorCode::Communication, message);
}

}  // namespace tutti::ops::nccl

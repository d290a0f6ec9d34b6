// SPDX-License-Identifier: Apache-2.0
// NCCL return codes to Status, naming the failing call and quoting NCCL's messages.
#pragma once

#include <nccl.h>

#include "src/common/status.h"

namespace tutti::ops::nccl {

// OK for ncclSuccess (and ncclInProgress, which only non-blocking communicators return);
// otherwise Status(Communication) "<call> failed: <NCCL's text>: <last error detail>".
Status nccl_status(ncclResult_t code, const char* call, ncclComm_t comm = nullptr);

}  // namespace tutti::ops::nccl

#define TUTTI_NCCL_RETURN_IF_ERROR(call) \
  TUTTI_RETURN_IF_ERROR(::tutti::ops::nccl::nccl_status((call), #call))

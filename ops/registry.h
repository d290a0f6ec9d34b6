// SPDX-License-Identifier: Apache-2.0
// What this build contains, and the factories of the backends that exist only in some builds
// (CUDA, NCCL). The only place that tests TUTTI_HAVE_* (STYLE.md 0.4).
#pragma once

#include <cstdint>
#include <memory>

#include "ops/backend.h"
#include "ops/device_ops.h"
#include "src/common/status.h"

namespace tutti::ops {

bool built_with_cuda();
bool built_with_nccl();

// Which backend runs a set's collectives over CUDA buffers.
enum class DeviceBackendKind : std::uint8_t {
  // NCCL if built and every member of the set has a GPU of its own, else host-staged MPI.
  Auto,
  Nccl,        // NCCL or an error.
  HostStaged,  // MPI over page-locked host copies: works with ranks sharing a GPU.
};

// Backends for CUDA buffers over the set of `host_backend` (that set's MPI backend, which
// bootstraps NCCL and runs the host-staged collectives; it must outlive the result). Their
// calls take device pointers on `stream.device` and return once the work is enqueued on
// `stream`: record an event there (DeviceOps::record_event) and poll it to learn when the
// result is in place, and poll Backend::async_error() meanwhile. See Note [Stream ordering]
// in ops/cuda/stream.h.
//
// Collective over the set (communication thread, same order on every member): core may create
// them lazily, one per (set, device, stream index), when the first device op of that set
// reaches that stream, since the op sequence is the same on every member. Every member gets
// the same kind of backend, or the same error.
//
// create_device_backend picks by `kind`: NCCL needs a GPU per rank (NCCL refuses two ranks on
// one device), decided from the GPUs' UUIDs gathered over the set, so ranks sharing a GPU get
// the host-staged backend. InvalidArgument "this build has no CUDA" / "this build has no NCCL"
// when the build lacks what is asked for.
Result<std::unique_ptr<Backend>> create_device_backend(
    Backend& host_backend, DeviceStream stream, DeviceBackendKind kind = DeviceBackendKind::Auto);
Result<std::unique_ptr<Backend>> create_nccl_backend(Backend& host_backend, DeviceStream stream);
// Local: communicates nothing when created.
Result<std::unique_ptr<Backend>> create_host_staged_backend(Backend& host_backend,
                                                            DeviceStream stream);

}  // namespace tutti::ops

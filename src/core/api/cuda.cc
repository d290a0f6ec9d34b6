// SPDX-License-Identifier: Apache-2.0
// tutti/cuda.h: the calling thread's current stream, which core's Session::submit records an
// event on for every op on CUDA tensors (Note [Stream ordering] in ops/cuda/stream.h).
#include "tutti/cuda.h"

#include "ops/device_ops.h"

namespace tutti::cuda {
namespace {

thread_local void* t_current_stream = nullptr;  // nullptr: the legacy default stream.

}  // namespace

void set_current_stream(void* stream) {
  // Checked by the DeviceOps in use: a build without CUDA refuses any stream, a simulated
  // device (tests) knows its own.
  ops::device_ops().check_stream(stream).throw_if_error();
  t_current_stream = stream;
}

void* current_stream() { return t_current_stream; }

StreamGuard::StreamGuard(void* stream) : previous_(t_current_stream) { set_current_stream(stream); }

// The previous stream passed the check when it was set, so restoring it cannot throw.
StreamGuard::~StreamGuard() { t_current_stream = previous_; }

}  // namespace tutti::cuda

// SPDX-License-Identifier: Apache-2.0
// CUDA stream ordering (API.md, third revision): which stream's work an op on CUDA tensors
// waits for. Every build has it; no CUDA type appears here, a stream travels as void*.
#pragma once

#include "tutti/export.h"

namespace tutti::cuda {

// The rule. Every op on CUDA tensors (collectives, rooted ops, broadcasts, grouped ops) waits,
// on the GPU, for the work enqueued before the call on the submitting thread's current stream
// (below), and only then reads its inputs or writes its outputs. The calling thread never
// blocks for it: at the call Tutti records an event on that stream, and its own stream waits
// for the event before the op's first kernel or copy (cudaStreamWaitEvent; Horovod and
// PyTorch's ProcessGroupNCCL do the same). So a tensor written by a kernel, a cudaMemcpy or
// cudaMemcpyAsync on that stream may be submitted at once, without synchronizing anything.
// Work enqueued on other streams is not waited for: record an event there and make the current
// stream wait for it (cudaStreamWaitEvent), or make the producing stream current.
//
// The default current stream is nullptr, the legacy default stream of the tensor's device.
// Work on it waits for every blocking stream (cudaStreamCreate without flags) and covers
// cudaMemcpy and cudaMemset, so code that uses no streams of its own needs nothing more.
// Compiled with --default-stream per-thread, pass cudaStreamPerThread explicitly.
//
// Outputs are complete for any stream when Handle::wait() returns or poll() is true; before
// that, neither read the outputs nor write the inputs from any stream. The stream must belong
// to the device of the op's tensors and outlive the call (the event is recorded during it).
//
// Costs per op on CUDA tensors: one cudaEventRecord on the calling thread (events come from a
// pool, nothing is created per op) and one cudaStreamWaitEvent on Tutti's thread.

// Sets the calling thread's current stream: a cudaStream_t, or nullptr for the legacy default
// stream. Local to the thread; stays until set again. Throws InvalidArgument for a non-null
// stream in a build without CUDA (tutti::cuda_built() is false). Not checked otherwise: a
// stream that is not one of the tensor's device fails the op's call with InvalidArgument.
TUTTI_API void set_current_stream(void* stream);

// The calling thread's current stream; nullptr (the legacy default stream) unless set.
TUTTI_API void* current_stream();

// Sets the calling thread's current stream for a scope and restores the previous one when it
// ends, e.g. around the ops a framework's hook submits with the framework's stream. Not
// copyable; use it on one thread.
class TUTTI_API StreamGuard {
 public:
  // As set_current_stream(stream); throws the same, and then changes nothing.
  explicit StreamGuard(void* stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  void* previous_;
};

}  // namespace tutti::cuda

// SPDX-License-Identifier: Apache-2.0
// Distributed autograd (torch.distributed.autograd, FAST mode): backward passes through graphs
// that cross workers over RPC, with gradients accumulated per context.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tutti/export.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::dist_autograd {

// A distributed autograd context: RAII, and the current context of the thread that created it
// while it lives. Every RPC made inside it (rpc_sync, rpc_async, remote, RRef::to_here), also
// by functions it runs remotely, carries its id; when the arguments or the result hold
// Variables that require grad, both sides record a send/recv pair under the id, through which
// backward() sends gradients back.
//
// Ids are unique across the job: the creating rank in the high bits (id >> 48), a counter in
// the low bits. The destructor releases the context here and on every worker it reached (they
// free their recorded sends and gradients); a call in it that was under way then runs on
// outside it (it could no longer be differentiated) rather than make it again on its callee.
// Not copyable or movable. One context per thread at a time: creating a second while one is
// current throws InvalidArgument. A Context destroyed on another thread than its creator's ends
// all the same, and the creating thread may make a new one. Throws NotInitialized/ShutDown when
// RPC is not running.
class TUTTI_API Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  std::int64_t id() const { return id_; }

 private:
  std::int64_t id_;
  std::int64_t previous_;  // The thread's current context before this one (-1: none).
};

// Runs a backward pass from `roots` (Variables of one element each, seeded with 1, as
// Variable::backward()) through every worker the recorded graph reaches (FAST mode: each worker
// differentiates its part as gradients arrive through its recorded sends, and sends the
// gradients of received tensors back to their senders), and returns when every worker is done.
// Gradients are added to the context on each worker (get_gradient()), not to grad(), and leaf
// hooks do not fire. Tutti keeps graphs after backward (as Variable::backward()), so
// `retain_graph` changes nothing: a second backward() adds the same gradients again.
// Application thread (any thread). Throws InvalidArgument for an unknown context, no roots, or
// a root that has more than one element or does not require grad; an error on any worker fails
// backward() here with that error (naming the worker).
TUTTI_API void backward(std::int64_t context_id, const std::vector<nn::Variable>& roots,
                        bool retain_graph = false);

// The gradient that context `context_id` accumulated on this worker for `leaf` (a copy), or
// zeros of its shape if none. Throws InvalidArgument for an unknown context or an empty leaf.
TUTTI_API Tensor get_gradient(std::int64_t context_id, const nn::Variable& leaf);
// Every leaf of this worker with a gradient in the context, with a copy of that gradient, in no
// particular order.
TUTTI_API std::vector<std::pair<nn::Variable, Tensor>> get_gradients(std::int64_t context_id);

}  // namespace tutti::dist_autograd

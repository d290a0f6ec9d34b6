// SPDX-License-Identifier: Apache-2.0
// Distributed autograd's glue to the engine: send/recv recording and the FAST-mode backward pass.
//
// Note [Distributed autograd]
// Recording (both sides of every RPC made inside a context, see Agent::call/respond):
//  - A request made while the thread's current context is C carries C's id, and the callee runs
//    the function with C current (creating C there on first use), so nested calls are recorded
//    too. A response carries the request's context back.
//  - A sender whose message holds Variables that require grad records a *send* under C: a new
//    autograd message id keeping those Variables (and so their graphs) alive.
//  - The receiver turns each such tensor into the *recv* end: a source node (make_source) whose
//    gradient, once complete, is queued for the sender's send, slot by slot.
// Backward in FAST mode (torch.distributed.autograd's design note):
//  1. backward(C, roots) runs the local engine from the roots (seeded with ones) with a sink that
//     adds leaf gradients to C (run_backward_into: no grad(), no hooks). Recv nodes reached put
//     their gradients in the run's outbox.
//  2. After the local run, the outbox goes out: one "tutti.dist.backward" request per worker,
//     carrying (send id, slot, gradient) entries.
//  3. A worker receiving one runs step 1 from the inputs of those sends, seeded with the
//     gradients, sends its own outbox (step 2), and answers only once all of those answered.
//  4. So backward() returns when every worker the graph reaches is done; the first error
//     anywhere fails it.
// Each run differentiates only what its seeds reach, and a send's inputs may be reached by
// several runs (one per gradient that arrives); by linearity the contributions add up to the
// gradient of the whole graph in the context. Graphs are kept (as Variable::backward does), so
// retain_graph has nothing to free.
#pragma once

#include <cstdint>
#include <vector>

#include "src/common/status.h"
#include "src/dist_autograd/dist_context.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::rpc::detail {
class Agent;
}  // namespace tutti::rpc::detail

namespace tutti::dist_autograd::detail {

using rpc::detail::Agent;

// Records the send of `tensors` under `context`; returns its autograd message id, or -1 when no
// tensor requires grad (nothing recorded).
std::int64_t record_send(DistContext& context, const std::vector<nn::Variable>& tensors);
// The recv end of tensor `slot` of send `message_id` made by `sender` in context `context_id`.
nn::Variable make_recv(std::int64_t context_id, int sender, std::int64_t message_id,
                       std::size_t slot, Tensor value);

// dist_autograd::backward() on `agent`: steps 1, 2 and 4 of Note [Distributed autograd].
// InvalidArgument for an unknown context or bad roots; otherwise what failed anywhere.
Status run_backward(Agent& agent, std::int64_t context_id, const std::vector<nn::Variable>& roots);
// Releases context `context_id` here and asks the workers it reached (but `except`) to do so.
void release_context(Agent& agent, std::int64_t context_id, int except = -1);
// "tutti.dist.backward" and "tutti.dist.release".
void register_dist_autograd_handlers(Agent& agent);

}  // namespace tutti::dist_autograd::detail

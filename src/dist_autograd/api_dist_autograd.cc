// SPDX-License-Identifier: Apache-2.0
// The functions of tutti/distributed_autograd.h (Note [Distributed autograd] in dist_engine.h).
#include "src/base/strings.h"
#include "src/dist_autograd/dist_engine.h"
#include "src/rpc/agent.h"
#include "src/rpc/rpc_runtime.h"
#include "tutti/distributed_autograd.h"

namespace tutti::dist_autograd {
namespace {

using ::tutti::detail::str_cat;

std::shared_ptr<detail::DistContext> find_context(rpc::detail::Agent& agent,
                                                  std::int64_t context_id) {
  std::shared_ptr<detail::DistContext> context = agent.contexts().find(context_id);
  if (context == nullptr) {
    throw Error(ErrorCode::InvalidArgument,
                str_cat("no distributed autograd context ", context_id, " on worker '",
                        agent.name(), "' (it ended, or was never created)"));
  }
  return context;
}

}  // namespace

Context::Context() : id_(-1), previous_(-1) {
  std::shared_ptr<rpc::detail::Agent> agent = rpc::detail::current_agent().value_or_throw();
  std::int64_t current = rpc::detail::current_context_id();
  if (current != -1 && agent->contexts().find(current) == nullptr) {
    // Stale: its Context was destroyed on another thread (which cannot reset this thread's id),
    // or the request this thread serves was in a context that has ended since.
    detail::exchange_current_context_id(-1);
    current = -1;
  }
  if (current != -1) {
    throw Error(ErrorCode::InvalidArgument,
                str_cat("distributed autograd context ", current,
                        " is already current on this thread (contexts do not nest)"));
  }
  id_ = agent->contexts().create()->id();
  previous_ = detail::exchange_current_context_id(id_);
}

Context::~Context() {
  if (rpc::detail::current_context_id() == id_) detail::exchange_current_context_id(previous_);
  Result<std::shared_ptr<rpc::detail::Agent>> agent = rpc::detail::current_agent();
  if (agent.ok()) detail::release_context(*agent.value(), id_);
}

void backward(std::int64_t context_id, const std::vector<nn::Variable>& roots, bool retain_graph) {
  static_cast<void>(retain_graph);  // Graphs are always kept: see the header.
  std::shared_ptr<rpc::detail::Agent> agent = rpc::detail::current_agent().value_or_throw();
  detail::run_backward(*agent, context_id, roots).throw_if_error();
}

Tensor get_gradient(std::int64_t context_id, const nn::Variable& leaf) {
  std::shared_ptr<rpc::detail::Agent> agent = rpc::detail::current_agent().value_or_throw();
  std::shared_ptr<detail::DistContext> context = find_context(*agent, context_id);
  if (!leaf.defined())
    throw Error(ErrorCode::InvalidArgument, "get_gradient() of an empty Variable");
  Tensor gradient = context->gradient(nn::detail::node_of(leaf).get());
  if (gradient.data() == nullptr) return Tensor(DataType::Float32, leaf.value().shape());
  return gradient;
}

std::vector<std::pair<nn::Variable, Tensor>> get_gradients(std::int64_t context_id) {
  std::shared_ptr<rpc::detail::Agent> agent = rpc::detail::current_agent().value_or_throw();
  return find_context(*agent, context_id)->gradients();
}

}  // namespace tutti::dist_autograd

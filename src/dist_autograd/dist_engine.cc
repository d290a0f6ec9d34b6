// SPDX-License-Identifier: Apache-2.0
// Distributed autograd: see Note [Distributed autograd] in src/dist_autograd/dist_engine.h.
#include "src/dist_autograd/dist_engine.h"

#include <map>
#include <utility>

#include "src/base/strings.h"
#include "src/nn/autograd_seam.h"
#include "src/rpc/agent.h"

namespace tutti::dist_autograd::detail {
namespace {

using rpc::Message;
using rpc::detail::ByteReader;
using rpc::detail::ByteWriter;
using rpc::detail::FutureState;
using rpc::detail::Incoming;
using rpc::detail::Place;
using ::tutti::detail::str_cat;

// A gradient for slot `slot` of another worker's send `message_id`.
struct Outbound {
  std::int64_t message_id = -1;
  std::uint32_t slot = 0;
  Tensor gradient;
};

// One local engine run of Note [Distributed autograd], current on its thread while it runs.
struct BackwardRun {
  std::int64_t context_id = -1;
  std::map<int, std::vector<Outbound>> outbox;  // By sender.
};
thread_local BackwardRun* t_run = nullptr;

// Steps 1 and 2: the local pass from `roots`, then the gradients owed to other workers.
std::vector<std::shared_ptr<FutureState>> run_local(
    Agent& agent, DistContext& context, const std::vector<nn::detail::RootGradient>& roots) {
  BackwardRun run{.context_id = context.id(), .outbox = {}};
  BackwardRun* previous = std::exchange(t_run, &run);
  try {
    nn::detail::run_backward_into(
        roots, [&context](const std::shared_ptr<nn::detail::VariableImpl>& leaf,
                          const Tensor& gradient) { context.accumulate(leaf, gradient); });
  } catch (...) {
    t_run = previous;
    throw;
  }
  t_run = previous;
  std::vector<std::shared_ptr<FutureState>> futures;
  for (auto& [sender, entries] : run.outbox) {
    ByteWriter meta;
    meta.put<std::int64_t>(context.id());
    meta.put<std::uint64_t>(entries.size());
    Message args;
    for (Outbound& e : entries) {
      meta.put<std::int64_t>(e.message_id);
      meta.put<std::uint32_t>(e.slot);
      args.tensors.emplace_back(std::move(e.gradient));
    }
    futures.push_back(agent.call(sender, "tutti.dist.backward", std::move(args),
                                 agent.default_timeout(),
                                 /*context_id=*/-1, meta.take()));
  }
  return futures;
}

// Step 3 on the receiving worker.
std::shared_ptr<FutureState> handle_backward(Agent& agent, Incoming& request) {
  ByteReader meta(request.meta);
  std::int64_t context_id = -1;
  std::size_t count = 0;
  meta.get(&context_id);
  meta.get_count(&count, sizeof(std::int64_t) + sizeof(std::uint32_t));  // Bounded by the bytes.
  std::vector<std::pair<std::int64_t, std::uint32_t>> slots(count);
  for (auto& [message_id, slot] : slots) {
    meta.get(&message_id);
    meta.get(&slot);
  }
  if (!meta.done() || request.args.tensors.size() != count) {
    return FutureState::ready(Status(ErrorCode::Internal, "corrupt distributed backward request"));
  }
  std::shared_ptr<DistContext> context = agent.contexts().find(context_id);
  if (context == nullptr) {
    return FutureState::ready(
        invalid_argument(str_cat("distributed backward: worker '", agent.name(),
                                 "' has no context ", context_id, " (released already?)")));
  }
  std::vector<nn::detail::RootGradient> roots;
  for (std::size_t i = 0; i < count; ++i) {
    Result<std::shared_ptr<nn::detail::VariableImpl>> input =
        context->send_input(slots[i].first, slots[i].second);
    if (!input.ok()) return FutureState::ready(input.status());
    roots.push_back({std::move(input).value(), request.args.tensors[i].value()});
  }
  try {
    return when_all(run_local(agent, *context, roots));
  } catch (const Error& e) {
    return FutureState::ready(Status(e.code(), str_cat("distributed backward on worker '",
                                                       agent.name(), "' failed: ", e.what())));
  }
}

}  // namespace

std::int64_t record_send(DistContext& context, const std::vector<nn::Variable>& tensors) {
  std::vector<std::shared_ptr<nn::detail::VariableImpl>> inputs(tensors.size());
  bool any = false;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined() || !tensors[i].requires_grad()) continue;
    inputs[i] = nn::detail::node_of(tensors[i]);
    any = true;
  }
  if (!any) return -1;
  // Only this worker looks sends up (by the id the receiver sends back), so the process-wide
  // counter behind make_global_id() is unique enough.
  const std::int64_t message_id = make_global_id(0);
  context.record_send(message_id, std::move(inputs));
  return message_id;
}

nn::Variable make_recv(std::int64_t context_id, int sender, std::int64_t message_id,
                       std::size_t slot, Tensor value) {
  return nn::detail::make_source(std::move(value), [context_id, sender, message_id,
                                                    slot](const Tensor& gradient) {
    BackwardRun* run = t_run;
    if (run == nullptr || run->context_id != context_id) {
      throw Error(
          ErrorCode::InvalidArgument,
          str_cat("this graph holds a tensor received over RPC in distributed autograd context ",
                  context_id, ": differentiate it with dist_autograd::backward(", context_id,
                  ", ...), not with Variable::backward() or in another context"));
    }
    run->outbox[sender].push_back(Outbound{
        .message_id = message_id, .slot = static_cast<std::uint32_t>(slot), .gradient = gradient});
  });
}

Status run_backward(Agent& agent, std::int64_t context_id, const std::vector<nn::Variable>& roots) {
  std::shared_ptr<DistContext> context = agent.contexts().find(context_id);
  if (context == nullptr) {
    return invalid_argument(str_cat("dist_autograd::backward: no context ", context_id,
                                    " on worker '", agent.name(),
                                    "' (it ended, or was never created)"));
  }
  if (roots.empty()) return invalid_argument("dist_autograd::backward: no roots");
  std::vector<nn::detail::RootGradient> seeds;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    const nn::Variable& root = roots[i];
    if (!root.defined() || root.value().num_elements() != 1 || !root.requires_grad()) {
      return invalid_argument(str_cat("dist_autograd::backward: roots[", i,
                                      "] must be a Variable of one element that requires grad"));
    }
    Tensor ones(DataType::Float32, root.value().shape());
    ones.span<float>()[0] = 1.0f;
    seeds.push_back({nn::detail::node_of(root), std::move(ones)});
  }
  std::shared_ptr<FutureState> all;
  try {
    all = when_all(run_local(agent, *context, seeds));
  } catch (const Error& e) {
    return Status(e.code(), e.what());
  }
  const Result<Message>& result = all->wait();
  return result.status();
}

void release_context(Agent& agent, std::int64_t context_id, int except) {
  std::shared_ptr<DistContext> context = agent.contexts().release(context_id);
  if (context == nullptr) return;
  ByteWriter meta;
  meta.put<std::int64_t>(context_id);
  const std::string bytes = meta.take();
  for (int worker : context->workers()) {
    if (worker == agent.rank() || worker == except) continue;
    static_cast<void>(
        agent.call(worker, "tutti.dist.release", {}, agent.default_timeout(), -1, bytes));
  }
}

void register_dist_autograd_handlers(Agent& agent) {
  agent.add_handler("tutti.dist.backward", Place::Pool,
                    [&agent](Incoming& request) { return handle_backward(agent, request); });
  agent.add_handler("tutti.dist.release", Place::RpcThread, [&agent](Incoming& request) {
    ByteReader meta(request.meta);
    std::int64_t context_id = -1;
    meta.get(&context_id);
    if (meta.done()) release_context(agent, context_id, request.source);
    return FutureState::ready(Message{});
  });
}

}  // namespace tutti::dist_autograd::detail

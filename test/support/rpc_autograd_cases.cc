// SPDX-License-Identifier: Apache-2.0
// The shared cases of distributed autograd and rpc::DistributedOptimizer (Note [Shared RPC
// cases] in rpc_cases.h), against the same graphs and optimizers run locally with plain nn and
// optim (the oracles). Every worker is a trainer at once, using the next workers as its remote
// ones.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/rpc/rpc_runtime.h"
#include "test/support/error_of.h"
#include "test/support/rpc_cases.h"
#include "test/support/rpc_functions.h"
#include "tutti/distributed_autograd.h"
#include "tutti/optim.h"

namespace tutti::test {
namespace {

using rpc::Message;
namespace dist = dist_autograd;

Message args(std::vector<nn::Variable> tensors, std::string bytes = {}) {
  return Message{.tensors = std::move(tensors), .rrefs = {}, .bytes = std::move(bytes)};
}

Tensor scalar(float value) { return Tensor::from<float>(std::vector<float>{value}, {1}); }

// The design note's example: t3 = add(t1, t2) on the next worker; loss = sum(t3 * t4) here.
void design_note_example(RpcWorld& world, const Tensor& v1, const Tensor& v2, const Tensor& v4,
                         Problems& p) {
  nn::Variable t1(v1.clone(), true), t2(v2.clone(), true), t4(v4.clone(), true);
  dist::Context context;
  nn::Variable t3 = rpc::rpc_sync(world.peer(1), "add", args({t1, t2})).tensors.at(0);
  nn::Variable loss = nn::sum(t3 * t4);
  dist::backward(context.id(), {loss});
  nn::Variable l1(v1.clone(), true), l2(v2.clone(), true), l4(v4.clone(), true);
  nn::sum((l1 + l2) * l4).backward();
  p.expect_close(max_difference(dist::get_gradient(context.id(), t1), l1.grad()), "example t1");
  p.expect_close(max_difference(dist::get_gradient(context.id(), t2), l2.grad()), "example t2");
  p.expect_close(max_difference(dist::get_gradient(context.id(), t4), l4.grad()), "example t4");
  p.expect_close(max_difference(t1.grad(), Tensor(DataType::Float32, {3, 3})), "grad() untouched");
  p.expect_close(
      max_difference(scalar(float(dist::get_gradients(context.id()).size())), scalar(3.0f)),
      "three gradients");
  // A graph with a recv is not for Variable::backward().
  p.expect_error(error_of([&] { loss.backward(); }), ErrorCode::InvalidArgument,
                 "Variable::backward() of a distributed graph");
}

// Crossing workers twice: x^2 on the next worker, doubled on the one after (this one, in a group
// of two), times x on the next again.
void chain_crossing_twice(RpcWorld& world, const Tensor& v1, const Tensor& v4, Problems& p) {
  nn::Variable x(v1.clone(), true), w(v4.clone(), true);
  dist::Context context;
  nn::Variable r =
      rpc::rpc_sync(world.peer(1), "square_double_times", args({x}, world.peer(2))).tensors.at(0);
  dist::backward(context.id(), {nn::sum(r * w)});
  nn::Variable lx(v1.clone(), true), lw(v4.clone(), true);
  nn::Variable ly = lx * lx;
  nn::sum((ly + ly) * lx * lw).backward();
  p.expect_close(max_difference(dist::get_gradient(context.id(), x), lx.grad()), "chain x");
  p.expect_close(max_difference(dist::get_gradient(context.id(), w), lw.grad()), "chain w");
}

// One tensor in two RPCs (to two workers, or twice to one): its gradients are summed; two roots.
void tensor_sent_twice(RpcWorld& world, const Tensor& v1, const Tensor& v2, Problems& p) {
  nn::Variable x(v1.clone(), true), y(v2.clone(), true);
  dist::Context context;
  nn::Variable a = rpc::rpc_sync(world.peer(1), "add", args({x, y})).tensors.at(0);
  nn::Variable b = rpc::rpc_sync(world.peer(2), "double", args({x})).tensors.at(0);
  dist::backward(context.id(), {nn::sum(a * b), nn::sum(b)});
  nn::Variable lx(v1.clone(), true), ly(v2.clone(), true);
  nn::Variable lb = lx + lx;
  (nn::sum((lx + ly) * lb) + nn::sum(lb)).backward();
  p.expect_close(max_difference(dist::get_gradient(context.id(), x), lx.grad()), "shared x");
  p.expect_close(max_difference(dist::get_gradient(context.id(), y), ly.grad()), "shared y");
}

// A parameter living on its owner, fetched with to_here(): its gradient lands on the owner.
void parameter_on_owner(RpcWorld& world, Problems& p) {
  const std::string owner = world.peer(1);
  rpc::RRef ref = rpc::remote(owner, "make_parameter", args({}, "3,2,2"));
  nn::Variable x(filled({2, 2}, 1.0f, 0.5f), true);
  dist::Context context;
  nn::Variable parameter = ref.to_here().tensors.at(0);
  dist::backward(context.id(), {nn::sum(parameter * x)});
  Message on_owner =
      rpc::rpc_sync(owner, "context_gradients",
                    {.tensors = {}, .rrefs = {ref}, .bytes = std::to_string(context.id())});
  // d/dp sum(p * x) = x, and d/dx = p.
  p.expect_close(max_difference(on_owner.tensors.at(0).value(), x.value()), "owner's parameter");
  p.expect_close(max_difference(dist::get_gradient(context.id(), x), parameter_value(3, {2, 2})),
                 "x beside it");
}

std::unique_ptr<optim::Optimizer> local_optimizer(int kind, std::vector<nn::Variable> params) {
  switch (kind) {
    case 0:
      return std::make_unique<optim::SGD>(std::move(params),
                                          optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    case 1: return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions{.lr = 0.01});
    case 2:
      return std::make_unique<optim::AdamW>(std::move(params),
                                            optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    default: return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.2});
  }
}

// The model of optimizer_steps(): a two-layer linear map plus a skip path, mean squared error.
nn::Variable model_loss(const Tensor& x, const Tensor& target, const nn::Variable& a,
                        const nn::Variable& b, const nn::Variable& c) {
  return nn::mse_loss(nn::matmul(nn::matmul(x, a), b) + nn::matmul(x, c), target);
}

Problems backward_equals_local_body(RpcWorld& world) {
  Problems p;
  // v1 differs by worker, so that gradients mixed up between the workers' contexts show, in
  // steps of 1/4, which float holds exactly: the gradients, summed in another order than the
  // oracle's, stay within 1e-6.
  const Tensor v1 = filled({3, 3}, 0.5f + 0.25f * float(world.rank()), 0.25f),
               v2 = filled({3, 3}, -1.0f, 0.3f), v4 = filled({3, 3}, 2.0f, -0.1f);
  design_note_example(world, v1, v2, v4, p);
  chain_crossing_twice(world, v1, v4, p);
  tensor_sent_twice(world, v1, v2, p);
  parameter_on_owner(world, p);
  return p;
}

Problems contexts_end_everywhere_body(RpcWorld& world) {
  Problems p;
  nn::Variable x(filled({2}, 1.0f), true);
  std::int64_t id = -1;
  {
    dist::Context context;
    id = context.id();
    p.expect_error(error_of([] { dist::Context again; }), ErrorCode::InvalidArgument,
                   "a context inside a context");
    nn::Variable r =
        rpc::rpc_sync(world.peer(1), "square_double_times", args({x}, world.peer(2))).tensors.at(0);
    p.expect_error(error_of([&] { dist::backward(id, {r}); }), ErrorCode::InvalidArgument,
                   "a root of two elements");
    dist::backward(id, {nn::sum(r)});
  }  // Released here, on the next worker and from there on the one after.
  p.expect((id >> 48) == world.rank(), "the context id carries the rank");
  p.expect_error(error_of([&] { dist::get_gradient(id, x); }), ErrorCode::InvalidArgument,
                 "get_gradient() of an ended context");
  p.expect_error(error_of([&] { dist::backward(id, {nn::sum(x)}); }), ErrorCode::InvalidArgument,
                 "backward() of an ended context");
  world.barrier();  // Every worker's context has ended here.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::size_t left = rpc::detail::context_count_for_testing();
  while (left != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    left = rpc::detail::context_count_for_testing();
  }
  p.expect(left == 0, std::to_string(left) + " contexts left");
  return p;
}

Problems optimizer_steps_body(RpcWorld& world, int kind) {
  const std::vector<std::string> names = {"sgd", "adam", "adamw", "plain_sgd"};
  const std::vector<std::map<std::string, double>> options = {{{"lr", 0.05}, {"momentum", 0.9}},
                                                              {{"lr", 0.01}},
                                                              {{"lr", 0.01}, {"weight_decay", 0.1}},
                                                              {{"lr", 0.2}}};
  Problems p;
  // Parameters on the next worker, the one after and the one before: two on one owner at two
  // and three workers, one on this worker at two, all here at one.
  const int seed = 1 + world.rank();
  auto make = [&](int offset, int s, int rows, int cols) {
    return rpc::remote(
        world.peer(offset), "make_parameter",
        args({}, std::to_string(s) + "," + std::to_string(rows) + "," + std::to_string(cols)));
  };
  rpc::RRef ra = make(1, seed, 2, 3), rb = make(2, seed + 4, 3, 1),
            rc = make(world.size() - 1, seed + 8, 2, 1);
  p.expect_error(error_of([&] { rpc::DistributedOptimizer("nope", {}, {ra}); }),
                 ErrorCode::InvalidArgument, "an unknown optimizer");
  p.expect_error(error_of([&] {
                   rpc::DistributedOptimizer("sgd", {{"betas", 1}}, {});
                 }),
                 ErrorCode::InvalidArgument, "no parameters (its options unchecked)");
  p.expect_error(error_of([&] {
                   rpc::DistributedOptimizer("sgd", {{"betas", 1}}, {ra});
                 }),
                 ErrorCode::InvalidArgument, "an unknown option");
  p.expect_error(error_of([&] {
                   rpc::DistributedOptimizer("sgd", {{"momentum", 0.9}, {"nesterov", 0.5}}, {ra});
                 }),
                 ErrorCode::InvalidArgument, "nesterov 0.5");
  rpc::DistributedOptimizer optimizer(names.at(static_cast<std::size_t>(kind)),
                                      options.at(static_cast<std::size_t>(kind)), {ra, rb, rc});
  // A context that ended, or an id never made, steps nothing (before, every parameter took a
  // step with zero gradients: momentum and weight decay moved it).
  std::int64_t ended = -1;
  {
    dist::Context context;
    ended = context.id();
  }
  const Tensor before = ra.to_here().tensors.at(0).value().clone();
  for (const std::int64_t bad : {ended, std::int64_t{123456789}}) {
    std::string message;
    p.expect_error(error_of([&] { optimizer.step(bad); }, &message), ErrorCode::InvalidArgument,
                   "step with an unknown context");
    p.expect_contains(message, {"no distributed autograd context " + std::to_string(bad)},
                      "step with an unknown context");
  }
  p.expect(max_difference(ra.to_here().tensors.at(0).value(), before) == 0,
           "an unknown context changed a parameter");
  const Tensor x = filled({4, 2}, -0.5f, 0.3f), target = filled({4, 1}, 0.2f, 0.1f);
  for (int step = 0; step < 5; ++step) {
    dist::Context context;
    dist::backward(context.id(),
                   {model_loss(x, target, ra.to_here().tensors.at(0), rb.to_here().tensors.at(0),
                               rc.to_here().tensors.at(0))});
    optimizer.step(context.id());
  }
  nn::Variable la(parameter_value(seed, {2, 3}), true), lb(parameter_value(seed + 4, {3, 1}), true),
      lc(parameter_value(seed + 8, {2, 1}), true);
  std::unique_ptr<optim::Optimizer> local = local_optimizer(kind, {la, lb, lc});
  for (int step = 0; step < 5; ++step) {
    local->zero_grad();
    model_loss(x, target, la, lb, lc).backward();
    local->step();
  }
  p.expect_close(max_difference(ra.to_here().tensors.at(0).value(), la.value()), "a");
  p.expect_close(max_difference(rb.to_here().tensors.at(0).value(), lb.value()), "b");
  p.expect_close(max_difference(rc.to_here().tensors.at(0).value(), lc.value()), "c");
  return p;
}

Problems optimizer_skips_body(RpcWorld& world) {
  Problems p;
  // Two values [1, 1] on the next worker, under one SGD (lr 0.1, momentum 0.9) there.
  auto make = [&] {
    return rpc::remote(world.peer(1), "echo", args({nn::Variable(filled({2}, 1.0f, 0.0f), true)}));
  };
  rpc::RRef ra = make(), rb = make();
  rpc::DistributedOptimizer optimizer("sgd", {{"lr", 0.1}, {"momentum", 0.9}}, {ra, rb});
  {  // Gradients 1 for both; the buffers start as 1: a = b = 1 - 0.1 = 0.9.
    dist::Context context;
    dist::backward(context.id(),
                   {nn::sum(ra.to_here().tensors.at(0)) + nn::sum(rb.to_here().tensors.at(0))});
    optimizer.step(context.id());
  }
  {  // a alone: buffer 0.9 * 1 + 1 = 1.9, a = 0.9 - 0.19 = 0.71. The context reached b's owner
     // but not b, which keeps 0.9 (a zero gradient with its buffer of 1 made it 0.81).
    dist::Context context;
    dist::backward(context.id(), {nn::sum(ra.to_here().tensors.at(0))});
    optimizer.step(context.id());
  }
  p.expect_close(max_difference(ra.to_here().tensors.at(0).value(), filled({2}, 0.71f, 0.0f)),
                 "a, stepped twice");
  p.expect_close(max_difference(rb.to_here().tensors.at(0).value(), filled({2}, 0.9f, 0.0f)),
                 "b, left out of the second step");
  return p;
}

}  // namespace

RpcCase backward_equals_local() { return {.setup = {}, .body = backward_equals_local_body}; }

RpcCase contexts_end_everywhere() { return {.setup = {}, .body = contexts_end_everywhere_body}; }

RpcCase optimizer_skips_parameters_without_gradient() {
  return {.setup = {}, .body = optimizer_skips_body};
}

RpcCase optimizer_steps(int kind) {
  return {.setup = {},
          .body = [kind](RpcWorld& world) { return optimizer_steps_body(world, kind); }};
}

}  // namespace tutti::test

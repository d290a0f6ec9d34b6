// SPDX-License-Identifier: Apache-2.0
// Distributed autograd and the DistributedOptimizer over MPI at 1-4 ranks, against the same
// graphs and optimizers run locally with plain nn and optim. Every rank is a trainer at once,
// using the next ranks as its remote workers.
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "src/rpc/rpc_runtime.h"
#include "test/mpi/rpc/rpc_test_util.h"
#include "test/support/error_of.h"
#include "tutti/distributed_autograd.h"
#include "tutti/optim.h"

namespace tutti::test {
namespace {

using rpc::Message;
namespace dist = dist_autograd;

Message args(std::vector<nn::Variable> tensors, std::string bytes = {}) {
  return Message{.tensors = std::move(tensors), .rrefs = {}, .bytes = std::move(bytes)};
}

TEST_CASE("Distributed backward equals the same graph computed locally", "[rpc][dist_autograd]") {
  RpcGroup group;
  std::map<std::string, double> difference;
  const std::string near = peer(1), far = peer(2);
  const Tensor v1 = filled({3, 3}, 0.5f + float(world_rank()), 0.25f),
               v2 = filled({3, 3}, -1.0f, 0.3f), v4 = filled({3, 3}, 2.0f, -0.1f);
  {  // The design note's example.
    nn::Variable t1(v1.clone(), true), t2(v2.clone(), true), t4(v4.clone(), true);
    dist::Context context;
    nn::Variable t3 = rpc::rpc_sync(near, "add", args({t1, t2})).tensors.at(0);
    dist::backward(context.id(), {nn::sum(t3 * t4)});
    nn::Variable l1(v1.clone(), true), l2(v2.clone(), true), l4(v4.clone(), true);
    nn::sum((l1 + l2) * l4).backward();
    difference["example t1"] = max_difference(dist::get_gradient(context.id(), t1), l1.grad());
    difference["example t2"] = max_difference(dist::get_gradient(context.id(), t2), l2.grad());
    difference["example t4"] = max_difference(dist::get_gradient(context.id(), t4), l4.grad());
    difference["grad() untouched"] = max_difference(t1.grad(), Tensor(DataType::Float32, {3, 3}));
  }
  {  // Crossing workers twice: near -> far (back to this rank at 2 ranks) -> near -> here.
    nn::Variable x(v1.clone(), true), w(v4.clone(), true);
    dist::Context context;
    nn::Variable r = rpc::rpc_sync(near, "square_double_times", args({x}, far)).tensors.at(0);
    dist::backward(context.id(), {nn::sum(r * w)});
    nn::Variable lx(v1.clone(), true), lw(v4.clone(), true);
    nn::Variable ly = lx * lx;
    nn::sum((ly + ly) * lx * lw).backward();
    difference["chain x"] = max_difference(dist::get_gradient(context.id(), x), lx.grad());
    difference["chain w"] = max_difference(dist::get_gradient(context.id(), w), lw.grad());
  }
  {  // One tensor used by two RPCs: its gradients are summed.
    nn::Variable x(v1.clone(), true), y(v2.clone(), true);
    dist::Context context;
    nn::Variable a = rpc::rpc_sync(near, "add", args({x, y})).tensors.at(0);
    nn::Variable b = rpc::rpc_sync(far, "double", args({x})).tensors.at(0);
    dist::backward(context.id(), {nn::sum(a * b)});
    nn::Variable lx(v1.clone(), true), ly(v2.clone(), true);
    nn::sum((lx + ly) * (lx + lx)).backward();
    difference["shared x"] = max_difference(dist::get_gradient(context.id(), x), lx.grad());
    difference["shared y"] = max_difference(dist::get_gradient(context.id(), y), ly.grad());
  }
  {  // A parameter on its owner, fetched with to_here(): its gradient lands on the owner.
    rpc::RRef ref = rpc::remote(near, "make_parameter", args({}, "3,2,2"));
    nn::Variable x(filled({2, 2}, 1.0f, 0.5f), true);
    dist::Context context;
    nn::Variable p = ref.to_here().tensors.at(0);
    dist::backward(context.id(), {nn::sum(p * x)});
    Message on_owner =
        rpc::rpc_sync(near, "context_gradients",
                      {.tensors = {}, .rrefs = {ref}, .bytes = std::to_string(context.id())});
    difference["owner's parameter"] = max_difference(on_owner.tensors.at(0).value(), x.value());
    difference["x beside it"] =
        max_difference(dist::get_gradient(context.id(), x), parameter_value(3, {2, 2}));
  }
  bool ok = true;
  for (const auto& [name, d] : difference) {
    INFO(name << ": " << d);
    CHECK(d <= 1e-6);
    ok = ok && d <= 1e-6;
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("Backward fails on the caller when a worker fails; context ids carry the rank",
          "[rpc][dist_autograd]") {
  RpcGroup group;
  nn::Variable x(filled({2}, 1.0f), true);
  std::int64_t id = -1;
  std::optional<ErrorCode> nested, bad_root;
  {
    dist::Context context;
    id = context.id();
    nested = error_of([] { dist::Context again; });
    nn::Variable y = rpc::rpc_sync(peer(1), "double", args({x})).tensors.at(0);
    bad_root = error_of([&] { dist::backward(context.id(), {y}); });  // Two elements.
  }
  const auto unknown = error_of([&] { dist::backward(id, {nn::sum(x)}); });
  CHECK(all_ranks(nested == ErrorCode::InvalidArgument && bad_root == ErrorCode::InvalidArgument &&
                  unknown == ErrorCode::InvalidArgument && (id >> 48) == world_rank()));
}

TEST_CASE("Contexts end on every worker they reached", "[rpc][dist_autograd]") {
  RpcGroup group;
  {
    nn::Variable x(filled({2}, 1.0f), true);
    dist::Context context;
    nn::Variable r =
        rpc::rpc_sync(peer(1), "square_double_times", args({x}, peer(2))).tensors.at(0);
    dist::backward(context.id(), {nn::sum(r)});
  }                             // Released here, on peer(1) and from there on peer(2).
  MPI_Barrier(MPI_COMM_WORLD);  // Every rank's context has ended.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::size_t left = rpc::detail::context_count_for_testing();
  while (left != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    left = rpc::detail::context_count_for_testing();
  }
  INFO("contexts left " << left);
  CHECK(all_ranks(left == 0));
}

std::unique_ptr<optim::Optimizer> local_optimizer(int kind, std::vector<nn::Variable> params) {
  switch (kind) {
    case 0:
      return std::make_unique<optim::SGD>(std::move(params),
                                          optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    case 1: return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions{.lr = 0.01});
    default:
      return std::make_unique<optim::AdamW>(std::move(params),
                                            optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  }
}

TEST_CASE("DistributedOptimizer steps equal a local optimizer's", "[rpc][dist_optimizer]") {
  const int kind = GENERATE(0, 1, 2);
  const std::vector<std::string> names = {"sgd", "adam", "adamw"};
  const std::vector<std::map<std::string, double>> options = {
      {{"lr", 0.05}, {"momentum", 0.9}}, {{"lr", 0.01}}, {{"lr", 0.01}, {"weight_decay", 0.1}}};
  RpcGroup group;
  const int seed = 1 + world_rank();
  rpc::RRef r1 = rpc::remote(peer(1), "make_parameter", args({}, std::to_string(seed) + ",2,3"));
  rpc::RRef r2 =
      rpc::remote(peer(2), "make_parameter", args({}, std::to_string(seed + 5) + ",3,1"));
  rpc::DistributedOptimizer optimizer(names[static_cast<std::size_t>(kind)],
                                      options[static_cast<std::size_t>(kind)], {r1, r2});
  const Tensor x = filled({4, 2}, -0.5f, 0.3f), target = filled({4, 1}, 0.2f, 0.1f);
  for (int step = 0; step < 5; ++step) {
    dist::Context context;
    nn::Variable a = r1.to_here().tensors.at(0), b = r2.to_here().tensors.at(0);
    dist::backward(context.id(), {nn::mse_loss(nn::matmul(nn::matmul(x, a), b), target)});
    optimizer.step(context.id());
  }
  nn::Variable la(parameter_value(seed, {2, 3}), true), lb(parameter_value(seed + 5, {3, 1}), true);
  std::unique_ptr<optim::Optimizer> local = local_optimizer(kind, {la, lb});
  for (int step = 0; step < 5; ++step) {
    local->zero_grad();
    nn::mse_loss(nn::matmul(nn::matmul(x, la), lb), target).backward();
    local->step();
  }
  const double d = std::max(max_difference(r1.to_here().tensors.at(0).value(), la.value()),
                            max_difference(r2.to_here().tensors.at(0).value(), lb.value()));
  INFO("difference " << d);
  CHECK(all_ranks(d <= 1e-6));
}

}  // namespace
}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// Distributed autograd and the DistributedOptimizer with threads as workers, against the same
// graphs and optimizers run locally with plain nn and optim (the oracles).
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "test/support/error_of.h"
#include "test/unit/rpc/rpc_harness.h"
#include "tutti/optim.h"

namespace tutti::test {
namespace {

using rpc::Message;
namespace dist = dist_autograd;

Message args(std::vector<nn::Variable> tensors, std::string bytes = {}) {
  return Message{.tensors = std::move(tensors), .rrefs = {}, .bytes = std::move(bytes)};
}

// Per-case gradient differences from the oracle (max abs), filled on worker 0.
struct Differences {
  std::map<std::string, double> by_name;
  void add(const std::string& name, const Tensor& got, const Tensor& want) {
    by_name[name] = max_difference(got, want);
  }
};

TEST_CASE("Distributed backward equals the same graph computed locally", "[rpc][dist_autograd]") {
  const int size = GENERATE(2, 3);
  Differences d;
  std::optional<ErrorCode> local_backward;
  Group group(size);
  const std::string far = worker(size - 1);  // w1 at 2 ranks, w2 at 3.
  group.run([&](int rank) {
    if (rank != 0) return;
    const Tensor v1 = filled({3, 3}, 0.5f, 0.25f), v2 = filled({3, 3}, -1.0f, 0.3f),
                 v4 = filled({3, 3}, 2.0f, -0.1f);
    {  // The design note's example: t3 = my_add(t1, t2) on w1; loss = sum(t3 * t4) here.
      nn::Variable t1(v1.clone(), true), t2(v2.clone(), true), t4(v4.clone(), true);
      dist::Context context;
      nn::Variable t3 = rpc::rpc_sync("w1", "add", args({t1, t2})).tensors.at(0);
      nn::Variable loss = nn::sum(t3 * t4);
      dist::backward(context.id(), {loss});
      nn::Variable l1(v1.clone(), true), l2(v2.clone(), true), l4(v4.clone(), true);
      nn::sum((l1 + l2) * l4).backward();
      d.add("example t1", dist::get_gradient(context.id(), t1), l1.grad());
      d.add("example t2", dist::get_gradient(context.id(), t2), l2.grad());
      d.add("example t4", dist::get_gradient(context.id(), t4), l4.grad());
      d.add("grad() untouched", t1.grad(), Tensor(DataType::Float32, {3, 3}));
      d.add("two gradients",
            Tensor::from<float>(std::vector<float>{float(dist::get_gradients(context.id()).size())},
                                {1}),
            Tensor::from<float>(std::vector<float>{3.0f}, {1}));
      // A graph with a recv is not for Variable::backward().
      local_backward = error_of([&] { loss.backward(); });
    }
    {  // Crossing workers twice: x^2 on w1, doubled on `far` (or back here), times x on w1.
      nn::Variable x(v1.clone(), true), w(v4.clone(), true);
      dist::Context context;
      nn::Variable r =
          rpc::rpc_sync("w1", "square_double_times", args({x}, far == "w1" ? "w0" : far))
              .tensors.at(0);
      dist::backward(context.id(), {nn::sum(r * w)});
      nn::Variable lx(v1.clone(), true), lw(v4.clone(), true);
      nn::Variable ly = lx * lx;
      nn::sum((ly + ly) * lx * lw).backward();
      d.add("chain x", dist::get_gradient(context.id(), x), lx.grad());
      d.add("chain w", dist::get_gradient(context.id(), w), lw.grad());
    }
    {  // One tensor in two RPCs (to two workers): its gradients are summed.
      nn::Variable x(v1.clone(), true), y(v2.clone(), true);
      dist::Context context;
      nn::Variable a = rpc::rpc_sync("w1", "add", args({x, y})).tensors.at(0);
      nn::Variable b = rpc::rpc_sync(far, "double", args({x})).tensors.at(0);
      dist::backward(context.id(), {nn::sum(a * b), nn::sum(b)});  // Two roots.
      nn::Variable lx(v1.clone(), true), ly(v2.clone(), true);
      nn::Variable lb = lx + lx;
      (nn::sum((lx + ly) * lb) + nn::sum(lb)).backward();
      d.add("shared x", dist::get_gradient(context.id(), x), lx.grad());
      d.add("shared y", dist::get_gradient(context.id(), y), ly.grad());
    }
    {  // A parameter living on its owner, fetched with to_here(): its gradient lands on the owner.
      rpc::RRef ref = rpc::remote("w1", "make_parameter", args({}, "3,2,2"));
      nn::Variable x(filled({2, 2}, 1.0f, 0.5f), true);
      dist::Context context;
      nn::Variable p = ref.to_here().tensors.at(0);
      dist::backward(context.id(), {nn::sum(p * x)});
      Message on_owner =
          rpc::rpc_sync("w1", "context_gradients",
                        {.tensors = {}, .rrefs = {ref}, .bytes = std::to_string(context.id())});
      d.add("owner's parameter", on_owner.tensors.at(0).value(),
            x.value());  // d/dp sum(p * x) = x.
      d.add("x beside it", dist::get_gradient(context.id(), x), parameter_value(3, {2, 2}));
    }
  });
  CHECK(local_backward == ErrorCode::InvalidArgument);
  for (const auto& [name, difference] : d.by_name) {
    INFO(name);
    CHECK(difference <= 1e-6);
  }
}

TEST_CASE("Contexts end on every worker they reached; errors anywhere fail backward",
          "[rpc][dist_autograd]") {
  std::size_t contexts_left = 99;
  std::optional<ErrorCode> unknown_here, remote_failure, bad_root;
  std::string remote_message;
  Group group(3);
  group.run([&](int rank) {
    if (rank != 0) return;
    nn::Variable x(filled({2}, 1.0f), true);
    std::int64_t id = -1;
    {
      dist::Context context;
      id = context.id();
      static_cast<void>(rpc::rpc_sync("w1", "square_double_times", args({x}, "w2")));
      bad_root = error_of([&] { dist::backward(id, {x * x}); });  // Two elements.
    }
    unknown_here = error_of([&] { dist::get_gradient(id, x); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    auto left = [&] {
      return group.agent(0).contexts().size() + group.agent(1).contexts().size() +
             group.agent(2).contexts().size();
    };
    while (left() != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    contexts_left = left();
    {  // The callee lost the context: backward fails here, naming it.
      dist::Context context;
      nn::Variable y = rpc::rpc_sync("w1", "double", args({x})).tensors.at(0);
      static_cast<void>(group.agent(1).contexts().release(context.id()));
      remote_failure =
          error_of([&] { dist::backward(context.id(), {nn::sum(y)}); }, &remote_message);
    }
  });
  CHECK(bad_root == ErrorCode::InvalidArgument);
  CHECK(unknown_here == ErrorCode::InvalidArgument);
  CHECK(contexts_left == 0);
  CHECK(remote_failure == ErrorCode::InvalidArgument);
  CHECK_THAT(remote_message, Catch::Contains("w1"));
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

TEST_CASE("DistributedOptimizer steps equal a local optimizer's", "[rpc][dist_optimizer]") {
  const int kind = GENERATE(0, 1, 2, 3);
  const int size = GENERATE(2, 3);
  const std::vector<std::string> names = {"sgd", "adam", "adamw", "plain_sgd"};
  const std::vector<std::map<std::string, double>> options = {{{"lr", 0.05}, {"momentum", 0.9}},
                                                              {{"lr", 0.01}},
                                                              {{"lr", 0.01}, {"weight_decay", 0.1}},
                                                              {{"lr", 0.2}}};
  rpc::register_optimizer(
      "plain_sgd", [](std::vector<nn::Variable> p, const std::map<std::string, double>& o) {
        return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = o.at("lr")});
      });
  double difference = 1e300;
  std::optional<ErrorCode> bad_name, bad_option;
  Group group(size);
  group.run([&](int rank) {
    if (rank != 0) return;
    rpc::RRef r1 = rpc::remote("w1", "make_parameter", args({}, "1,2,3"));
    rpc::RRef r2 = rpc::remote(worker(size - 1), "make_parameter", args({}, "2,3,1"));
    bad_name = error_of([&] { rpc::DistributedOptimizer("nope", {}, {r1}); });
    bad_option = error_of([&] { rpc::DistributedOptimizer("sgd", {{"betas", 1}}, {r1}); });
    rpc::DistributedOptimizer optimizer(names[static_cast<std::size_t>(kind)],
                                        options[static_cast<std::size_t>(kind)], {r1, r2});
    const Tensor x = filled({4, 2}, -0.5f, 0.3f), target = filled({4, 1}, 0.2f, 0.1f);
    for (int step = 0; step < 5; ++step) {
      dist::Context context;
      nn::Variable a = r1.to_here().tensors.at(0), b = r2.to_here().tensors.at(0);
      dist::backward(context.id(), {nn::mse_loss(nn::matmul(nn::matmul(x, a), b), target)});
      optimizer.step(context.id());
    }
    nn::Variable la(parameter_value(1, {2, 3}), true), lb(parameter_value(2, {3, 1}), true);
    std::unique_ptr<optim::Optimizer> local = local_optimizer(kind, {la, lb});
    for (int step = 0; step < 5; ++step) {
      local->zero_grad();
      nn::mse_loss(nn::matmul(nn::matmul(x, la), lb), target).backward();
      local->step();
    }
    difference = std::max(max_difference(r1.to_here().tensors.at(0).value(), la.value()),
                          max_difference(r2.to_here().tensors.at(0).value(), lb.value()));
  });
  CHECK(bad_name == ErrorCode::InvalidArgument);
  CHECK(bad_option == ErrorCode::InvalidArgument);
  CHECK(difference <= 1e-6);
}

}  // namespace
}  // namespace tutti::test

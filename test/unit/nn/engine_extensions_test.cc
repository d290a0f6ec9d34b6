// SPDX-License-Identifier: Apache-2.0
// The autograd engine's extensions for the data-parallel modules (src/nn/autograd.h): backward
// callbacks (Note [Backward callbacks]), leaf_gradients(), reachable_leaves(), concurrent
// backward passes over shared leaves (Note [Thread safety of nn]); and the pieces DDP builds on:
// Tensor::slice and the bucket assignment.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "src/nn/autograd.h"
#include "src/nn/parallel/bucket_assignment.h"
#include "test/unit/nn/nn_test_util.h"
#include "tutti/nn.h"

namespace tutti::nn {
namespace {

using test::random_tensor;
using test::tensor;
using test::values;

std::shared_ptr<Sequential> mlp(std::uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(4, 6), std::make_shared<ReLU>(), std::make_shared<Linear>(6, 3)});
}

TEST_CASE("Backward callbacks run after every hook, in order, before backward() returns",
          "[nn][engine]") {
  auto model = mlp(1);
  std::vector<std::string> events;
  for (auto& [name, p] : model->named_parameters()) {
    p.register_grad_hook([&events, name = name](Variable&) {
      events.push_back("hook " + name);
      if (name == "2.weight") {  // The first hook queues two callbacks; the second queues one.
        CHECK(detail::queue_backward_callback([&events] { events.push_back("callback 1"); }));
        CHECK(detail::queue_backward_callback([&events] {
          events.push_back("callback 2");
          CHECK(detail::queue_backward_callback([&events] { events.push_back("callback 3"); }));
        }));
      }
    });
  }
  CHECK_FALSE(detail::queue_backward_callback([] {}));  // No backward() on this thread.
  test::project(model->forward(Variable(random_tensor({5, 4}, 2)))).backward();
  REQUIRE(events.size() == 7);
  CHECK(std::vector<std::string>(events.end() - 3, events.end()) ==
        std::vector<std::string>{"callback 1", "callback 2", "callback 3"});
  // A later backward() starts with an empty list.
  events.clear();
  test::project(model->forward(Variable(random_tensor({5, 4}, 2)))).backward();
  CHECK(events.size() == 7);
}

TEST_CASE("A throwing callback does not stop the others; backward() rethrows the first",
          "[nn][engine]") {
  Variable w(tensor({1, 2}, {2}), true);
  int ran = 0;
  w.register_grad_hook([&ran](Variable&) {
    detail::queue_backward_callback([] { throw Error(ErrorCode::Mismatch, "first"); });
    detail::queue_backward_callback([&ran] { ++ran; });
    detail::queue_backward_callback([] { throw std::runtime_error("second"); });
  });
  try {
    sum(w * w).backward();
    FAIL("backward() did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Mismatch);
  }
  CHECK(ran == 1);
  CHECK(values(w.grad()) == std::vector<float>{2, 4});  // The gradients were accumulated.
}

TEST_CASE("A walk that throws still runs the callbacks; backward() rethrows the walk's error",
          "[nn][engine]") {
  // DDP's callback starts the buckets this rank has not: dropped, the other ranks would wait in
  // them until this rank's next pass (Note [Backward callbacks]).
  Variable a(tensor({1, 2}, {2}), true);
  Variable b(tensor({3}, {1}), true);
  int ran = 0;
  a.register_grad_hook([&ran](Variable&) {
    detail::queue_backward_callback([&ran] {
      ++ran;
      throw Error(ErrorCode::Mismatch, "the callback's");  // Dropped: the walk's comes first.
    });
  });
  b.grad() = Tensor();  // Absent: the engine refuses to accumulate into it.
  try {
    // The walk takes the later result first: a's gradient (and hook) before b's, which throws.
    const Variable bb = sum(b * b);
    const Variable aa = sum(a * a);
    (bb + aa).backward();
    FAIL("backward() did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("grad() must keep the value's shape") != std::string::npos);
  }
  CHECK(ran == 1);
}

TEST_CASE("A walk that throws calls every leaf's failed-pass hooks, before the callbacks",
          "[nn][engine]") {
  // Note [A walk that throws] in src/nn/backward_walk.cc: DistributedOptimizer sends the
  // reductions it owes from these hooks (and learns that a pass failed after its hooks ran),
  // and DDP's output starts its pass.
  Variable a(tensor({1, 2}, {2}), true);
  Variable b(tensor({3}, {1}), true);
  Variable c(tensor({4}, {1}), true);
  std::vector<std::string> events;
  a.register_grad_hook([&events](Variable&) {
    events.emplace_back("hook a");
    detail::queue_backward_callback([&events] { events.emplace_back("callback"); });
  });
  for (auto [name, v] : {std::pair{"a", a}, std::pair{"b", b}, std::pair{"c", c}}) {
    v.register_failed_pass_hook([&events, name = std::string(name)](Variable&) {
      events.push_back("failed " + name);
      if (name == "b") throw std::runtime_error("dropped");  // The others still run.
    });
  }
  b.grad() = Tensor();  // Absent: the engine refuses to accumulate into it.
  // The walk takes the newest result first: a's gradient (finished, hooks run), then b's (throws);
  // c's, the oldest, is never reached.
  const Variable cc = sum(c * c);
  const Variable bb = sum(b * b);
  const Variable aa = sum(a * a);
  try {
    (cc + bb + aa).backward();
    FAIL("backward() did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);  // The walk's error, not the hook's.
  }
  REQUIRE(events.size() == 5);
  CHECK(events.front() == "hook a");
  std::vector<std::string> failed(events.begin() + 1, events.end() - 1);
  std::sort(failed.begin(), failed.end());
  CHECK(failed == std::vector<std::string>{"failed a", "failed b", "failed c"});
  CHECK(events.back() == "callback");  // After the failed-pass hooks, which may queue some.
  // A walk that does not throw calls none.
  events.clear();
  b.grad() = Tensor(DataType::Float32, {1});
  (cc + bb + aa).backward();
  CHECK(events == std::vector<std::string>{"hook a", "callback"});
}

TEST_CASE(
    "An operation's backward that throws: backward() calls failed-pass hooks, "
    "leaf_gradients() none",
    "[nn][engine]") {
  Variable a(tensor({1, 2}, {2}), true);
  int failed = 0;
  a.register_failed_pass_hook([&failed](Variable&) { ++failed; });
  Variable broken =
      detail::make_result(tensor({0}, {1}), {a}, [](const Tensor&) -> detail::Gradients {
        throw Error(ErrorCode::Mismatch, "this operation's backward");
      });
  CHECK_THROWS_AS(broken.backward(), Error);
  CHECK(failed == 1);
  CHECK_THROWS_AS(detail::leaf_gradients(broken, tensor({1}, {1})), Error);
  CHECK(failed == 1);
}

TEST_CASE("register_failed_pass_hook() takes leaves that require grad and a hook", "[nn][engine]") {
  Variable a(tensor({1, 2}, {2}), true);
  Variable constant(tensor({1, 2}, {2}));
  const Variable result = a * a;
  const auto hook = [](Variable&) {};
  CHECK_THROWS_WITH(constant.register_failed_pass_hook(hook), Catch::Contains("a leaf Variable"));
  CHECK_THROWS_WITH(Variable(result).register_failed_pass_hook(hook),
                    Catch::Contains("a leaf Variable"));
  CHECK_THROWS_WITH(a.register_failed_pass_hook(nullptr), Catch::Contains("empty hook"));
  CHECK_THROWS_WITH(Variable().register_failed_pass_hook(hook), Catch::Contains("empty"));
}

TEST_CASE("leaf_gradients() equals backward()'s gradients and touches no grad() or hook",
          "[nn][engine]") {
  auto model = mlp(3);
  auto reference = mlp(3);
  int hooks = 0;
  for (auto& [name, p] : model->named_parameters()) {
    p.register_grad_hook([&hooks](Variable&) { ++hooks; });
  }
  const Tensor x = random_tensor({5, 4}, 4);
  const Variable out = model->forward(Variable(x));
  const Tensor seed = random_tensor(out.value().shape(), 5);
  detail::LeafGradients grads = detail::leaf_gradients(out, seed);
  // The oracle: sum(out * seed) differentiated by backward() on an identical model.
  sum(reference->forward(Variable(x)) * Variable(seed)).backward();
  const NamedParameters named = model->named_parameters();
  const NamedParameters ref = reference->named_parameters();
  REQUIRE(grads.size() == named.size());
  for (std::size_t i = 0; i < named.size(); ++i) {
    INFO(named[i].first);
    const Tensor& g = grads.at(detail::VariableAccess::impl(named[i].second).get());
    const std::vector<float> got = values(g), expected = values(ref[i].second.grad());
    for (std::size_t k = 0; k < got.size(); ++k) CHECK(got[k] == Approx(expected[k]).margin(1e-6));
    CHECK(std::all_of(named[i].second.grad().span<float>().begin(),
                      named[i].second.grad().span<float>().end(), [](float v) { return v == 0; }));
  }
  CHECK(hooks == 0);
  CHECK_THROWS_AS(detail::leaf_gradients(out, random_tensor({2}, 1)), Error);  // Wrong shape.
}

TEST_CASE("reachable_leaves() lists each leaf that requires grad once", "[nn][engine]") {
  Variable a(tensor({1, 2}, {2}), true), b(tensor({3, 4}, {2}), true), c(tensor({5, 6}, {2}));
  const Variable y = (a * b) + (a * c);
  const std::vector<std::shared_ptr<detail::VariableImpl>> leaves = detail::reachable_leaves(y);
  REQUIRE(leaves.size() == 2);
  const auto* ia = detail::VariableAccess::impl(a).get();
  const auto* ib = detail::VariableAccess::impl(b).get();
  CHECK(((leaves[0].get() == ia && leaves[1].get() == ib) ||
         (leaves[0].get() == ib && leaves[1].get() == ia)));
  CHECK(detail::reachable_leaves(c).empty());  // Does not require grad.
}

// See Note [Thread safety of nn] in src/nn/variable.cc.
TEST_CASE("Concurrent backward() passes over shared parameters lose no contribution",
          "[nn][engine][threads]") {
  constexpr int kThreads = 8;
  constexpr int kPasses = 25;
  auto model = mlp(7);
  auto reference = mlp(7);
  std::vector<Tensor> inputs;
  for (int t = 0; t < kThreads; ++t) inputs.push_back(random_tensor({3, 4}, 100 + t));
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kPasses; ++k)
          test::project(model->forward(Variable(inputs[t]))).backward();
      });
    }
  }
  for (int t = 0; t < kThreads; ++t) {
    for (int k = 0; k < kPasses; ++k)
      test::project(reference->forward(Variable(inputs[t]))).backward();
  }
  const NamedParameters named = model->named_parameters();
  const NamedParameters ref = reference->named_parameters();
  for (std::size_t i = 0; i < named.size(); ++i) {
    const std::vector<float> got = values(named[i].second.grad());
    const std::vector<float> expected = values(ref[i].second.grad());
    for (std::size_t k = 0; k < got.size(); ++k) {
      CHECK(got[k] == Approx(expected[k]).epsilon(1e-4).margin(1e-4));
    }
  }
}

TEST_CASE("Tensor::slice shares storage, keeps it alive and checks its range", "[nn][tensor]") {
  Tensor slice;
  {
    Tensor whole = tensor({0, 1, 2, 3, 4, 5}, {6});
    slice = whole.slice(2, {2, 1});
    CHECK(slice.shape() == Shape{2, 1});
    CHECK(values(slice) == std::vector<float>{2, 3});
    whole.span<float>()[3] = 30;
    CHECK(values(slice) == std::vector<float>{2, 30});
    slice.span<float>()[0] = 20;
    CHECK(whole.span<float>()[2] == 20);
    CHECK(values(slice.clone()) == std::vector<float>{20, 30});
    CHECK(whole.slice(6, {0}).num_elements() == 0);
    CHECK_THROWS_AS(whole.slice(5, {2}), Error);
    CHECK_THROWS_AS(whole.slice(-1, {1}), Error);
    CHECK_THROWS_AS(whole.slice(7, {0}), Error);
    // The message names the offset and count, not their sum, which would pass int64 here.
    CHECK_THROWS_WITH(whole.slice(std::numeric_limits<std::int64_t>::max(), {2}),
                      "Tensor::slice: 2 elements from element 9223372036854775807 do not lie "
                      "within a tensor of 6 elements");
  }
  CHECK(values(slice) == std::vector<float>{20, 30});  // Alive after `whole` is gone.
}

TEST_CASE("Buckets close once they reach their cap, the first with its own cap", "[nn][ddp]") {
  const std::vector<std::int64_t> bytes = {40, 8, 100, 4, 4, 30};
  const std::vector<std::size_t> reverse = {5, 4, 3, 2, 1, 0};
  using Buckets = std::vector<std::vector<std::size_t>>;
  CHECK(detail::assign_buckets(reverse, bytes, 10, 50) == Buckets{{5}, {4, 3, 2}, {1, 0}});
  CHECK(detail::assign_buckets(reverse, bytes, 1000, 1) == Buckets{{5, 4, 3, 2, 1, 0}});
  CHECK(detail::assign_buckets(reverse, bytes, 1, 1) == Buckets{{5}, {4}, {3}, {2}, {1}, {0}});
  CHECK(detail::assign_buckets(std::vector<std::size_t>{2, 0, 1}, bytes, 100, 48) ==
        Buckets{{2}, {0, 1}});
  CHECK(detail::assign_buckets({}, bytes, 1, 1).empty());
}

}  // namespace
}  // namespace tutti::nn

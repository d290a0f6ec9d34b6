// SPDX-License-Identifier: Apache-2.0
// nn::DataParallel: outputs and gradients against one forward over the whole batch on an
// identical model (plain nn, one thread), hooks, uneven and tiny batches, and a stress run.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/nn/nn_test_util.h"
#include "tutti/nn.h"

namespace tutti::nn {
namespace {

using test::random_tensor;
using test::values;

std::shared_ptr<Module> make_mlp(std::uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(6, 16), std::make_shared<ReLU>(), std::make_shared<Linear>(16, 8),
      std::make_shared<ReLU>(), std::make_shared<Linear>(8, 3)});
}

std::shared_ptr<Module> make_cnn(std::uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(2, 4, 3, 1, 1), std::make_shared<ReLU>(),
      std::make_shared<MaxPool2d>(2), std::make_shared<Flatten>(),
      std::make_shared<Linear>(4 * 3 * 3, 5)});
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> va = values(a), vb = values(b);
  if (va.size() != vb.size()) return 1e30;
  double worst = 0;
  for (std::size_t i = 0; i < va.size(); ++i)
    worst = std::max(worst, std::abs(double(va[i]) - vb[i]));
  return worst;
}

// One forward/backward through DataParallel(model, threads) and one through an identical model
// on the whole batch; outputs, parameter gradients and the input gradient must agree.
void check_against_whole_batch(bool cnn, int threads, std::int64_t rows) {
  INFO((cnn ? "cnn" : "mlp") << ", " << threads << " threads, " << rows << " rows");
  auto model = cnn ? make_cnn(5) : make_mlp(5);
  auto reference = cnn ? make_cnn(5) : make_mlp(5);
  DataParallel dp(model, threads);
  const Shape shape = cnn ? Shape{rows, 2, 6, 6} : Shape{rows, 6};
  const Tensor x = random_tensor(shape, 11);
  Variable input(x.clone(), true);
  Variable ref_input(x.clone(), true);
  const Variable out = dp.forward(input);
  const Variable ref_out = reference->forward(ref_input);
  CHECK(out.value().shape() == ref_out.value().shape());
  CHECK(max_abs_diff(out.value(), ref_out.value()) < 1e-5);
  test::project(out).backward();
  test::project(ref_out).backward();
  const NamedParameters named = dp.named_parameters();
  const NamedParameters ref = reference->named_parameters();
  REQUIRE(named.size() == ref.size());
  for (std::size_t i = 0; i < named.size(); ++i) {
    INFO(named[i].first);
    CHECK(named[i].first == "module." + ref[i].first);
    CHECK(max_abs_diff(named[i].second.grad(), ref[i].second.grad()) < 1e-5);
  }
  CHECK(max_abs_diff(input.grad(), ref_input.grad()) < 1e-5);
}

TEST_CASE("DataParallel equals one forward over the whole batch, outputs and gradients",
          "[nn][data_parallel]") {
  const bool cnn = GENERATE(false, true);
  const int threads = GENERATE(1, 2, 3, 4, 7);
  const std::int64_t rows = GENERATE(1, 3, 10, 16);
  check_against_whole_batch(cnn, threads, rows);
}

TEST_CASE("DataParallel fires each parameter's hooks once per backward, after all parts",
          "[nn][data_parallel][hooks]") {
  auto model = make_mlp(9);
  DataParallel dp(model, 4);
  std::vector<int> calls;
  for (auto& [name, p] : dp.named_parameters()) {
    calls.push_back(0);
    p.register_grad_hook([&calls, i = calls.size() - 1](Variable&) { ++calls[i]; });
  }
  for (int pass = 1; pass <= 3; ++pass) {
    test::project(dp.forward(Variable(random_tensor({12, 6}, pass)))).backward();
    CHECK(calls == std::vector<int>(calls.size(), pass));
  }
}

// An inner layer: the input is the result of an operation, so its gradient must flow on.
TEST_CASE("DataParallel inside a larger graph passes the input gradient on",
          "[nn][data_parallel]") {
  auto model = make_mlp(13);
  auto reference = make_mlp(13);
  DataParallel dp(model, 3);
  manual_seed(17);
  Linear first(5, 6), ref_first(5, 6);
  // Same weights: copy first's into ref_first.
  std::copy(first.weight().value().span<float>().begin(),
            first.weight().value().span<float>().end(),
            ref_first.weight().value().span<float>().begin());
  std::copy(first.bias().value().span<float>().begin(), first.bias().value().span<float>().end(),
            ref_first.bias().value().span<float>().begin());
  const Tensor x = random_tensor({9, 5}, 19);
  test::project(dp.forward(first.forward(Variable(x)))).backward();
  test::project(reference->forward(ref_first.forward(Variable(x)))).backward();
  CHECK(max_abs_diff(first.weight().grad(), ref_first.weight().grad()) < 1e-5);
  CHECK(max_abs_diff(first.bias().grad(), ref_first.bias().grad()) < 1e-5);
}

TEST_CASE("DataParallel under stress: many threads, many passes", "[nn][data_parallel][threads]") {
  constexpr int kPasses = 20;
  auto model = make_cnn(21);
  auto reference = make_cnn(21);
  DataParallel dp(model, 16);
  for (int pass = 0; pass < kPasses; ++pass) {
    const Tensor x = random_tensor({37, 2, 6, 6}, 1000 + pass);
    test::project(dp.forward(Variable(x))).backward();
    test::project(reference->forward(Variable(x))).backward();
  }
  const NamedParameters named = dp.named_parameters();
  const NamedParameters ref = reference->named_parameters();
  for (std::size_t i = 0; i < named.size(); ++i) {
    INFO(named[i].first);
    CHECK(max_abs_diff(named[i].second.grad(), ref[i].second.grad()) < 1e-4);  // 20 passes summed.
  }
}

TEST_CASE("DataParallel runs layers with side effects (BatchNorm, Dropout) from its threads",
          "[nn][data_parallel][threads]") {
  manual_seed(23);
  auto model = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(6, 8), std::make_shared<BatchNorm1d>(8), std::make_shared<ReLU>(),
      std::make_shared<Dropout>(0.3), std::make_shared<Linear>(8, 2)});
  DataParallel dp(model, 4);
  for (int pass = 0; pass < 5; ++pass) {
    test::project(dp.forward(Variable(random_tensor({16, 6}, 50 + pass)))).backward();
  }
  // Each part updated the running statistics once per pass: 4 parts x 5 passes of momentum 0.1
  // take running_var from 1 towards the parts' variances; all that is asserted is that every
  // update landed intact (finite values, mean moved away from its start).
  bool finite = true, moved = false;
  for (auto& [name, b] : dp.named_buffers()) {
    for (float v : b.value().span<float>()) {
      finite = finite && std::isfinite(v);
      moved = moved || (name.ends_with("running_mean") && v != 0.0f);
    }
  }
  CHECK(finite);
  CHECK(moved);
}

TEST_CASE("DataParallel rejects a null module, no threads and a 0-d input", "[nn][data_parallel]") {
  CHECK_THROWS_MATCHES(DataParallel(nullptr, 2), Error, test::invalid_argument());
  CHECK_THROWS_MATCHES(DataParallel(make_mlp(1), 0), Error, test::invalid_argument());
  DataParallel dp(make_mlp(1), 2);
  CHECK_THROWS_MATCHES(dp.forward(Variable(Tensor(DataType::Float32, {}))), Error,
                       test::invalid_argument());
  // A batch of 0 rows goes to the module as is (one thread).
  CHECK(dp.forward(Variable(Tensor(DataType::Float32, {0, 6}))).value().shape() == Shape{0, 3});
}

}  // namespace
}  // namespace tutti::nn

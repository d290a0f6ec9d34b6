// SPDX-License-Identifier: Apache-2.0
// cross_entropy and mse_loss: values from closed forms, gradients against finite differences,
// argument errors.
#include "tutti/nn/losses.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/nn/nn_test_util.h"
#include "tutti/nn.h"

namespace tutti::nn {
namespace {

using test::check_gradients;
using test::invalid_argument;
using test::random_tensor;
using test::tensor;

Tensor labels(std::initializer_list<std::int64_t> values) {
  return Tensor::from(std::span<const std::int64_t>(values.begin(), values.size()),
                      {static_cast<std::int64_t>(values.size())});
}

float scalar(const Variable& v) {
  REQUIRE(v.value().shape() == Shape{});
  return v.value().span<float>()[0];
}

TEST_CASE("cross_entropy is the mean negative log-softmax of the labels", "[nn][losses]") {
  // Row 0: equal logits over 2 classes -> log 2. Row 1: -log(e^2 / (e^1 + e^2)).
  Variable logits(tensor({0, 0, 1, 2}, {2, 2}), true);
  const double row1 = -std::log(std::exp(2.0) / (std::exp(1.0) + std::exp(2.0)));
  Variable loss = cross_entropy(logits, labels({0, 1}));
  CHECK(scalar(loss) == Approx((std::log(2.0) + row1) / 2));

  // d/dx = (softmax - onehot) / n.
  loss.backward();
  const std::span<float> g = logits.grad().span<float>();
  const double p1 = std::exp(1.0) / (std::exp(1.0) + std::exp(2.0));
  CHECK(g[0] == Approx((0.5 - 1) / 2));
  CHECK(g[1] == Approx(0.5 / 2));
  CHECK(g[2] == Approx(p1 / 2));
  CHECK(g[3] == Approx((1 - p1 - 1) / 2));
}

TEST_CASE("cross_entropy stays finite for huge logits", "[nn][losses]") {
  Variable logits(tensor({1000, -1000, 0, 1000, -1000, 0}, {2, 3}), true);
  // Row 0 picks the maximum (loss ~0); row 1 a logit 2000 below it.
  Variable loss = cross_entropy(logits, labels({0, 1}));
  CHECK(std::isfinite(scalar(loss)));
  CHECK(scalar(loss) == Approx(1000.0));
  loss.backward();
  for (float g : logits.grad().span<float>()) CHECK(std::isfinite(g));
}

TEST_CASE("cross_entropy gradients match finite differences", "[nn][losses]") {
  Variable logits(random_tensor({4, 5}, 1, -2, 2), true);
  const Tensor y = labels({3, 0, 4, 3});
  check_gradients([&] { return cross_entropy(logits, y); }, {logits});
  // Composed with a layer, scaled by a later operation.
  Linear fc(3, 5);
  Variable x(random_tensor({4, 3}, 2), true);
  Variable two(tensor({2}, {}));
  check_gradients([&] { return cross_entropy(fc.forward(x), y) * two; },
                  {x, fc.weight(), fc.bias()});
}

TEST_CASE("cross_entropy rejects bad shapes, dtypes and labels", "[nn][losses]") {
  Variable logits(random_tensor({2, 3}, 1));
  CHECK_THROWS_MATCHES(cross_entropy(logits, Tensor(DataType::Int32, {2})), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(cross_entropy(logits, Tensor(DataType::Float32, {2})), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(cross_entropy(logits, labels({0, 1, 2})), Error, invalid_argument());
  CHECK_THROWS_MATCHES(cross_entropy(Variable(random_tensor({3}, 1)), labels({0, 1, 2})), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(cross_entropy(Variable(random_tensor({0, 3}, 1)), labels({})), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(cross_entropy(logits, labels({0, -1})), Error, invalid_argument());
  try {
    cross_entropy(logits, labels({0, 3}));
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("label 3 at position 1") != std::string::npos);
  }
}

TEST_CASE("mse_loss is the mean squared difference over all elements", "[nn][losses]") {
  Variable prediction(tensor({1, 2, 3, 4}, {2, 2}), true);
  Variable loss = mse_loss(prediction, tensor({0, 2, 5, 1}, {2, 2}));
  CHECK(scalar(loss) == Approx((1.0 + 0.0 + 4.0 + 9.0) / 4));
  loss.backward();
  // d/dx = 2 (x - t) / 4.
  const std::span<float> g = prediction.grad().span<float>();
  CHECK(std::vector<float>(g.begin(), g.end()) == std::vector<float>{0.5f, 0, -1, 1.5f});

  // Same element count, another shape: compared in row-major order.
  CHECK(scalar(mse_loss(prediction, tensor({1, 2, 3, 4}, {4}))) == 0.0f);

  Variable p(random_tensor({3, 4}, 1), true);
  const Tensor t = random_tensor({3, 4}, 2);
  check_gradients([&] { return mse_loss(p, t); }, {p});
}

TEST_CASE("mse_loss rejects a target of another size or dtype", "[nn][losses]") {
  Variable prediction(random_tensor({2, 2}, 1));
  CHECK_THROWS_MATCHES(mse_loss(prediction, random_tensor({5}, 1)), Error, invalid_argument());
  CHECK_THROWS_MATCHES(mse_loss(prediction, Tensor(DataType::Float64, {2, 2})), Error,
                       invalid_argument());
}

}  // namespace
}  // namespace tutti::nn

// SPDX-License-Identifier: Apache-2.0
// The differentiable functions: values by hand, gradients against finite differences.
#include "tutti/nn/functional.h"

#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/nn/nn_test_util.h"
#include "tutti/nn.h"

namespace tutti::nn {
namespace {

using test::check_gradients;
using test::distinct_tensor;
using test::invalid_argument;
using test::project;
using test::random_tensor;
using test::tensor;

std::vector<float> values(const Variable& v) {
  const std::span<float> s = v.value().span<float>();
  return {s.begin(), s.end()};
}

TEST_CASE("Element-wise arithmetic, with a single element broadcast on either side",
          "[nn][functional]") {
  Variable a(tensor({1, 2, 3, 4}, {2, 2}));
  Variable b(tensor({10, 20, 30, 40}, {2, 2}));
  Variable s(tensor({2}, {1}));
  Variable s0(tensor({3}, {}));

  CHECK(values(a + b) == std::vector<float>{11, 22, 33, 44});
  CHECK(values(a - b) == std::vector<float>{-9, -18, -27, -36});
  CHECK(values(a * b) == std::vector<float>{10, 40, 90, 160});
  CHECK((a + b).value().shape() == Shape{2, 2});

  CHECK(values(a * s) == std::vector<float>{2, 4, 6, 8});
  CHECK(values(s - a) == std::vector<float>{1, 0, -1, -2});
  CHECK((s - a).value().shape() == Shape{2, 2});
  CHECK(values(a + s0) == std::vector<float>{4, 5, 6, 7});
  CHECK((s * s0).value().shape() == Shape{1});  // Both single: a's shape.
  CHECK(values(s * s0) == std::vector<float>{6});

  CHECK_THROWS_MATCHES(a + Variable(tensor({1, 2}, {2})), Error, invalid_argument());
  CHECK_THROWS_MATCHES(Variable(tensor({1, 2, 3, 4}, {4})) * a, Error, invalid_argument());
}

TEST_CASE("Element-wise arithmetic gradients match finite differences", "[nn][functional]") {
  Variable a(random_tensor({2, 3}, 1), true);
  Variable b(random_tensor({2, 3}, 2), true);
  Variable s(random_tensor({1}, 3), true);
  Variable s0(random_tensor({}, 4), true);
  SECTION("same shape") {
    check_gradients([&] { return project(a + b); }, {a, b});
    check_gradients([&] { return project(a - b); }, {a, b});
    check_gradients([&] { return project(a * b); }, {a, b});
  }
  SECTION("broadcast right") {
    check_gradients([&] { return project(a + s); }, {a, s});
    check_gradients([&] { return project(a - s); }, {a, s});
    check_gradients([&] { return project(a * s); }, {a, s});
  }
  SECTION("broadcast left, 0-d") {
    check_gradients([&] { return project(s0 + b); }, {s0, b});
    check_gradients([&] { return project(s0 - b); }, {s0, b});
    check_gradients([&] { return project(s0 * b); }, {s0, b});
  }
  SECTION("closed form: d/ds sum(s * a) = sum(a), d/da = s") {
    Variable k(tensor({5}, {1}), true);
    Variable y(tensor({1, 2, 3}, {3}), true);
    sum(k * y - k).backward();
    CHECK(k.grad().span<float>()[0] == 3.0f);  // sum(y) - 3
    CHECK(y.grad().span<float>()[2] == 5.0f);
  }
}

TEST_CASE("matmul multiplies [m, k] x [k, n]", "[nn][functional]") {
  Variable a(tensor({1, 2, 3, 4, 5, 6}, {2, 3}));
  Variable b(tensor({7, 8, 9, 10, 11, 12}, {3, 2}));
  Variable c = matmul(a, b);
  CHECK(c.value().shape() == Shape{2, 2});
  // [1 2 3; 4 5 6] x [7 8; 9 10; 11 12]
  CHECK(values(c) == std::vector<float>{58, 64, 139, 154});

  Variable x(random_tensor({3, 4}, 5), true);
  Variable y(random_tensor({4, 2}, 6), true);
  check_gradients([&] { return project(matmul(x, y)); }, {x, y});

  CHECK_THROWS_MATCHES(matmul(a, a), Error, invalid_argument());
  CHECK_THROWS_MATCHES(matmul(Variable(tensor({1, 2, 3}, {3})), b), Error, invalid_argument());
}

TEST_CASE("relu clamps negatives and passes the gradient where positive", "[nn][functional]") {
  Variable x(tensor({-1, 0, 2, -3}, {2, 2}), true);
  CHECK(values(relu(x)) == std::vector<float>{0, 0, 2, 0});
  sum(relu(x)).backward();
  CHECK(std::vector<float>(x.grad().span<float>().begin(), x.grad().span<float>().end()) ==
        std::vector<float>{0, 0, 1, 0});

  Variable d(distinct_tensor({3, 4}, 7), true);  // No value near the kink.
  check_gradients([&] { return project(relu(d)); }, {d});
}

TEST_CASE("sum and mean reduce to a 0-d Variable", "[nn][functional]") {
  Variable x(tensor({1, 2, 3, 6}, {2, 2}), true);
  CHECK(sum(x).value().shape() == Shape{});
  CHECK(values(sum(x)) == std::vector<float>{12});
  CHECK(values(mean(x)) == std::vector<float>{3});
  mean(x).backward();
  CHECK(x.grad().span<float>()[3] == 0.25f);
  CHECK(std::isnan(mean(Variable(Tensor(DataType::Float32, {0}))).value().span<float>()[0]));

  Variable r(random_tensor({2, 3, 2}, 8), true);
  check_gradients([&] { return sum(r * r); }, {r});
  check_gradients([&] { return mean(r * r); }, {r});
}

TEST_CASE("reshape keeps row-major order and infers one -1", "[nn][functional]") {
  Variable x(tensor({1, 2, 3, 4, 5, 6}, {2, 3}), true);
  Variable y = reshape(x, {3, -1});
  CHECK(y.value().shape() == Shape{3, 2});
  CHECK(values(y) == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(reshape(x, {6}).value().shape() == Shape{6});

  check_gradients([&] { return project(reshape(x, {1, 6})); }, {x});
  check_gradients([&] { return project(reshape(x, {-1})); }, {x});

  auto invalid = invalid_argument();
  CHECK_THROWS_MATCHES(reshape(x, {4, 2}), Error, invalid);
  CHECK_THROWS_MATCHES(reshape(x, {-1, -1}), Error, invalid);
  CHECK_THROWS_MATCHES(reshape(x, {4, -1}), Error, invalid);
  CHECK_THROWS_MATCHES(reshape(x, {-2, 3}), Error, invalid);
}

TEST_CASE("The functions compose like the API.md example", "[nn][functional]") {
  // loss = mean((relu(x W) * scale + b - t)^2) + sum(relu(x W) * scale + b)
  Variable x(random_tensor({2, 4}, 9));
  Variable w(random_tensor({4, 3}, 10), true);
  Variable scale(tensor({1.5f}, {1}), true);
  Variable b(tensor({0.25f}, {1}), true);
  Variable t(random_tensor({2, 3}, 11));
  check_gradients(
      [&] {
        Variable y = relu(matmul(x, w)) * scale + b;
        Variable d = y - t;
        return mean(d * d) + sum(y);
      },
      {w, scale, b});
}

}  // namespace
}  // namespace tutti::nn

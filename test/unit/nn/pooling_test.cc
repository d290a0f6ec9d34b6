// SPDX-License-Identifier: Apache-2.0
// nn::MaxPool2d: window maxima and their gradients by hand, finite differences, argument errors.
#include "tutti/nn/pooling.h"

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
using test::values;

TEST_CASE("MaxPool2d takes window maxima and rounds the output size down", "[nn][pooling]") {
  MaxPool2d pool(2);
  Variable x(tensor({1, 2, 5, 6, 3, 4, 7, 8, 9, 10, 13, 14, 11, 12, 15, 16}, {1, 1, 4, 4}), true);
  Variable y = pool.forward(x);
  CHECK(y.value().shape() == Shape{1, 1, 2, 2});
  CHECK(values(y.value()) == std::vector<float>{4, 8, 12, 16});
  sum(y).backward();
  CHECK(values(x.grad()) == std::vector<float>{0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1});

  CHECK(pool.forward(Variable(random_tensor({2, 3, 5, 5}, 1))).value().shape() ==
        Shape{2, 3, 2, 2});

  SECTION("overlapping windows send the gradient of each to its maximum") {
    MaxPool2d overlapping(2, 1);
    Variable z(tensor({1, 5, 2, 4, 3, 6, 7, 9, 8}, {1, 1, 3, 3}), true);
    Variable out = overlapping.forward(z);
    CHECK(values(out.value()) == std::vector<float>{5, 6, 9, 9});
    sum(out).backward();
    CHECK(values(z.grad()) == std::vector<float>{0, 1, 0, 0, 0, 1, 0, 2, 0});
  }
}

TEST_CASE("MaxPool2d gradients match finite differences", "[nn][pooling]") {
  Variable x(distinct_tensor({2, 2, 5, 6}, 2), true);  // Distinct values: no ties to flip.
  MaxPool2d pool(2);
  check_gradients([&] { return project(pool.forward(x)); }, {x});
  MaxPool2d strided(3, 2);
  check_gradients([&] { return project(strided.forward(x)); }, {x});
}

TEST_CASE("MaxPool2d rejects bad sizes and inputs", "[nn][pooling]") {
  CHECK_THROWS_MATCHES(MaxPool2d(0), Error, invalid_argument());
  CHECK_THROWS_MATCHES(MaxPool2d(2, -1), Error, invalid_argument());
  MaxPool2d pool(3);
  CHECK_THROWS_MATCHES(pool.forward(Variable(random_tensor({1, 1, 2, 5}, 1))), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(pool.forward(Variable(random_tensor({1, 5, 5}, 1))), Error,
                       invalid_argument());
}

}  // namespace
}  // namespace tutti::nn

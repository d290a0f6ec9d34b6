// SPDX-License-Identifier: Apache-2.0
// nn::Linear: output by hand, gradients against finite differences, argument errors.
#include "tutti/nn/linear.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/nn/nn_test_util.h"
#include "tutti/nn.h"

namespace tutti::nn {
namespace {

using test::check_gradients;
using test::invalid_argument;
using test::project;
using test::random_tensor;
using test::set_values;
using test::tensor;
using test::values;

TEST_CASE("Linear computes x W^T + b", "[nn][linear]") {
  Linear fc(3, 2);
  CHECK(fc.weight().value().shape() == Shape{2, 3});
  CHECK(fc.bias().value().shape() == Shape{2});
  set_values(fc.weight(), {1, 2, 3, 4, 5, 6});
  set_values(fc.bias(), {0.5f, -1});
  Variable y = fc.forward(Variable(tensor({1, 0, -1, 2, 1, 0}, {2, 3})));
  CHECK(y.value().shape() == Shape{2, 2});
  // [1 0 -1] -> [1 - 3 + 0.5, 4 - 6 - 1]; [2 1 0] -> [2 + 2 + 0.5, 8 + 5 - 1]
  CHECK(values(y.value()) == std::vector<float>{-1.5f, -3, 4.5f, 12});

  Linear no_bias(3, 2, false);
  CHECK_FALSE(no_bias.bias().defined());
  CHECK(no_bias.named_parameters().size() == 1);
}

TEST_CASE("Linear gradients match finite differences", "[nn][linear]") {
  Linear fc(4, 3);
  Variable x(random_tensor({5, 4}, 1), true);
  check_gradients([&] { return project(fc.forward(x)); }, {x, fc.weight(), fc.bias()});

  SECTION("leading dimensions are batch dimensions") {
    Variable x3(random_tensor({2, 3, 4}, 2), true);
    CHECK(fc.forward(x3).value().shape() == Shape{2, 3, 3});
    check_gradients([&] { return project(fc.forward(x3)); }, {x3, fc.weight(), fc.bias()});
  }
  SECTION("without bias") {
    Linear plain(4, 2, false);
    check_gradients([&] { return project(plain.forward(x)); }, {x, plain.weight()});
  }
}

TEST_CASE("Linear rejects bad sizes and inputs", "[nn][linear]") {
  CHECK_THROWS_MATCHES(Linear(0, 2), Error, invalid_argument());
  CHECK_THROWS_MATCHES(Linear(2, -1), Error, invalid_argument());
  Linear fc(3, 2);
  CHECK_THROWS_MATCHES(fc.forward(Variable(random_tensor({2, 4}, 1))), Error, invalid_argument());
  CHECK_THROWS_MATCHES(fc.forward(Variable(random_tensor({}, 1))), Error, invalid_argument());
}

}  // namespace
}  // namespace tutti::nn

// SPDX-License-Identifier: Apache-2.0
// nn::Flatten: shapes, values and gradients.
#include "tutti/nn/flatten.h"

#include <catch2/catch.hpp>

#include "test/unit/nn/nn_test_util.h"
#include "tutti/nn.h"

namespace tutti::nn {
namespace {

using test::check_gradients;
using test::invalid_argument;
using test::project;
using test::random_tensor;
using test::values;

TEST_CASE("Flatten keeps the batch dimension", "[nn][flatten]") {
  Flatten flatten;
  Variable x(random_tensor({2, 3, 2}, 1), true);
  Variable y = flatten.forward(x);
  CHECK(y.value().shape() == Shape{2, 6});
  CHECK(values(y.value()) == values(x.value()));
  check_gradients([&] { return project(flatten.forward(x)); }, {x});
  CHECK(flatten.forward(Variable(random_tensor({4}, 1))).value().shape() == Shape{4, 1});
  CHECK_THROWS_MATCHES(flatten.forward(Variable(random_tensor({}, 1))), Error, invalid_argument());
}

}  // namespace
}  // namespace tutti::nn

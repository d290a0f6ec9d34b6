// SPDX-License-Identifier: Apache-2.0
// nn::Conv2d: outputs by hand (stride, padding, channels), gradients against finite
// differences, argument errors.
#include "tutti/nn/conv2d.h"

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

TEST_CASE("Conv2d computes the cross-correlation by hand", "[nn][conv2d]") {
  const Tensor image = tensor({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  SECTION("stride 1, no padding") {
    Conv2d conv(1, 1, 2);
    CHECK(conv.weight().value().shape() == Shape{1, 1, 2, 2});
    set_values(conv.weight(), {1, 2, 3, 4});
    set_values(conv.bias(), {0});
    Variable y = conv.forward(Variable(image));
    CHECK(y.value().shape() == Shape{1, 1, 2, 2});
    // [1 2; 4 5] . [1 2; 3 4] = 1 + 4 + 12 + 20, and so on.
    CHECK(values(y.value()) == std::vector<float>{37, 47, 67, 77});
  }
  SECTION("stride 2, zero padding 1") {
    Conv2d conv(1, 1, 2, 2, 1);
    set_values(conv.weight(), {1, 2, 3, 4});
    set_values(conv.bias(), {1});
    Variable y = conv.forward(Variable(image));
    CHECK(y.value().shape() == Shape{1, 1, 2, 2});
    // Windows of the zero-padded 5x5 image at (0,0), (0,2), (2,0), (2,2):
    // [0 0; 0 1] -> 4, [0 0; 2 3] -> 18, [0 4; 0 7] -> 36, [5 6; 8 9] -> 77; plus the bias.
    CHECK(values(y.value()) == std::vector<float>{5, 19, 37, 78});
  }
  SECTION("channels: a 1x1 kernel mixes channels per pixel") {
    Conv2d conv(2, 2, 1);
    set_values(conv.weight(), {1, 1, 2, -1});  // out0 = c0 + c1, out1 = 2 c0 - c1
    set_values(conv.bias(), {0, 1});
    Variable y = conv.forward(Variable(tensor({1, 2, 3, 4}, {1, 2, 1, 2})));
    CHECK(y.value().shape() == Shape{1, 2, 1, 2});
    CHECK(values(y.value()) == std::vector<float>{4, 6, 0, 1});
  }
}

TEST_CASE("Conv2d gradients match finite differences", "[nn][conv2d]") {
  SECTION("stride 1, no padding") {
    Conv2d conv(2, 3, 3);
    Variable x(random_tensor({2, 2, 4, 5}, 3), true);
    check_gradients([&] { return project(conv.forward(x)); }, {x, conv.weight(), conv.bias()});
  }
  SECTION("stride 2, padding 1") {
    Conv2d conv(2, 3, 3, 2, 1);
    Variable x(random_tensor({2, 2, 5, 5}, 4), true);
    CHECK(conv.forward(x).value().shape() == Shape{2, 3, 3, 3});
    check_gradients([&] { return project(conv.forward(x)); }, {x, conv.weight(), conv.bias()});
  }
  SECTION("stride 3, padding 2, uneven sizes, no bias") {
    Conv2d conv(1, 2, 2, 3, 2, false);
    Variable x(random_tensor({1, 1, 6, 4}, 5), true);
    CHECK(conv.forward(x).value().shape() == Shape{1, 2, 3, 3});
    check_gradients([&] { return project(conv.forward(x)); }, {x, conv.weight()});
  }
}

TEST_CASE("Conv2d rejects bad sizes and inputs", "[nn][conv2d]") {
  CHECK_THROWS_MATCHES(Conv2d(0, 1, 3), Error, invalid_argument());
  CHECK_THROWS_MATCHES(Conv2d(1, 1, 0), Error, invalid_argument());
  CHECK_THROWS_MATCHES(Conv2d(1, 1, 3, 0), Error, invalid_argument());
  CHECK_THROWS_MATCHES(Conv2d(1, 1, 3, 1, -1), Error, invalid_argument());
  Conv2d conv(2, 4, 3);
  CHECK_THROWS_MATCHES(conv.forward(Variable(random_tensor({1, 3, 5, 5}, 1))), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(conv.forward(Variable(random_tensor({2, 5, 5}, 1))), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(conv.forward(Variable(random_tensor({1, 2, 2, 5}, 1))), Error,
                       invalid_argument());
}

}  // namespace
}  // namespace tutti::nn

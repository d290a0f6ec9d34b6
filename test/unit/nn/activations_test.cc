// SPDX-License-Identifier: Apache-2.0
// nn::ReLU and nn::Dropout: values, masks and gradients, in training and evaluation mode.
#include "tutti/nn/activations.h"

#include <algorithm>
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
using test::values;

TEST_CASE("ReLU layer", "[nn][activations]") {
  ReLU layer;
  Variable x(distinct_tensor({3, 4}, 3), true);
  const std::vector<float> in = values(x.value());
  const std::vector<float> out = values(layer.forward(x).value());
  for (std::size_t i = 0; i < in.size(); ++i) CHECK(out[i] == std::max(in[i], 0.0f));
  check_gradients([&] { return project(layer.forward(x)); }, {x});
}

TEST_CASE("Dropout zeroes with probability p, scales by 1/(1-p), and is identity in eval",
          "[nn][activations]") {
  Dropout dropout(0.25);
  Variable x(random_tensor({100, 100}, 4, 0.5f, 1.5f), true);
  manual_seed(11);
  const std::vector<float> out = values(dropout.forward(x).value());
  const std::vector<float> in = values(x.value());
  int dropped = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (out[i] == 0.0f) {
      ++dropped;
    } else {
      CHECK(out[i] == Approx(in[i] / 0.75f));
    }
  }
  CHECK(dropped == Approx(2500).margin(200));  // 10000 draws of p = 0.25: sd ~43.

  SECTION("the mask is fixed by the seed and the gradient goes through it") {
    manual_seed(11);
    Variable y = dropout.forward(x);
    CHECK(values(y.value()) == out);
    sum(y).backward();
    const std::vector<float> grad = values(x.grad());
    for (std::size_t i = 0; i < in.size(); ++i) {
      CHECK(grad[i] == Approx(out[i] == 0.0f ? 0.0f : 1.0f / 0.75f));
    }
  }
  SECTION("finite differences with the mask held fixed") {
    Variable small(random_tensor({3, 5}, 5), true);
    check_gradients(
        [&] {
          manual_seed(12);
          return project(dropout.forward(small));
        },
        {small});
  }
  SECTION("evaluation mode and p = 0 pass the input through") {
    dropout.train(false);
    CHECK(values(dropout.forward(x).value()) == in);
    Variable small(random_tensor({3, 5}, 6), true);
    check_gradients([&] { return project(dropout.forward(small)); }, {small});
    Dropout none(0.0);
    CHECK(values(none.forward(x).value()) == in);
  }
  SECTION("p = 1 drops everything") {
    Dropout all(1.0);
    for (float v : values(all.forward(x).value())) CHECK(v == 0.0f);
  }
  CHECK_THROWS_MATCHES(Dropout(-0.1), Error, invalid_argument());
  CHECK_THROWS_MATCHES(Dropout(1.5), Error, invalid_argument());
  CHECK_THROWS_MATCHES(Dropout(std::nan("")), Error, invalid_argument());
}

}  // namespace
}  // namespace tutti::nn

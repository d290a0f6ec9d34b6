// SPDX-License-Identifier: Apache-2.0
// BatchNorm1d/2d: outputs and running statistics against closed forms, gradients against finite
// differences, in training and evaluation mode.
#include "tutti/nn/batch_norm.h"

#include <cmath>
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
using test::tensor;
using test::values;

constexpr double kEps = 1e-5;

TEST_CASE("BatchNorm1d registers PyTorch's parameters and buffers", "[nn][batch_norm]") {
  BatchNorm1d bn(3);
  const NamedParameters params = bn.named_parameters();
  const NamedParameters buffers = bn.named_buffers();
  REQUIRE(params.size() == 2);
  REQUIRE(buffers.size() == 2);
  CHECK(params[0].first == "weight");
  CHECK(params[1].first == "bias");
  CHECK(buffers[0].first == "running_mean");
  CHECK(buffers[1].first == "running_var");
  CHECK(values(params[0].second.value()) == std::vector<float>{1, 1, 1});
  CHECK(values(params[1].second.value()) == std::vector<float>{0, 0, 0});
  CHECK(values(buffers[0].second.value()) == std::vector<float>{0, 0, 0});
  CHECK(values(buffers[1].second.value()) == std::vector<float>{1, 1, 1});
  CHECK_FALSE(buffers[0].second.requires_grad());
}

TEST_CASE("BatchNorm1d normalizes with batch statistics and updates the running ones",
          "[nn][batch_norm]") {
  BatchNorm1d bn(2);
  const NamedParameters params = bn.named_parameters();
  const NamedParameters buffers = bn.named_buffers();
  std::copy_n(std::vector<float>{2, 0.5f}.begin(), 2,
              params[0].second.value().span<float>().begin());
  std::copy_n(std::vector<float>{1, -1}.begin(), 2, params[1].second.value().span<float>().begin());

  // Channel 0: 1 2 3 6, mean 3, biased variance 14/4, unbiased 14/3.
  // Channel 1: 10 20 30 40, mean 25, biased variance 500/4, unbiased 500/3.
  const Tensor x = tensor({1, 10, 2, 20, 3, 30, 6, 40}, {4, 2});
  const std::vector<float> y = values(bn.forward(Variable(x)).value());
  const double mean[2] = {3, 25};
  const double var[2] = {3.5, 125};
  const double weight[2] = {2, 0.5};
  const double bias[2] = {1, -1};
  const std::vector<float> in = values(x);
  for (int i = 0; i < 8; ++i) {
    const int c = i % 2;
    CHECK(y[i] == Approx((in[i] - mean[c]) / std::sqrt(var[c] + kEps) * weight[c] + bias[c]));
  }
  std::vector<float> running_mean = values(buffers[0].second.value());
  std::vector<float> running_var = values(buffers[1].second.value());
  CHECK(running_mean[0] == Approx(0.1 * 3));
  CHECK(running_mean[1] == Approx(0.1 * 25));
  CHECK(running_var[0] == Approx(0.9 + 0.1 * 14.0 / 3.0));
  CHECK(running_var[1] == Approx(0.9 + 0.1 * 500.0 / 3.0));

  // A second step moves another tenth of the way.
  bn.forward(Variable(x));
  running_mean = values(buffers[0].second.value());
  running_var = values(buffers[1].second.value());
  CHECK(running_mean[1] == Approx(0.9 * 2.5 + 0.1 * 25));
  CHECK(running_var[1] == Approx(0.9 * (0.9 + 0.1 * 500.0 / 3.0) + 0.1 * 500.0 / 3.0));

  SECTION("evaluation mode normalizes with the running statistics and leaves them alone") {
    bn.train(false);
    const std::vector<float> eval = values(bn.forward(Variable(x)).value());
    for (int i = 0; i < 8; ++i) {
      const int c = i % 2;
      CHECK(eval[i] ==
            Approx((in[i] - running_mean[c]) / std::sqrt(running_var[c] + kEps) * weight[c] +
                   bias[c]));
    }
    CHECK(values(buffers[0].second.value()) == running_mean);
    CHECK(values(buffers[1].second.value()) == running_var);
  }
}

TEST_CASE("BatchNorm1d on [n, c, l] and BatchNorm2d pool statistics over all but channels",
          "[nn][batch_norm]") {
  auto check_against_closed_form = [](Module& bn, const Tensor& x, std::int64_t n, std::int64_t c,
                                      std::int64_t inner) {
    const std::vector<float> y = values(bn.forward(Variable(x)).value());
    const std::vector<float> in = values(x);
    const std::vector<float> running_mean = values(bn.named_buffers()[0].second.value());
    const std::vector<float> running_var = values(bn.named_buffers()[1].second.value());
    const double m = static_cast<double>(n * inner);
    for (std::int64_t ch = 0; ch < c; ++ch) {
      double sum = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < inner; ++j) sum += in[(i * c + ch) * inner + j];
      }
      const double mean = sum / m;
      double squares = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < inner; ++j) {
          squares += std::pow(in[(i * c + ch) * inner + j] - mean, 2);
        }
      }
      CHECK(running_mean[ch] == Approx(0.1 * mean));
      CHECK(running_var[ch] == Approx(0.9 + 0.1 * squares / (m - 1)));
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < inner; ++j) {
          const std::int64_t at = (i * c + ch) * inner + j;
          CHECK(y[at] == Approx((in[at] - mean) / std::sqrt(squares / m + kEps)).margin(1e-5));
        }
      }
    }
  };
  BatchNorm1d bn1(3);
  check_against_closed_form(bn1, random_tensor({2, 3, 4}, 1, -2, 3), 2, 3, 4);
  BatchNorm2d bn2(2);
  check_against_closed_form(bn2, random_tensor({3, 2, 2, 3}, 2, 0, 5), 3, 2, 6);
}

TEST_CASE("BatchNorm gradients match finite differences", "[nn][batch_norm]") {
  SECTION("BatchNorm1d [n, c], training") {
    BatchNorm1d bn(3);
    Variable x(random_tensor({5, 3}, 3), true);
    check_gradients([&] { return project(bn.forward(x)); },
                    {x, bn.named_parameters()[0].second, bn.named_parameters()[1].second});
  }
  SECTION("BatchNorm1d [n, c, l], training") {
    BatchNorm1d bn(2);
    Variable x(random_tensor({3, 2, 4}, 4), true);
    check_gradients([&] { return project(bn.forward(x)); },
                    {x, bn.named_parameters()[0].second, bn.named_parameters()[1].second});
  }
  SECTION("BatchNorm2d, training") {
    BatchNorm2d bn(3);
    Variable x(random_tensor({2, 3, 2, 3}, 5), true);
    check_gradients([&] { return project(bn.forward(x)); },
                    {x, bn.named_parameters()[0].second, bn.named_parameters()[1].second});
  }
  SECTION("BatchNorm2d, evaluation") {
    BatchNorm2d bn(2);
    bn.forward(Variable(random_tensor({4, 2, 3, 3}, 6, -1, 4)));  // Non-trivial running stats.
    bn.train(false);
    Variable x(random_tensor({2, 2, 3, 3}, 7), true);
    check_gradients([&] { return project(bn.forward(x)); },
                    {x, bn.named_parameters()[0].second, bn.named_parameters()[1].second});
  }
}

TEST_CASE("An empty batch in training mode gives an empty output and keeps the buffers",
          "[nn][batch_norm]") {
  // As PyTorch's BatchNorm (before, InvalidArgument as for a single value per channel).
  BatchNorm1d bn1(3);
  const Variable y1 = bn1.forward(Variable(tensor({}, {0, 3})));
  CHECK(y1.value().shape() == Shape{0, 3});
  CHECK(values(bn1.named_buffers()[0].second.value()) == std::vector<float>(3, 0.0f));
  CHECK(values(bn1.named_buffers()[1].second.value()) == std::vector<float>(3, 1.0f));
  BatchNorm2d bn2(2);
  const Variable y2 = bn2.forward(Variable(tensor({}, {4, 2, 0, 3})));
  CHECK(y2.value().shape() == Shape{4, 2, 0, 3});
  CHECK(values(bn2.named_buffers()[0].second.value()) == std::vector<float>(2, 0.0f));
  CHECK(values(bn2.named_buffers()[1].second.value()) == std::vector<float>(2, 1.0f));
}

TEST_CASE("BatchNorm rejects bad sizes and inputs", "[nn][batch_norm]") {
  CHECK_THROWS_MATCHES(BatchNorm1d(0), Error, invalid_argument());
  CHECK_THROWS_MATCHES(BatchNorm2d(-2), Error, invalid_argument());
  BatchNorm1d bn1(3);
  CHECK_THROWS_MATCHES(bn1.forward(Variable(random_tensor({4, 2}, 1))), Error, invalid_argument());
  CHECK_THROWS_MATCHES(bn1.forward(Variable(random_tensor({4, 3, 2, 2}, 1))), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(bn1.forward(Variable(random_tensor({1, 3}, 1))), Error,
                       invalid_argument());  // One value per channel in training.
  bn1.train(false);
  CHECK(bn1.forward(Variable(random_tensor({1, 3}, 1))).value().shape() == Shape{1, 3});
  BatchNorm2d bn2(3);
  CHECK_THROWS_MATCHES(bn2.forward(Variable(random_tensor({4, 3, 2}, 1))), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(bn2.forward(Variable(random_tensor({4, 2, 2, 2}, 1))), Error,
                       invalid_argument());
}

}  // namespace
}  // namespace tutti::nn

// SPDX-License-Identifier: Apache-2.0
// Module and Sequential: registration, dotted names, train/eval, initialization and seeding.
#include "tutti/nn/module.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/nn/nn_test_util.h"
#include "tutti/nn.h"
#include "tutti/optim/sgd.h"

namespace tutti::nn {
namespace {

using test::invalid_argument;
using test::random_tensor;
using test::tensor;
using test::values;

std::vector<std::string> names(const NamedParameters& named) {
  std::vector<std::string> out;
  for (const auto& [name, v] : named) out.push_back(name);
  return out;
}

// A model in the shape of API.md's example: own parameter and buffer, then a child Sequential.
struct Net : Module {
  std::shared_ptr<Sequential> body;
  Variable scale;
  Net() {
    scale = register_parameter("scale", Variable(tensor({1}, {1})));
    auto seq = std::make_shared<Sequential>();
    seq->add(std::make_shared<Conv2d>(1, 2, 3, 1, 1))
        .add(std::make_shared<BatchNorm2d>(2))
        .add(std::make_shared<ReLU>())
        .add(std::make_shared<Flatten>())
        .add(std::make_shared<Dropout>(0.5))
        .add(std::make_shared<Linear>(2 * 4 * 4, 3, false));
    body = register_module("body", seq);
    register_buffer("steps", Variable(tensor({0}, {1})));
  }
  Variable forward(const Variable& input) override { return body->forward(input) * scale; }

  // Exposes the protected registration for the error tests.
  using Module::register_buffer;
  using Module::register_module;
  using Module::register_parameter;
};

TEST_CASE("named_parameters and named_buffers: own first, then children dotted, in order",
          "[nn][module]") {
  Net net;
  CHECK(names(net.named_parameters()) == std::vector<std::string>{"scale", "body.0.weight",
                                                                  "body.0.bias", "body.1.weight",
                                                                  "body.1.bias", "body.5.weight"});
  CHECK(names(net.named_buffers()) ==
        std::vector<std::string>{"steps", "body.1.running_mean", "body.1.running_var"});
  for (const auto& [name, p] : net.named_parameters()) CHECK(p.requires_grad());
  for (const auto& [name, b] : net.named_buffers()) CHECK_FALSE(b.requires_grad());

  // The Variables are shared with the model, not copies.
  net.named_parameters()[0].second.value().span<float>()[0] = 3.0f;
  CHECK(net.scale.value().span<float>()[0] == 3.0f);

  // A forward and backward pass reaches every parameter. (Except, in effect, the convolution's
  // bias: the training-mode BatchNorm after it subtracts the channel mean, which cancels it.)
  Variable out = net.forward(Variable(random_tensor({2, 1, 4, 4}, 1)));
  CHECK(out.value().shape() == Shape{2, 3});
  sum(out * out).backward();
  for (const auto& [name, p] : net.named_parameters()) {
    if (name == "body.0.bias") continue;
    INFO(name);
    double norm = 0;
    for (float g : p.grad().span<float>()) norm += std::abs(g);
    CHECK(norm > 0);
  }
}

TEST_CASE("A module registered twice (tied weights) lists its tensors once", "[nn][module]") {
  // y = w * (w * x): one Linear applied twice, as in PyTorch's weight tying.
  auto tied = std::make_shared<Linear>(1, 1, false);
  auto norm = std::make_shared<BatchNorm1d>(1);
  Sequential model;
  model.add(tied).add(norm).add(tied).add(norm);
  CHECK(names(model.named_parameters()) ==
        std::vector<std::string>{"0.weight", "1.weight", "1.bias"});  // Before: also "2.weight"...
  CHECK(names(model.named_buffers()) ==
        std::vector<std::string>{"1.running_mean", "1.running_var"});
  // So an optimizer built from the list steps the tied weight once: dL/dw = 2 w x for L = w^2 x.
  tied->weight().value().span<float>()[0] = 3.0f;
  std::vector<Variable> params;
  for (const auto& [name, p] : model.named_parameters()) params.push_back(p);
  optim::SGD sgd({params.front()}, {.lr = 0.1});
  Variable x(tensor({1}, {1, 1}));
  sum(tied->forward(tied->forward(x))).backward();
  CHECK(values(tied->weight().grad()) == std::vector<float>{6.0f});
  sgd.step();
  CHECK(values(tied->weight().value())[0] == Approx(3.0f - 0.1f * 6.0f));
}

TEST_CASE("set_requires_grad() freezes the whole tree; SGD steps only the rest", "[nn][module]") {
  Net net;
  net.body->set_requires_grad(false);
  for (const auto& [name, p] : net.named_parameters()) {
    INFO(name);
    CHECK(p.requires_grad() == (name == "scale"));
  }
  std::vector<Variable> params;
  for (const auto& [name, p] : net.named_parameters()) params.push_back(p);
  optim::SGD sgd(params, {.lr = 0.1});
  const std::vector<float> body_before =
      values(net.body->named_parameters().front().second.value());
  Variable y = sum(net.forward(Variable(random_tensor({2, 1, 4, 4}, 3))));
  y.backward();  // dL/dscale: the frozen body's output, summed.
  const float grad_scale = values(net.scale.grad())[0];
  sgd.step();
  CHECK(values(net.body->named_parameters().front().second.value()) == body_before);
  CHECK(values(net.scale.value())[0] == Approx(1.0f - 0.1f * grad_scale));
  CHECK(grad_scale != 0.0f);
  net.set_requires_grad(true);
  for (const auto& [name, p] : net.named_parameters()) CHECK(p.requires_grad());
}

TEST_CASE("train() switches the whole tree", "[nn][module]") {
  Net net;
  CHECK(net.is_training());
  CHECK(net.body->is_training());
  net.train(false);
  CHECK_FALSE(net.is_training());
  CHECK_FALSE(net.body->is_training());
  // Dropout (body.4) is now the identity: two evaluations agree.
  const Tensor x = random_tensor({2, 1, 4, 4}, 2);
  CHECK(values(net.forward(Variable(x)).value()) == values(net.forward(Variable(x)).value()));
  net.train();
  CHECK(net.body->is_training());
}

TEST_CASE("Registration rejects bad names and values", "[nn][module]") {
  Net net;
  Variable v(tensor({1}, {1}));
  CHECK_THROWS_MATCHES(net.register_parameter("scale", v), Error, invalid_argument());
  CHECK_THROWS_MATCHES(net.register_buffer("body", v), Error, invalid_argument());
  CHECK_THROWS_MATCHES(net.register_parameter("a.b", v), Error, invalid_argument());
  CHECK_THROWS_MATCHES(net.register_parameter("", v), Error, invalid_argument());
  CHECK_THROWS_MATCHES(net.register_parameter("empty", Variable()), Error, invalid_argument());
  CHECK_THROWS_MATCHES(net.register_parameter("result", sum(Variable(tensor({1}, {1}), true))),
                       Error, invalid_argument());
  CHECK_THROWS_MATCHES(net.register_buffer("trained", Variable(tensor({1}, {1}), true)), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(net.register_module("steps", std::make_shared<ReLU>()), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES(net.register_module("none", std::shared_ptr<ReLU>()), Error,
                       invalid_argument());
  // register_parameter turns requires_grad on, sharing the Variable.
  Variable extra(tensor({1, 2}, {2}));
  net.register_parameter("extra", extra);
  CHECK(extra.requires_grad());
  CHECK(extra.grad().shape() == Shape{2});
}

TEST_CASE("Sequential chains its layers and names them by position", "[nn][module]") {
  auto fc1 = std::make_shared<Linear>(3, 4);
  auto fc2 = std::make_shared<Linear>(4, 2);
  Sequential seq({fc1, std::make_shared<ReLU>()});
  CHECK(&seq.add(fc2) == &seq);
  CHECK(names(seq.named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  const Variable x(random_tensor({2, 3}, 3));
  CHECK(values(seq.forward(x).value()) == values(fc2->forward(relu(fc1->forward(x))).value()));
  CHECK(values(Sequential().forward(x).value()) == values(x.value()));
  CHECK_THROWS_MATCHES(seq.add(nullptr), Error, invalid_argument());
  CHECK_THROWS_MATCHES(Sequential({fc1, nullptr}), Error, invalid_argument());
}

TEST_CASE("Parameters start uniform in +-1/sqrt(fan_in)", "[nn][module]") {
  // `spread`: also check that the values cover the range (for tensors large enough that missing
  // its top and bottom 5% is improbable).
  auto check_range = [](const Variable& v, double fan_in, bool spread) {
    const double bound = 1.0 / std::sqrt(fan_in);
    float low = 0;
    float high = 0;
    for (float w : v.value().span<float>()) {
      CHECK(std::abs(w) <= bound);
      low = std::min(low, w);
      high = std::max(high, w);
    }
    if (spread) {
      CHECK(low < -0.9 * bound);
      CHECK(high > 0.9 * bound);
    }
  };
  Linear fc(50, 40);
  check_range(fc.weight(), 50, true);
  check_range(fc.bias(), 50, false);
  Conv2d conv(3, 40, 3);
  check_range(conv.weight(), 27, true);
  check_range(conv.bias(), 27, false);
}

TEST_CASE("manual_seed makes initialization reproducible", "[nn][module]") {
  manual_seed(42);
  Linear a(5, 4);
  Conv2d c(2, 3, 3);
  manual_seed(42);
  Linear b(5, 4);
  Conv2d d(2, 3, 3);
  CHECK(values(a.weight().value()) == values(b.weight().value()));
  CHECK(values(a.bias().value()) == values(b.bias().value()));
  CHECK(values(c.weight().value()) == values(d.weight().value()));
  manual_seed(43);
  Linear e(5, 4);
  CHECK(values(a.weight().value()) != values(e.weight().value()));
  // Consecutive layers draw different values from the one stream.
  manual_seed(42);
  Linear f(5, 4);
  Linear g(5, 4);
  CHECK(values(f.weight().value()) != values(g.weight().value()));
}

}  // namespace
}  // namespace tutti::nn

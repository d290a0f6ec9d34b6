// SPDX-License-Identifier: Apache-2.0
// The Optimizer base as user-defined rules see it, and an end-to-end descent through nn.
#include "tutti/optim/optimizer.h"

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/optim/optim_test_util.h"
#include "tutti/nn.h"
#include "tutti/optim/adam.h"
#include "tutti/optim/sgd.h"

namespace tutti::optim {
namespace {

using test::code_of;
using test::param;
using test::set_grad;
using test::values;

// The user-defined optimizer of shared/contract/training.cc.
class SignSGD : public Optimizer {
 public:
  SignSGD(std::vector<nn::Variable> params, double lr) : Optimizer(std::move(params)), lr_(lr) {}
  void step() override {
    for (const nn::Variable& p : parameters()) {
      nn::Variable v = p;  // Copies share the value and grad tensors.
      std::span<float> w = v.value().view().span<float>();
      std::span<float> g = v.grad().view().span<float>();
      for (std::size_t i = 0; i < w.size(); ++i) {
        w[i] -= static_cast<float>(lr_) * static_cast<float>((g[i] > 0) - (g[i] < 0));
      }
    }
  }

 private:
  double lr_;
};

TEST_CASE("A user-defined optimizer works through the base class", "[optimizer]") {
  nn::Variable a = param({1.0f, 1.0f, 1.0f});
  SignSGD opt({a}, 0.5);
  Optimizer& base = opt;
  REQUIRE(base.parameters().size() == 1);
  set_grad(a, {3.0f, -0.1f, 0.0f});
  base.step();
  CHECK(values(a) == std::vector<float>{0.5f, 1.5f, 1.0f});
  base.zero_grad();
  CHECK(values(a.grad()) == std::vector<float>{0.0f, 0.0f, 0.0f});
  // Default state: nothing; loading nothing is fine, loading something is not.
  const StateDict state = base.state_dict();
  CHECK(state.tensors.empty());
  CHECK(state.scalars.empty());
  base.load_state_dict(state);
  CHECK(code_of([&] {
          base.load_state_dict({.tensors = {}, .scalars = {{"lr", 1.0}}});
        }) == ErrorCode::InvalidArgument);
  CHECK(
      code_of([&] {
        base.load_state_dict({.tensors = {{"0.x", Tensor(DataType::Float32, {3})}}, .scalars = {}});
      }) == ErrorCode::InvalidArgument);
}

TEST_CASE("A rule without its own step_only() steps the others with zero gradients",
          "[optimizer]") {
  nn::Variable a = param({1.0f}), b = param({1.0f});
  SignSGD opt({a, b}, 0.5);
  set_grad(a, {2.0f});
  set_grad(b, {2.0f});
  opt.step_only({false, false});  // Nothing to step: step() does not run.
  CHECK(values(a)[0] == 1.0f);
  opt.step_only({true, false});  // b's gradient zeroed first: sign 0, no move.
  CHECK(values(a)[0] == 0.5f);
  CHECK(values(b)[0] == 1.0f);
  CHECK(values(b.grad())[0] == 0.0f);
  opt.step_only({true, true});  // step(): b's zero gradient stays zero.
  CHECK(values(a)[0] == 0.0f);
  CHECK(code_of([&] { opt.step_only({}); }) == ErrorCode::InvalidArgument);
}

TEST_CASE("Optimizer rejects an empty Variable", "[optimizer]") {
  CHECK(code_of([] { SignSGD({nn::Variable()}, 0.1); }) == ErrorCode::InvalidArgument);
}

TEST_CASE("Optimizer rejects a Variable listed twice, which would step it twice", "[optimizer]") {
  nn::Variable a = param({1.0f});
  nn::Variable b = param({2.0f});
  nn::Variable copy = a;  // A copy is the same parameter.
  CHECK(code_of([&] { SGD({a, b, copy}, {.lr = 0.1}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { SignSGD({b, b}, 0.1); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { Adam({a, b, a}); }) == ErrorCode::InvalidArgument);
  CHECK_NOTHROW(SGD({a, b}, {.lr = 0.1}));
}

TEST_CASE("zero_grad keeps the gradient tensors (views stay valid)", "[optimizer]") {
  nn::Variable a = param({1.0f, 2.0f});
  SGD sgd({a});
  const void* before = a.grad().data();
  set_grad(a, {5.0f, 6.0f});
  sgd.zero_grad();
  CHECK(a.grad().data() == before);
  CHECK(values(a.grad()) == std::vector<float>{0.0f, 0.0f});
}

TEST_CASE(
    "A grad() replaced by a tensor of another size or type: step() refuses it, zero_grad() "
    "replaces it",
    "[optimizer]") {
  // grad() is writable. Before, step() indexed a shorter gradient past its end (an empty one
  // crashed) and ignored a longer one.
  const std::vector<Tensor> bad = {Tensor(), Tensor(DataType::Float32, {1}),
                                   Tensor(DataType::Float32, {5}), Tensor(DataType::Float64, {4})};
  for (const Tensor& replacement : bad) {
    nn::Variable a = param({1.0f, 2.0f});
    nn::Variable b = param({1.0f, 2.0f, 3.0f, 4.0f});
    SGD sgd({a, b}, {.lr = 0.1, .momentum = 0.9});
    Adam adam({a, b});
    AdamW adamw({a, b});
    set_grad(a, {1.0f, 1.0f});
    b.grad() = replacement;
    for (Optimizer* opt : std::vector<Optimizer*>{&sgd, &adam, &adamw}) {
      std::string message;
      try {
        opt->step();
      } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::InvalidArgument);
        message = e.what();
      }
      CHECK(message.find("gradient of parameter 1 (shape [4])") != std::string::npos);
    }
    // Nothing moved and no state was made: the next good step is a first.
    CHECK(values(a) == std::vector<float>{1.0f, 2.0f});
    CHECK(values(a.grad()) == std::vector<float>{1.0f, 1.0f});
    CHECK(adam.state_dict().scalars.at("step") == 0);
    // zero_grad() replaces the bad gradient by zeros of the parameter's shape (PyTorch drops
    // it), so that the usual recovery, zero_grad() and the next backward(), works.
    adam.zero_grad();
    CHECK(values(a.grad()) == std::vector<float>{0.0f, 0.0f});
    CHECK(values(b.grad()) == std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f});
    set_grad(a, {1.0f, 1.0f});
    sgd.step();  // First step: the momentum buffer is the gradient; a moves by lr * 1.
    CHECK(values(a) == std::vector<float>{0.9f, 1.9f});
  }
}

TEST_CASE("SGD fits a linear model through nn's backward()", "[optimizer][nn]") {
  // y = 2 x0 - 3 x1 + 1, learned by a Linear(2, 1) with plain full-batch gradient descent.
  nn::manual_seed(3);
  nn::Linear model(2, 1);
  const std::vector<float> xs = {0, 0, 1, 0, 0, 1, 1, 1, -1, 2, 0.5f, -1};
  std::vector<float> ys;
  for (std::size_t i = 0; i < xs.size(); i += 2) ys.push_back(2 * xs[i] - 3 * xs[i + 1] + 1);
  const Tensor x = Tensor::from<float>(xs, {6, 2});
  const Tensor y = Tensor::from<float>(ys, {6, 1});
  std::vector<nn::Variable> params;
  for (const auto& [name, p] : model.named_parameters()) params.push_back(p);
  SGD sgd(params, {.lr = 0.1, .momentum = 0.5});
  float first = 0, last = 0;
  for (int i = 0; i < 300; ++i) {
    sgd.zero_grad();
    nn::Variable loss = nn::mse_loss(model.forward(x), y);
    loss.backward();
    sgd.step();
    (i == 0 ? first : last) = loss.value().span<float>()[0];
  }
  CHECK(last < 1e-6f);
  CHECK(first > 0.1f);
  CHECK(values(model.weight())[0] == Catch::Detail::Approx(2.0).margin(1e-3));
  CHECK(values(model.weight())[1] == Catch::Detail::Approx(-3.0).margin(1e-3));
  CHECK(values(model.bias())[0] == Catch::Detail::Approx(1.0).margin(1e-3));
}

}  // namespace
}  // namespace tutti::optim

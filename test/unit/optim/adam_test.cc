// SPDX-License-Identifier: Apache-2.0
// Adam and AdamW against the closed forms of their first two steps (torch.optim semantics).
#include "tutti/optim/adam.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/optim/optim_test_util.h"

namespace tutti::optim {
namespace {

using Catch::Detail::Approx;
using test::code_of;
using test::param;
using test::set_grad;
using test::values;

// Two steps of Adam on one element, in double, straight from the paper's formulas.
struct AdamReference {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  double p, m = 0, v = 0;
  int t = 0;
  void step(double g) {
    ++t;
    if (decoupled) {
      p *= 1 - lr * weight_decay;
    } else {
      g += weight_decay * p;
    }
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double m_hat = m / (1 - std::pow(beta1, t));
    const double v_hat = v / (1 - std::pow(beta2, t));
    p -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

TEST_CASE("Adam's first step is lr * g / (|g| + eps): bias correction undoes the decay", "[adam]") {
  nn::Variable p = param({1.0f, -1.0f, 0.5f, 2.0f});
  Adam adam({p}, {.lr = 0.01});
  set_grad(p, {0.3f, -2.0f, 1e-3f, 0.0f});
  adam.step();
  const std::vector<double> g = {0.3, -2.0, 1e-3, 0.0};
  const std::vector<double> p0 = {1.0, -1.0, 0.5, 2.0};
  for (std::size_t i = 0; i < g.size(); ++i) {
    // m1 = (1-b1) g, v1 = (1-b2) g^2; m1/(1-b1) = g, sqrt(v1/(1-b2)) = |g|.
    const double expected = p0[i] - 0.01 * g[i] / (std::abs(g[i]) + 1e-8);
    CHECK(values(p)[i] == Approx(expected).margin(1e-6));
  }
  // So |update| is lr for every nonzero gradient, whatever its scale (the "sign-ish" step).
  CHECK(values(p)[0] == Approx(0.99).margin(1e-6));
  CHECK(values(p)[1] == Approx(-0.99).margin(1e-6));
  CHECK(values(p)[3] == 2.0f);  // Zero gradient: no move.
}

TEST_CASE("Adam and AdamW match the closed form over two steps", "[adam]") {
  const bool decoupled = GENERATE(false, true);
  const double lr = 0.1, beta1 = 0.8, beta2 = 0.95, eps = 1e-3, wd = 0.2;
  AdamReference ref{lr, beta1, beta2, eps, wd, decoupled, 1.5};
  nn::Variable p = param({1.5f});
  std::unique_ptr<Optimizer> opt;
  if (decoupled) {
    opt = std::make_unique<AdamW>(
        std::vector<nn::Variable>{p},
        AdamWOptions{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd});
  } else {
    opt = std::make_unique<Adam>(
        std::vector<nn::Variable>{p},
        AdamOptions{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd});
  }
  for (double g : {0.7, -0.4}) {
    set_grad(p, {static_cast<float>(g)});
    opt->step();
    ref.step(g);
    CHECK(values(p)[0] == Approx(ref.p).margin(1e-6));
  }
  const StateDict state = opt->state_dict();
  CHECK(state.scalars.at("step") == 2);
  REQUIRE(state.tensors.size() == 2);
  CHECK(state.tensors[0].first == "0.exp_avg");
  CHECK(state.tensors[1].first == "0.exp_avg_sq");
  CHECK(values(state.tensors[0].second)[0] == Approx(ref.m).margin(1e-6));
  CHECK(values(state.tensors[1].second)[0] == Approx(ref.v).margin(1e-6));
}

TEST_CASE("Adam::step_only leaves the other parameters and their moments as they are", "[adam]") {
  const bool decoupled = GENERATE(false, true);
  const double lr = 0.1, beta1 = 0.8, beta2 = 0.95, eps = 1e-3, wd = 0.2;
  AdamReference ref{lr, beta1, beta2, eps, wd, decoupled, 1.5};
  nn::Variable a = param({1.5f}), b = param({-1.0f});
  std::unique_ptr<Optimizer> opt;
  if (decoupled) {
    opt = std::make_unique<AdamW>(
        std::vector<nn::Variable>{a, b},
        AdamWOptions{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd});
  } else {
    opt = std::make_unique<Adam>(
        std::vector<nn::Variable>{a, b},
        AdamOptions{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd});
  }
  opt->step_only({false, false});  // Nothing stepped: not even counted.
  CHECK(opt->state_dict().scalars.at("step") == 0);
  for (double g : {0.7, -0.4}) {
    set_grad(a, {static_cast<float>(g)});
    set_grad(b, {5.0f});
    opt->step_only({true, false});
    ref.step(g);
    CHECK(values(a)[0] == Approx(ref.p).margin(1e-6));
    CHECK(values(b)[0] == -1.0f);  // Weight decay and all.
  }
  const StateDict state = opt->state_dict();
  CHECK(state.scalars.at("step") == 2);
  REQUIRE(state.tensors.size() == 2);  // b has no moments: it never took a step.
  CHECK(state.tensors[0].first == "0.exp_avg");
  CHECK(state.tensors[1].first == "0.exp_avg_sq");
}

TEST_CASE("AdamW's first step decays the weight, then moves it by about lr", "[adam]") {
  nn::Variable p = param({2.0f});
  AdamW adamw({p}, {.lr = 0.01, .weight_decay = 0.5});
  set_grad(p, {-3.0f});
  adamw.step();
  CHECK(values(p)[0] == Approx(2.0 * (1 - 0.01 * 0.5) + 0.01 * 3.0 / (3.0 + 1e-8)).margin(1e-6));
}

TEST_CASE("Adam state_dict uses PyTorch's names and round-trips", "[adam][state]") {
  nn::Variable a = param({1.0f, 2.0f});
  nn::Variable b = param({3.0f});
  Adam adam({a, b}, {.lr = 0.02, .beta1 = 0.85, .weight_decay = 0.1});
  const StateDict fresh = adam.state_dict();
  CHECK(fresh.tensors.empty());
  CHECK(fresh.scalars == std::map<std::string, double>{{"lr", 0.02},
                                                       {"beta1", 0.85},
                                                       {"beta2", 0.999},
                                                       {"eps", 1e-8},
                                                       {"weight_decay", 0.1},
                                                       {"step", 0.0}});
  set_grad(a, {0.1f, -0.2f});
  set_grad(b, {0.3f});
  adam.step();
  const StateDict state = adam.state_dict();
  std::vector<std::string> keys;
  for (const auto& [key, tensor] : state.tensors) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"0.exp_avg", "0.exp_avg_sq", "1.exp_avg", "1.exp_avg_sq"});
  CHECK(state.scalars.at("step") == 1);

  nn::Variable a2(a.value().clone(), true);
  nn::Variable b2(b.value().clone(), true);
  Adam other({a2, b2});
  other.load_state_dict(state);
  CHECK(other.state_dict().scalars == state.scalars);
  for (auto [p, q] : {std::pair{a, a2}, std::pair{b, b2}}) {
    std::vector<float> g(values(p).size(), 0.25f);
    std::copy(g.begin(), g.end(), p.grad().span<float>().begin());
    std::copy(g.begin(), g.end(), q.grad().span<float>().begin());
  }
  adam.step();
  other.step();
  CHECK(values(a) == values(a2));
  CHECK(values(b) == values(b2));
}

TEST_CASE("Adam::load_state_dict rejects wrong keys, shapes and step counts", "[adam][state]") {
  nn::Variable a = param({1.0f, 2.0f});
  AdamW adam({a});
  set_grad(a, {1.0f, 1.0f});
  adam.step();
  const StateDict good = adam.state_dict();
  auto broken = [&](auto edit) {
    StateDict s = good;
    edit(s);
    return code_of([&] { adam.load_state_dict(s); });
  };
  CHECK(broken([](StateDict& s) { s.tensors[0].first = "0.momentum_buffer"; }) ==
        ErrorCode::InvalidArgument);
  CHECK(broken([](StateDict& s) { s.tensors[1].first = "2.exp_avg_sq"; }) ==
        ErrorCode::InvalidArgument);
  CHECK(broken([](StateDict& s) {
          s.tensors[0].second = Tensor(DataType::Float32, {2, 1});
        }) == ErrorCode::InvalidArgument);
  // One moment without the other (before, the missing one was read as zeros).
  CHECK(broken([](StateDict& s) { s.tensors.erase(s.tensors.begin() + 1); }) ==
        ErrorCode::InvalidArgument);
  CHECK(broken([](StateDict& s) { s.tensors.erase(s.tensors.begin()); }) ==
        ErrorCode::InvalidArgument);
  // Neither: the parameter has not stepped yet, which is a state to load.
  StateDict unstepped = good;
  unstepped.tensors.clear();
  CHECK_NOTHROW(adam.load_state_dict(unstepped));
  adam.load_state_dict(good);
  CHECK(broken([](StateDict& s) { s.scalars["step"] = 1.5; }) == ErrorCode::InvalidArgument);
  CHECK(broken([](StateDict& s) { s.scalars["step"] = -1; }) == ErrorCode::InvalidArgument);
  CHECK(broken([](StateDict& s) { s.scalars["beta2"] = 1.0; }) == ErrorCode::InvalidArgument);
  CHECK(broken([](StateDict& s) { s.scalars["momentum"] = 0.9; }) == ErrorCode::InvalidArgument);
  CHECK(adam.state_dict().scalars == good.scalars);
}

TEST_CASE("Adam and AdamW validate their options like PyTorch", "[adam]") {
  std::vector<nn::Variable> none;
  CHECK(code_of([&] { Adam(none, {.lr = -1}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { Adam(none, {.beta1 = 1.0}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { Adam(none, {.beta2 = -0.1}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { Adam(none, {.eps = -1e-8}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { AdamW(none, {.weight_decay = -0.01}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { AdamW(none, {.lr = std::nan("")}); }) == ErrorCode::InvalidArgument);
  CHECK(AdamW(none).options().weight_decay == 0.01);  // AdamW's default decay, as in PyTorch.
}

}  // namespace
}  // namespace tutti::optim

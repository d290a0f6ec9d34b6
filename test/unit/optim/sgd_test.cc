// SPDX-License-Identifier: Apache-2.0
// SGD against hand-computed steps of torch.optim.SGD's update rule.
#include "tutti/optim/sgd.h"

#include <map>
#include <string>
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

TEST_CASE("SGD without momentum: p -= lr * g", "[sgd]") {
  nn::Variable p = param({1.0f, -2.0f, 0.0f});
  SGD sgd({p}, {.lr = 0.1});
  set_grad(p, {0.5f, -1.0f, 3.0f});
  sgd.step();
  CHECK(values(p)[0] == Approx(1.0 - 0.1 * 0.5));
  CHECK(values(p)[1] == Approx(-2.0 + 0.1 * 1.0));
  CHECK(values(p)[2] == Approx(-0.3));
  CHECK(sgd.state_dict().tensors.empty());  // No momentum, no buffers.
}

TEST_CASE("SGD with momentum, Nesterov and weight decay: two steps by hand", "[sgd]") {
  const double lr = 0.1, m = 0.9, wd = 0.01;
  nn::Variable p = param({1.0f});
  SGD sgd({p}, {.lr = lr, .momentum = m, .weight_decay = wd, .nesterov = true});

  set_grad(p, {0.5f});
  sgd.step();
  // Step 1: d = g + wd p; the buffer starts as d; Nesterov: d + m * buf.
  const double d1 = 0.5 + wd * 1.0;
  const double buf1 = d1;
  const double p1 = 1.0 - lr * (d1 + m * buf1);
  CHECK(values(p)[0] == Approx(p1).epsilon(1e-6));
  CHECK(p1 == Approx(0.9031));  // The hand computation itself: 1 - 0.1 * (0.51 + 0.459).

  set_grad(p, {-0.2f});
  sgd.step();
  // Step 2: buf = m * buf + (1 - dampening) * d.
  const double d2 = -0.2 + wd * p1;
  const double buf2 = m * buf1 + d2;
  const double p2 = p1 - lr * (d2 + m * buf2);
  CHECK(values(p)[0] == Approx(p2).epsilon(1e-6));
  CHECK(p2 == Approx(0.89807411));
  REQUIRE(sgd.state_dict().tensors.size() == 1);
  CHECK(values(sgd.state_dict().tensors[0].second)[0] == Approx(buf2).epsilon(1e-6));
}

TEST_CASE("SGD with momentum and dampening: the first buffer is the undamped gradient", "[sgd]") {
  const double lr = 0.5, m = 0.8, damp = 0.25;
  nn::Variable p = param({2.0f, 1.0f});
  SGD sgd({p}, {.lr = lr, .momentum = m, .dampening = damp});
  set_grad(p, {1.0f, -4.0f});
  sgd.step();
  CHECK(values(p)[0] == Approx(2.0 - lr * 1.0));
  CHECK(values(p)[1] == Approx(1.0 + lr * 4.0));
  set_grad(p, {2.0f, 0.0f});
  sgd.step();
  const double buf0 = m * 1.0 + (1 - damp) * 2.0;
  const double buf1 = m * -4.0 + (1 - damp) * 0.0;
  CHECK(values(p)[0] == Approx(2.0 - lr * 1.0 - lr * buf0));
  CHECK(values(p)[1] == Approx(1.0 + lr * 4.0 - lr * buf1));
}

TEST_CASE("SGD state_dict uses PyTorch's names and round-trips", "[sgd][state]") {
  nn::Variable a = param({1.0f, 2.0f});
  nn::Variable b = param({3.0f});
  SGD sgd({a, b},
          {.lr = 0.05, .momentum = 0.9, .dampening = 0, .weight_decay = 1e-3, .nesterov = true});
  StateDict before = sgd.state_dict();
  CHECK(before.tensors.empty());  // Buffers appear with the first step, as in PyTorch.
  CHECK(before.scalars == std::map<std::string, double>{{"lr", 0.05},
                                                        {"momentum", 0.9},
                                                        {"dampening", 0.0},
                                                        {"weight_decay", 1e-3},
                                                        {"nesterov", 1.0}});
  set_grad(a, {0.1f, 0.2f});
  set_grad(b, {-0.3f});
  sgd.step();
  StateDict state = sgd.state_dict();
  REQUIRE(state.tensors.size() == 2);
  CHECK(state.tensors[0].first == "0.momentum_buffer");
  CHECK(state.tensors[1].first == "1.momentum_buffer");
  CHECK(state.tensors[1].second.shape() == Shape{1});

  // A second optimizer over copies of the parameters continues exactly like the first.
  nn::Variable a2(a.value().clone(), true);
  nn::Variable b2(b.value().clone(), true);
  SGD other({a2, b2}, {.lr = 1.0});
  other.load_state_dict(state);
  CHECK(other.options().lr == 0.05);
  CHECK(other.options().nesterov);
  set_grad(a, {0.4f, -0.5f});
  set_grad(b, {0.6f});
  set_grad(a2, {0.4f, -0.5f});
  set_grad(b2, {0.6f});
  sgd.step();
  other.step();
  CHECK(values(a) == values(a2));
  CHECK(values(b) == values(b2));

  // The state dict is a snapshot: stepping does not change it.
  CHECK(values(state.tensors[0].second) != values(sgd.state_dict().tensors[0].second));

  // Loading a dict without tensors drops the buffers (the next step starts them afresh).
  other.load_state_dict(before);
  CHECK(other.state_dict().tensors.empty());
}

TEST_CASE("SGD::load_state_dict rejects wrong keys and shapes and stays unchanged",
          "[sgd][state]") {
  nn::Variable a = param({1.0f, 2.0f});
  SGD sgd({a}, {.lr = 0.1, .momentum = 0.5});
  set_grad(a, {1.0f, 1.0f});
  sgd.step();
  const StateDict good = sgd.state_dict();
  auto with_tensor = [&](std::string key, Tensor t) {
    StateDict s = good;
    s.tensors = {{std::move(key), std::move(t)}};
    return s;
  };
  const Tensor two(DataType::Float32, {2});
  const std::vector<StateDict> bad = {
      with_tensor("0.exp_avg", two),                                     // Not SGD's state.
      with_tensor("1.momentum_buffer", two),                             // No parameter 1.
      with_tensor("momentum_buffer", two),                               // No index.
      with_tensor("x.momentum_buffer", two),                             // Not a number.
      with_tensor("0.", two),                                            // No name.
      with_tensor("0.momentum_buffer", Tensor(DataType::Float32, {3})),  // Wrong shape.
      with_tensor("0.momentum_buffer", Tensor(DataType::Float64, {2})),  // Wrong dtype.
  };
  for (const StateDict& s : bad) {
    CHECK(code_of([&] { sgd.load_state_dict(s); }) == ErrorCode::InvalidArgument);
  }
  StateDict twice = good;
  twice.tensors.push_back(twice.tensors.front());
  CHECK(code_of([&] { sgd.load_state_dict(twice); }) == ErrorCode::InvalidArgument);
  StateDict unknown_scalar = good;
  unknown_scalar.scalars["beta1"] = 0.9;
  CHECK(code_of([&] { sgd.load_state_dict(unknown_scalar); }) == ErrorCode::InvalidArgument);
  StateDict bad_nesterov = good;
  bad_nesterov.scalars["nesterov"] = 2;
  CHECK(code_of([&] { sgd.load_state_dict(bad_nesterov); }) == ErrorCode::InvalidArgument);
  StateDict negative_lr = good;
  negative_lr.scalars["lr"] = -1;
  CHECK(code_of([&] { sgd.load_state_dict(negative_lr); }) == ErrorCode::InvalidArgument);

  // Nothing of the failed loads stuck.
  const StateDict after = sgd.state_dict();
  CHECK(after.scalars == good.scalars);
  REQUIRE(after.tensors.size() == 1);
  CHECK(values(after.tensors[0].second) == values(good.tensors[0].second));
}

TEST_CASE("SGD validates its options like PyTorch", "[sgd]") {
  std::vector<nn::Variable> none;
  CHECK(code_of([&] { SGD(none, {.lr = -0.1}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { SGD(none, {.momentum = -0.5}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { SGD(none, {.weight_decay = -1}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { SGD(none, {.nesterov = true}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { SGD(none, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}); }) ==
        ErrorCode::InvalidArgument);
  SGD sgd(none);
  CHECK(code_of([&] { sgd.set_lr(-1); }) == ErrorCode::InvalidArgument);
  sgd.set_lr(0.5);
  CHECK(sgd.state_dict().scalars.at("lr") == 0.5);
}

TEST_CASE("SGD::step_only leaves the other parameters and their buffers as they are", "[sgd]") {
  nn::Variable a = param({1.0f}), b = param({1.0f});
  SGD sgd({a, b}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5});
  set_grad(a, {1.0f});
  set_grad(b, {1.0f});
  sgd.step();  // d = 1 + 0.5 * 1 = 1.5 = the buffers; a = b = 1 - 0.15 = 0.85.
  set_grad(a, {1.0f});
  set_grad(b, {100.0f});  // Not read: b is left out.
  sgd.step_only({true, false});
  // a: d = 1 + 0.5 * 0.85 = 1.425, buffer 0.9 * 1.5 + 1.425 = 2.775, a = 0.85 - 0.2775.
  CHECK(values(a)[0] == Approx(0.85 - 0.2775));
  CHECK(values(b)[0] == Approx(0.85));
  const StateDict state = sgd.state_dict();
  REQUIRE(state.tensors.size() == 2);
  CHECK(values(state.tensors[0].second)[0] == Approx(2.775));
  CHECK(values(state.tensors[1].second)[0] == Approx(1.5));  // b's buffer untouched.
  // Left out, a gradient step() would refuse is not checked either; one flag per parameter.
  b.grad() = Tensor();
  sgd.step_only({true, false});
  CHECK(values(b)[0] == Approx(0.85));
  CHECK(code_of([&] { sgd.step_only({true}); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { sgd.step_only({true, true}); }) == ErrorCode::InvalidArgument);
}

TEST_CASE("SGD skips parameters that do not require grad", "[sgd]") {
  nn::Variable frozen(Tensor::from<float>(std::vector<float>{1.0f}, {1}));
  nn::Variable p = param({1.0f});
  SGD sgd({frozen, p}, {.lr = 1.0, .momentum = 0.9});
  set_grad(p, {1.0f});
  sgd.zero_grad();
  CHECK(values(p.grad())[0] == 0.0f);
  set_grad(p, {1.0f});
  sgd.step();
  CHECK(values(frozen)[0] == 1.0f);
  CHECK(values(p)[0] == 0.0f);
  REQUIRE(sgd.state_dict().tensors.size() == 1);
  CHECK(sgd.state_dict().tensors[0].first == "1.momentum_buffer");
}

}  // namespace
}  // namespace tutti::optim

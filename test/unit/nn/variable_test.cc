// SPDX-License-Identifier: Apache-2.0
// nn::Variable: leaves, backward(), gradient accumulation and Note [Hook timing].
#include "tutti/nn/variable.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/nn/nn_test_util.h"
#include "tutti/nn.h"

namespace tutti::nn {
namespace {

using test::invalid_argument;
using test::random_tensor;
using test::tensor;
using test::values;

bool all_zero(const Tensor& t) {
  for (float v : t.span<float>()) {
    if (v != 0.0f) return false;
  }
  return true;
}

TEST_CASE("A leaf shares its value and starts with a zero gradient", "[nn][variable]") {
  Tensor t = tensor({1, 2, 3}, {3});
  Variable plain(t);
  CHECK(plain.defined());
  CHECK(plain.is_leaf());
  CHECK_FALSE(plain.requires_grad());
  CHECK(plain.grad().num_elements() == 0);
  CHECK(plain.value().data() == t.data());

  Variable w(t, true);
  CHECK(w.requires_grad());
  CHECK(w.grad().shape() == Shape{3});
  CHECK(all_zero(w.grad()));

  Variable copy = w;  // Copies share value and gradient.
  copy.grad().span<float>()[1] = 5.0f;
  CHECK(w.grad().span<float>()[1] == 5.0f);
}

TEST_CASE("Variable rejects tensors that are not float32", "[nn][variable]") {
  try {
    Variable v(Tensor(DataType::Float64, {2}));
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("float64") != std::string::npos);
  }
  CHECK_THROWS_MATCHES(Variable(Tensor(DataType::Int64, {2})), Error, invalid_argument());
  CHECK_THROWS_MATCHES(Variable(Tensor()), Error, invalid_argument());
  CHECK(Variable(Tensor(DataType::Float32, {0})).value().num_elements() == 0);
}

TEST_CASE("An empty Variable throws InvalidArgument from its accessors", "[nn][variable]") {
  Variable empty;
  CHECK_FALSE(empty.defined());
  CHECK_FALSE(empty.is_leaf());
  CHECK_THROWS_MATCHES(empty.value(), Error, invalid_argument());
  CHECK_THROWS_MATCHES(empty.backward(), Error, invalid_argument());
  CHECK_THROWS_MATCHES(relu(empty), Error, invalid_argument());
}

TEST_CASE("backward() accumulates d/dw sum(w * w) = 2w, and adds again when repeated",
          "[nn][variable]") {
  Variable w(tensor({1, -2, 3}, {3}), true);
  Variable loss = sum(w * w);
  CHECK(loss.value().span<float>()[0] == 14.0f);
  CHECK_FALSE(loss.is_leaf());
  CHECK(loss.requires_grad());
  loss.backward();
  CHECK(values(w.grad()) == std::vector<float>{2, -4, 6});
  CHECK(loss.grad().num_elements() == 0);  // Only leaves accumulate.
  loss.backward();
  CHECK(values(w.grad()) == std::vector<float>{4, -8, 12});
}

TEST_CASE("set_requires_grad(false) freezes a leaf; true trains it again", "[nn][variable]") {
  // d/dw sum(w * x + b) = x, d/db = 1, for w frozen in the middle pass only.
  Variable w(tensor({1, 2}, {2}), true);
  Variable b(tensor({0, 0}, {2}), true);
  const Variable x(tensor({3, -4}, {2}));
  int w_hooks = 0;
  w.register_grad_hook([&w_hooks](Variable&) { ++w_hooks; });
  sum(w * x + b).backward();
  CHECK(values(w.grad()) == std::vector<float>{3, -4});
  CHECK(w_hooks == 1);

  w.set_requires_grad(false);
  CHECK_FALSE(w.requires_grad());
  CHECK(w.grad().num_elements() == 0);
  sum(w * x + b).backward();  // b still requires grad.
  CHECK(w.grad().num_elements() == 0);
  CHECK(w_hooks == 1);
  CHECK(values(b.grad()) == std::vector<float>{2, 2});
  // A graph recorded while w required grad runs without it.
  w.set_requires_grad(true);
  Variable recorded = sum(w * x + b);
  w.set_requires_grad(false);
  recorded.backward();
  CHECK(w.grad().num_elements() == 0);
  CHECK(values(b.grad()) == std::vector<float>{3, 3});

  w.set_requires_grad(true);
  CHECK(values(w.grad()) == std::vector<float>{0, 0});  // Fresh zeros, nothing kept.
  sum(w * x + b).backward();
  CHECK(values(w.grad()) == std::vector<float>{3, -4});
  CHECK(w_hooks == 2);
  // A graph of frozen leaves alone has nothing to differentiate.
  w.set_requires_grad(false);
  b.set_requires_grad(false);
  CHECK_THROWS_MATCHES(sum(w * x + b).backward(), Error, invalid_argument());
}

TEST_CASE("set_requires_grad() refuses an empty Variable and an operation's result",
          "[nn][variable]") {
  CHECK_THROWS_MATCHES(Variable().set_requires_grad(false), Error, invalid_argument());
  Variable w(tensor({1}, {1}), true);
  CHECK_THROWS_MATCHES((w * w).set_requires_grad(false), Error, invalid_argument());
  CHECK_THROWS_MATCHES((w * w).set_requires_grad(true), Error, invalid_argument());
  CHECK(w.requires_grad());
}

TEST_CASE("backward() on a scalar leaf adds one", "[nn][variable]") {
  Variable w(tensor({3}, {1}), true);
  int calls = 0;
  w.register_grad_hook([&calls](Variable&) { ++calls; });
  w.backward();
  CHECK(values(w.grad()) == std::vector<float>{1});
  CHECK(calls == 1);
}

TEST_CASE("backward() needs one element and a graph that requires grad", "[nn][variable]") {
  Variable w(tensor({1, 2}, {2}), true);
  CHECK_THROWS_MATCHES((w * w).backward(), Error, invalid_argument());
  Variable constant(tensor({1, 2}, {2}));
  Variable no_grad = sum(constant * constant);
  CHECK_FALSE(no_grad.requires_grad());
  CHECK(no_grad.is_leaf());  // Nothing required grad, so nothing was recorded.
  CHECK_THROWS_MATCHES(no_grad.backward(), Error, invalid_argument());
}

TEST_CASE("A grad() replaced by an empty tensor or another dtype is refused, not written",
          "[nn][variable]") {
  // An empty Tensor has the scalar shape []: a scalar leaf's shape check alone let it through,
  // and the gradient was added into no storage. A grad() of another dtype has the right shape.
  Variable scalar(tensor({2}, {}), true);
  scalar.grad() = Tensor();
  CHECK_THROWS_WITH((scalar * scalar).backward(), Catch::Contains("an empty tensor"));
  Variable w(tensor({1, 2}, {2}), true);
  w.grad() = Tensor::from<std::int8_t>(std::vector<std::int8_t>{0, 0}, {2});
  CHECK_THROWS_WITH(sum(w * w).backward(), Catch::Contains("it must stay float32"));
  w.grad() = tensor({0, 0}, {2});
  sum(w * w).backward();
  CHECK(values(w.grad()) == std::vector<float>{2, 4});
}

TEST_CASE("Inputs that do not require grad receive nothing", "[nn][variable]") {
  Variable x(tensor({1, 2}, {2}));
  Variable w(tensor({3, 4}, {2}), true);
  sum(x * w).backward();
  CHECK(x.grad().num_elements() == 0);
  CHECK(values(w.grad()) == std::vector<float>{1, 2});
}

TEST_CASE("Hooks need a leaf that requires grad", "[nn][variable]") {
  Variable w(tensor({1}, {1}), true);
  CHECK_THROWS_MATCHES(Variable(tensor({1}, {1})).register_grad_hook([](Variable&) {}), Error,
                       invalid_argument());
  CHECK_THROWS_MATCHES((w * w).register_grad_hook([](Variable&) {}), Error, invalid_argument());
  CHECK_THROWS_MATCHES(w.register_grad_hook(nullptr), Error, invalid_argument());
}

// See Note [Hook timing] in src/nn/backward_walk.cc.
TEST_CASE("The last layer's hooks fire before backward reaches the first layer",
          "[nn][variable][hooks]") {
  manual_seed(3);
  Sequential model({std::make_shared<Linear>(4, 8), std::make_shared<ReLU>(),
                    std::make_shared<Linear>(8, 6), std::make_shared<ReLU>(),
                    std::make_shared<Linear>(6, 3)});
  NamedParameters params = model.named_parameters();
  REQUIRE(params.size() == 6);
  Variable first_weight = params[0].second;  // "0.weight"

  std::vector<std::string> order;
  std::vector<bool> first_layer_untouched;  // Whether 0.weight's grad was zero at each hook.
  for (auto& [name, p] : params) {
    p.register_grad_hook([&, name = name](Variable& v) {
      order.push_back(name);
      first_layer_untouched.push_back(all_zero(first_weight.grad()));
      CHECK(v.grad().shape() == v.value().shape());
    });
  }
  Tensor labels(DataType::Int64, {5});
  labels.span<std::int64_t>()[1] = 2;
  cross_entropy(model.forward(Variable(random_tensor({5, 4}, 1))), labels).backward();

  REQUIRE(order.size() == 6);  // Each hook once.
  CHECK(order ==
        std::vector<std::string>{"4.weight", "4.bias", "2.weight", "2.bias", "0.weight", "0.bias"});
  // When the last layers' hooks ran, the first layer had not been differentiated yet.
  CHECK(first_layer_untouched == std::vector<bool>{true, true, true, true, false, false});
}

TEST_CASE("A shared leaf gets every contribution before its single hook call",
          "[nn][variable][hooks]") {
  // loss = sum(relu(w * a) * c) + sum(w * b): w is used twice, in distant parts of the graph.
  // With w, a > 0, d loss / dw = a * c + b.
  Variable w(tensor({1, 2, 3}, {3}), true);
  Variable a(tensor({2, 1, 0.5f}, {3}));
  Variable b(tensor({10, 20, 30}, {3}));
  Variable c(tensor({1, -1, 4}, {3}));
  int calls = 0;
  std::vector<float> seen;
  w.register_grad_hook([&](Variable& v) {
    ++calls;
    seen = values(v.grad());
  });
  Variable loss = sum(relu(w * a) * c) + sum(w * b);
  loss.backward();
  CHECK(calls == 1);
  CHECK(seen == std::vector<float>{12, 19, 32});
  CHECK(values(w.grad()) == seen);

  // Used twice by one operation.
  calls = 0;
  std::fill(w.grad().span<float>().begin(), w.grad().span<float>().end(), 0.0f);
  sum(w * w).backward();
  CHECK(calls == 1);
  CHECK(seen == std::vector<float>{2, 4, 6});
}

TEST_CASE("A leaf backward does not reach fires no hook", "[nn][variable][hooks]") {
  Variable used(tensor({1}, {1}), true);
  Variable unused(tensor({1}, {1}), true);
  int calls = 0;
  unused.register_grad_hook([&calls](Variable&) { ++calls; });
  sum(used * used).backward();
  CHECK(calls == 0);
  CHECK(all_zero(unused.grad()));
}

TEST_CASE("A hook may modify the gradient it is given", "[nn][variable][hooks]") {
  Variable w(tensor({1, 2}, {2}), true);
  w.register_grad_hook([](Variable& v) {
    for (float& g : v.grad().span<float>()) g *= 10.0f;
  });
  sum(w).backward();
  CHECK(values(w.grad()) == std::vector<float>{10, 10});
}

}  // namespace
}  // namespace tutti::nn

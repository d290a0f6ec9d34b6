// SPDX-License-Identifier: Apache-2.0
// DistributedOptimizer's local checks, which need no runtime: construction never communicates,
// so argument errors can be tested in one process. Reductions are tested in test/mpi/training.
#include "tutti/optim/distributed_optimizer.h"

#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/optim/optim_test_util.h"
#include "tutti/optim/sgd.h"

namespace tutti::optim {
namespace {

using test::code_of;
using test::param;
using test::set_grad;
using test::values;

struct Model {
  nn::Variable w = param({1.0f, 2.0f});
  nn::Variable b = param({0.5f});
  nn::Variable c = param({3.0f});
  nn::NamedParameters named() const { return {{"w", w}, {"b", b}, {"c", c}}; }
  std::vector<nn::Variable> list() const { return {w, b, c}; }
};

TEST_CASE("DistributedOptimizer is built without the runtime and delegates to the inner one",
          "[distributed]") {
  Model m;
  SGD sgd(m.list(), {.lr = 0.1, .momentum = 0.9});
  DistributedOptimizer dist(sgd, m.named());
  CHECK(&dist.inner() == &sgd);
  REQUIRE(dist.parameters().size() == 3);
  CHECK(&dist.parameters()[1].value() == &m.b.value());
  CHECK(dist.state_dict().scalars == sgd.state_dict().scalars);
  set_grad(m.w, {1.0f, 1.0f});
  dist.zero_grad();  // Nothing in flight: zeroes through the inner optimizer.
  CHECK(values(m.w.grad()) == std::vector<float>{0.0f, 0.0f});
  StateDict state = dist.state_dict();
  state.scalars["lr"] = 0.25;
  dist.load_state_dict(state);
  CHECK(sgd.options().lr == 0.25);
  {
    auto guard = dist.skip_synchronize();
    auto nested = dist.skip_synchronize();
  }
  DistributedOptimizer unnamed(sgd, {});  // Names "noname.<i>".
}

TEST_CASE("DistributedOptimizer rejects bad names", "[distributed]") {
  Model m;
  SGD sgd(m.list());
  nn::NamedParameters duplicate = {{"w", m.w}, {"w", m.b}, {"c", m.c}};
  CHECK(code_of([&] { DistributedOptimizer(sgd, duplicate); }) == ErrorCode::InvalidArgument);
  nn::NamedParameters partial = {{"w", m.w}, {"b", m.b}};
  CHECK(code_of([&] { DistributedOptimizer(sgd, partial); }) == ErrorCode::InvalidArgument);
  nn::NamedParameters with_empty = {{"w", m.w}, {"b", m.b}, {"c", m.c}, {"e", nn::Variable()}};
  CHECK(code_of([&] { DistributedOptimizer(sgd, with_empty); }) == ErrorCode::InvalidArgument);
  // Names of variables the optimizer does not own are ignored.
  nn::NamedParameters extra = m.named();
  extra.emplace_back("other", param({1.0f}));
  CHECK_NOTHROW(DistributedOptimizer(sgd, extra));
  // (An inner optimizer cannot hold the same parameter twice: Optimizer refuses it.)
}

TEST_CASE("DistributedOptimizer rejects bad options", "[distributed]") {
  Model m;
  SGD sgd(m.list());
  auto build = [&](DistributedOptions o) {
    return code_of([&] { DistributedOptimizer(sgd, m.named(), std::move(o)); });
  };
  CHECK(build({.op = ReduceOp::Min}) == ErrorCode::InvalidArgument);
  CHECK(build({.op = ReduceOp::Max}) == ErrorCode::InvalidArgument);
  CHECK(build({.op = ReduceOp::Product}) == ErrorCode::InvalidArgument);
  CHECK(build({.compression = static_cast<Compression>(7)}) == ErrorCode::InvalidArgument);
  CHECK(build({.backward_passes_per_step = 0}) == ErrorCode::InvalidArgument);
  CHECK(build({.gradient_predivide_factor = 0}) == ErrorCode::InvalidArgument);
  CHECK(build({.gradient_predivide_factor = -2}) == ErrorCode::InvalidArgument);
  CHECK(build({.op = ReduceOp::Sum, .gradient_predivide_factor = 2}) == ErrorCode::InvalidArgument);
  CHECK(build({.num_groups = -1}) == ErrorCode::InvalidArgument);
  CHECK(build({.num_groups = 2, .groups = {{"w"}}}) == ErrorCode::InvalidArgument);
  CHECK(build({.groups = {{"w", "nope"}}}) == ErrorCode::InvalidArgument);
  CHECK(build({.groups = {{"w", "b"}, {"b"}}}) == ErrorCode::InvalidArgument);
  CHECK(build({.groups = {{"w", "w"}}}) == ErrorCode::InvalidArgument);
  CHECK(build({.groups = {{"w"}, {}}}) == ErrorCode::InvalidArgument);
  CHECK(build({.op = ReduceOp::Sum}) == ErrorCode::Internal);  // Internal: nothing thrown.
  CHECK(build({.op = ReduceOp::Adasum, .compression = Compression::BF16}) == ErrorCode::Internal);
  CHECK(build({.gradient_predivide_factor = 4, .num_groups = 10}) == ErrorCode::Internal);
  CHECK(build({.groups = {{"c", "w"}}}) == ErrorCode::Internal);
}

TEST_CASE("A group naming a frozen parameter is refused as frozen, not as unknown",
          "[distributed]") {
  Model m;
  const nn::Variable frozen(Tensor::from<float>(std::vector<float>{4.0f}, {1}), false);
  SGD sgd({m.w, m.b, m.c, frozen});
  nn::NamedParameters named = m.named();
  named.emplace_back("frozen", frozen);
  std::string message;
  try {
    DistributedOptimizer(sgd, named, {.groups = {{"w"}, {"b", "frozen"}}});
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    message = e.what();
  }
  CHECK(message.find("group 1 names 'frozen', a frozen parameter") != std::string::npos);
  CHECK(message.find("not a parameter") == std::string::npos);
  // Without it in a group, the frozen parameter is simply not reduced.
  CHECK_NOTHROW(DistributedOptimizer(sgd, named, {.groups = {{"w"}, {"b"}}}));
}

}  // namespace
}  // namespace tutti::optim

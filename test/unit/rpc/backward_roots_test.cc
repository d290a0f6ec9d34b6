// SPDX-License-Identifier: Apache-2.0
// The engine's entry points for distributed autograd (src/nn/autograd.h): a backward pass from
// several seeded roots into a sink, and source nodes, against Variable::backward() on the
// equivalent scalar loss (sum over roots of <seed, root>).
#include <map>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "src/nn/autograd.h"
#include "test/support/error_of.h"
#include "test/support/rpc_functions.h"
#include "tutti/nn.h"

namespace tutti::test {
namespace {

using nn::Variable;
using nn::detail::RootGradient;
using nn::detail::VariableAccess;
using nn::detail::VariableImpl;

// Sums the sink's contributions per leaf.
struct Sums {
  std::map<const VariableImpl*, Tensor> by_leaf;
  nn::detail::LeafSink sink() {
    return [this](const std::shared_ptr<VariableImpl>& leaf, const Tensor& g) {
      auto it = by_leaf.find(leaf.get());
      if (it == by_leaf.end()) {
        by_leaf.emplace(leaf.get(), g.clone());
        return;
      }
      for (std::size_t i = 0; i < g.span<float>().size(); ++i)
        it->second.span<float>()[i] += g.span<float>()[i];
    };
  }
  Tensor of(const Variable& leaf) const { return by_leaf.at(VariableAccess::impl(leaf).get()); }
};

TEST_CASE("A backward pass from several seeded roots equals the one of the summed loss",
          "[nn][dist_autograd]") {
  const Tensor vx = filled({2, 2}, 0.5f, 0.5f), vw = filled({2, 2}, -1.0f, 0.75f);
  const Tensor ga = filled({2, 2}, 1.0f, -0.25f), gb = filled({2, 2}, 0.3f, 0.1f);
  // a = x * w, b = a * x + w (b lies on a's graph), c = leaf x itself as a root.
  Variable x(vx.clone(), true), w(vw.clone(), true);
  Variable a = x * w;
  Variable b = a * x + w;
  Sums sums;
  nn::detail::run_backward_into(
      {RootGradient{VariableAccess::impl(a), ga}, RootGradient{VariableAccess::impl(b), gb},
       RootGradient{VariableAccess::impl(x), gb}},
      sums.sink());
  CHECK(values_of(x.grad()) == values_of(Tensor(DataType::Float32, {2, 2})));  // grad() untouched.
  Variable lx(vx.clone(), true), lw(vw.clone(), true);
  Variable la = lx * lw;
  Variable lb = la * lx + lw;
  (nn::sum(la * Variable(ga)) + nn::sum(lb * Variable(gb)) + nn::sum(lx * Variable(gb))).backward();
  CHECK(max_difference(sums.of(x), lx.grad()) <= 1e-6);
  CHECK(max_difference(sums.of(w), lw.grad()) <= 1e-6);
}

TEST_CASE("A source node receives its complete gradient once", "[nn][dist_autograd]") {
  std::vector<Tensor> received;
  Variable s = nn::detail::make_source(filled({3}, 1.0f),
                                       [&](const Tensor& g) { received.push_back(g.clone()); });
  CHECK(s.requires_grad());
  CHECK_FALSE(s.is_leaf());
  Variable y = s * s + s;  // d/ds sum(s*s + s) = 2s + 1, from two uses.
  nn::sum(y).backward();
  REQUIRE(received.size() == 1);
  CHECK(values_of(received[0]) == std::vector<float>{3.0f, 5.0f, 7.0f});
}

TEST_CASE("Bad roots are InvalidArgument; roots without grad are skipped", "[nn][dist_autograd]") {
  Variable x(filled({2}, 1.0f), true);
  Variable plain(filled({2}, 1.0f), false);
  Sums sums;
  CHECK(error_of([&] {
          nn::detail::run_backward_into({RootGradient{VariableAccess::impl(x), filled({3}, 1.0f)}},
                                        sums.sink());
        }) == ErrorCode::InvalidArgument);
  CHECK(error_of([&] {
          nn::detail::run_backward_into({RootGradient{nullptr, filled({2}, 1.0f)}}, sums.sink());
        }) == ErrorCode::InvalidArgument);
  nn::detail::run_backward_into({RootGradient{VariableAccess::impl(plain), filled({2}, 1.0f)}},
                                sums.sink());
  CHECK(sums.by_leaf.empty());
}

}  // namespace
}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// Distributed autograd and the DistributedOptimizer over MPI at 1-4 ranks, against the same
// graphs and optimizers run locally with plain nn and optim. Every rank is a trainer at once,
// using the next ranks as its remote workers (cases shared with the unit tier,
// test/support/rpc_autograd_cases.cc).
#include <catch2/catch.hpp>

#include "test/mpi/rpc/rpc_test_util.h"

namespace tutti::test {
namespace {

TEST_CASE("Distributed backward equals the same graph computed locally", "[rpc][dist_autograd]") {
  check_on_ranks(backward_equals_local());
}

TEST_CASE("Contexts end on every worker they reached; bad roots and ended contexts fail",
          "[rpc][dist_autograd]") {
  check_on_ranks(contexts_end_everywhere());
}

TEST_CASE("DistributedOptimizer steps equal a local optimizer's", "[rpc][dist_optimizer]") {
  // SGD with momentum, Adam, AdamW; the unit tier also runs a registered factory (3).
  const int kind = GENERATE(0, 1, 2);
  check_on_ranks(optimizer_steps(kind));
}

TEST_CASE("DistributedOptimizer leaves out parameters the context has no gradient for",
          "[rpc][dist_optimizer]") {
  check_on_ranks(optimizer_skips_parameters_without_gradient());
}

}  // namespace
}  // namespace tutti::test

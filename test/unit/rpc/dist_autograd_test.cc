// SPDX-License-Identifier: Apache-2.0
// Distributed autograd and the DistributedOptimizer with threads as workers, against the same
// graphs and optimizers run locally with plain nn and optim (cases shared with the MPI tier,
// test/support/rpc_autograd_cases.cc); and a callee that lost its context, injected on one
// worker's agent.
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include "test/support/error_of.h"
#include "test/unit/rpc/rpc_harness.h"

namespace tutti::test {
namespace {

using rpc::Message;
namespace dist = dist_autograd;

TEST_CASE("Distributed backward equals the same graph computed locally", "[rpc][dist_autograd]") {
  const int size = GENERATE(2, 3);
  check_on_threads(size, backward_equals_local());
}

TEST_CASE("Contexts end on every worker they reached; bad roots and ended contexts fail",
          "[rpc][dist_autograd]") {
  check_on_threads(3, contexts_end_everywhere());
}

TEST_CASE("A callee that lost the context fails backward on the caller, naming it",
          "[rpc][dist_autograd]") {
  std::optional<ErrorCode> code;
  std::string message;
  Group group(2);
  group.run([&](int rank) {
    if (rank != 0) return;
    nn::Variable x(filled({2}, 1.0f), true);
    dist::Context context;
    nn::Variable y =
        rpc::rpc_sync("w1", "double", Message{.tensors = {x}, .rrefs = {}, .bytes = {}})
            .tensors.at(0);
    static_cast<void>(group.agent(1).contexts().release(context.id()));
    code = error_of([&] { dist::backward(context.id(), {nn::sum(y)}); }, &message);
  });
  CHECK(code == ErrorCode::InvalidArgument);
  CHECK_THAT(message, Catch::Contains("w1"));
}

TEST_CASE("DistributedOptimizer steps equal a local optimizer's", "[rpc][dist_optimizer]") {
  const int kind = GENERATE(0, 1, 2, 3);
  const int size = GENERATE(2, 3);
  check_on_threads(size, optimizer_steps(kind));
}

}  // namespace
}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// Distributed autograd and the DistributedOptimizer with threads as workers, against the same
// graphs and optimizers run locally with plain nn and optim (cases shared with the MPI tier,
// test/support/rpc_autograd_cases.cc); a callee that lost its context, injected on one
// worker's agent; calls that cross their context's release; a Context ended on another thread.
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

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

TEST_CASE("A call that crosses its context's release does not make the context again",
          "[rpc][dist_autograd]") {
  // w0's context reaches w1 and w2; w2 calls back to w0 and w1 in it after both released it
  // (released on their agents directly, as the creator's release and its forwarding would), as
  // a call sent before w2 heard of the release does. Before, each callee made the context again
  // and kept it until rpc::shutdown(): nobody releases a context twice.
  static std::atomic<bool> go{false};
  go = false;
  rpc::register_function("call_back_when_released", [](const Message& m) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!go.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    for (const char* peer : {"w0", "w1"}) {
      static_cast<void>(rpc::rpc_sync(peer, "double", m));
    }
    return m;
  });
  std::int64_t id = -1;
  std::size_t w0_after = 99, w1_after = 99;  // Contexts each callee holds after the calls.
  std::string failure;
  Group group(3);
  group.run([&](int rank) {
    if (rank != 0) return;
    try {
      nn::Variable x(filled({2}, 1.0f), true);
      const Message args{.tensors = {x}, .rrefs = {}, .bytes = {}};
      dist::Context context;
      id = context.id();
      static_cast<void>(rpc::rpc_sync("w1", "double", args));
      rpc::Future late = rpc::rpc_async("w2", "call_back_when_released", args);
      static_cast<void>(group.agent(0).contexts().release(id));
      static_cast<void>(group.agent(1).contexts().release(id));
      go = true;
      static_cast<void>(late.wait());
      w0_after = group.agent(0).contexts().size();
      w1_after = group.agent(1).contexts().size();
    } catch (const std::exception& e) {
      failure = e.what();
      go = true;
    }
  });
  CHECK(failure == "");
  CHECK(id >= 0);
  CHECK(w0_after == 0);
  CHECK(w1_after == 0);
}

TEST_CASE("A Context destroyed on another thread lets its creator's thread make a new one",
          "[rpc][dist_autograd]") {
  // The destructor can reset the current context of its own thread only; the creator's thread
  // kept the ended id as current, and every Context after threw "already current".
  std::int64_t first = -1, second = -1;
  bool ended = false;
  std::string failure;
  Group group(2);
  group.run([&](int rank) {
    if (rank != 0) return;
    try {
      auto context = std::make_unique<dist::Context>();
      first = context->id();
      std::thread([&] {
        const rpc::detail::AgentScope scope(&group.agent(0));  // As the process's agent would be.
        context.reset();
      }).join();
      ended = group.agent(0).contexts().find(first) == nullptr;  // Though not on its thread.
      dist::Context again;
      second = again.id();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  CHECK(failure == "");
  CHECK(first >= 0);
  CHECK(ended);
  CHECK(second >= 0);
  CHECK(second != first);
}

TEST_CASE("DistributedOptimizer steps equal a local optimizer's", "[rpc][dist_optimizer]") {
  const int kind = GENERATE(0, 1, 2, 3);
  const int size = GENERATE(2, 3);
  check_on_threads(size, optimizer_steps(kind));
}

TEST_CASE("DistributedOptimizer leaves out parameters the context has no gradient for",
          "[rpc][dist_optimizer]") {
  check_on_threads(GENERATE(2, 3), optimizer_skips_parameters_without_gradient());
}

}  // namespace
}  // namespace tutti::test

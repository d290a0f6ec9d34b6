// SPDX-License-Identifier: Apache-2.0
// Helpers of the RPC MPI tests: one RPC group per TEST_CASE over a fresh Tutti session. See
// Note [Collective assertions] in test/support/mpi_test_util.h: checks after collective steps
// are CHECK(all_ranks(...)). check_on_ranks() runs the cases both tiers share (Note [Shared RPC
// cases] in test/support/rpc_cases.h) on every rank.
#pragma once

#include <exception>
#include <memory>
#include <string>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "src/rpc/rpc_runtime.h"
#include "test/support/mpi_test_util.h"
#include "test/support/rpc_cases.h"
#include "test/support/rpc_functions.h"
#include "tutti/rpc.h"
#include "tutti/tutti.h"

namespace tutti::test {

// The worker `offset` places after this rank's.
inline std::string peer(int offset) { return worker((world_rank() + offset) % world_size()); }

// tutti::init() and init_rpc("w<rank>") for the scope of a TEST_CASE; shutdown after (graceful
// unless the setup says otherwise).
class RpcGroup {
 public:
  explicit RpcGroup(const RpcSetup& setup = {}) : graceful_(setup.graceful) {
    tutti::init();
    register_test_functions();
    rpc::detail::set_max_piece_bytes_for_testing(setup.max_piece_bytes);
    rpc::init_rpc(worker(tutti::rank()), setup.rpc);
    rpc::detail::set_max_piece_bytes_for_testing(rpc::detail::kDefaultMaxPieceBytes);
    agent_ = rpc::detail::current_agent().value_or_throw();
  }
  ~RpcGroup() {
    rpc::shutdown(graceful_);
    agent_.reset();  // Before the session the agent holds alive ends.
    tutti::shutdown();
  }
  RpcGroup(const RpcGroup&) = delete;
  RpcGroup& operator=(const RpcGroup&) = delete;

  // This rank's agent, also after rpc::shutdown().
  rpc::detail::Agent& agent() { return *agent_; }

 private:
  bool graceful_;
  std::shared_ptr<rpc::detail::Agent> agent_;
};

// This rank's view of the job, for the shared cases.
class MpiWorld final : public RpcWorld {
 public:
  explicit MpiWorld(RpcGroup& group) : group_(group) {}
  int rank() const override { return world_rank(); }
  int size() const override { return world_size(); }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  void leave(bool graceful) override { rpc::shutdown(graceful); }
  int owned_rref_count() const override { return group_.agent().rrefs().owned_count(); }

 private:
  RpcGroup& group_;
};

// Runs shared case `c` on every rank (Note [Shared RPC cases]), then asserts that every rank's
// verdict is clean. Collective.
inline void check_on_ranks(const RpcCase& c) {
  Problems verdict;
  {
    RpcGroup group(c.setup);
    MpiWorld world(group);
    try {
      verdict = c.body(world);
    } catch (const std::exception& e) {
      verdict.list.push_back(std::string("threw: ") + e.what());
    }
  }
  INFO(verdict.text());
  CHECK(all_ranks(verdict.ok()));
}

}  // namespace tutti::test

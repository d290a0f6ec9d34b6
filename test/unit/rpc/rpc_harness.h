// SPDX-License-Identifier: Apache-2.0
// RPC groups over the fake transport: N threads play N workers ("w0", "w1", ...), each with an
// agent of its own, so the public rpc/dist_autograd functions run without MPI. Bodies must not
// use Catch2's assertions (not thread-safe): they fill per-rank slots, the test asserts after.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/rpc/agent.h"
#include "src/rpc/rpc_runtime.h"
#include "test/support/fake_transport.h"
#include "test/support/rpc_functions.h"

namespace tutti::test {

struct GroupOptions {
  rpc::RpcOptions rpc;
  bool graceful = true;  // How every worker shuts down after its body.
  std::size_t max_piece_bytes = rpc::detail::kDefaultMaxPieceBytes;
};

inline std::string worker(int rank) { return "w" + std::to_string(rank); }

// A started group; workers shut down in run().
class Group {
 public:
  explicit Group(int size, GroupOptions options = {}) : world_(size), options_(options) {
    register_test_functions();
    std::vector<std::string> names;
    for (int r = 0; r < size; ++r) {
      names.push_back(worker(r));
      planes_.push_back(world_.transport(r)->take_rpc_plane());
    }
    for (int r = 0; r < size; ++r) {
      agents_.push_back(rpc::detail::Agent::start(
          *planes_[static_cast<std::size_t>(r)],
          rpc::detail::AgentOptions{.rank = r,
                                    .names = names,
                                    .options = options.rpc,
                                    .epoch = 1,
                                    .max_piece_bytes = options.max_piece_bytes},
          rpc::detail::registered_functions(), nullptr));
    }
  }
  ~Group() {
    for (auto& agent : agents_) agent->shutdown(false);  // Idempotent; only after a failed run.
  }

  // Runs body(rank) on every worker's thread, then its shutdown, and joins.
  template <class F>
  void run(F&& body) {
    run_ranks(world_.size(), [&](int rank) {
      rpc::detail::AgentScope scope(agents_[static_cast<std::size_t>(rank)].get());
      body(rank);
      agents_[static_cast<std::size_t>(rank)]->shutdown(options_.graceful);
    });
  }

  rpc::detail::Agent& agent(int rank) { return *agents_[static_cast<std::size_t>(rank)]; }

 private:
  FakeWorld world_;
  GroupOptions options_;
  std::vector<std::unique_ptr<ops::ControlPlane>> planes_;
  std::vector<std::shared_ptr<rpc::detail::Agent>> agents_;
};

// A barrier for the ranks of one test.
class Barrier {
 public:
  explicit Barrier(int size) : size_(size) {}
  void wait() {
    const int generation = generation_.load();
    if (arrived_.fetch_add(1) + 1 == size_) {
      arrived_ = 0;
      generation_.fetch_add(1);
    } else {
      while (generation_.load() == generation) std::this_thread::yield();
    }
  }

 private:
  const int size_;
  std::atomic<int> arrived_{0};
  std::atomic<int> generation_{0};
};

}  // namespace tutti::test

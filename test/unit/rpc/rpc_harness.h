// SPDX-License-Identifier: Apache-2.0
// RPC groups over the fake transport: N threads play N workers ("w0", "w1", ...), each with an
// agent of its own, so the public rpc/dist_autograd functions run without MPI. Bodies must not
// use Catch2's assertions (not thread-safe): they fill per-rank slots, the test asserts after.
// check_on_threads() runs the cases both tiers share (Note [Shared RPC cases] in
// test/support/rpc_cases.h) this way.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "src/rpc/agent.h"
#include "src/rpc/rpc_runtime.h"
#include "test/support/fake_transport.h"
#include "test/support/rpc_cases.h"
#include "test/support/rpc_functions.h"

namespace tutti::test {

// A started group; workers shut down in run().
class Group {
 public:
  // `callers_drive`: AgentOptions::callers_drive on every agent (over MPI the session decides).
  explicit Group(int size, RpcSetup setup = {}, bool callers_drive = false)
      : world_(size), setup_(setup) {
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
                                    .options = setup.rpc,
                                    .epoch = 1,
                                    .max_piece_bytes = setup.max_piece_bytes,
                                    .callers_drive = callers_drive},
          rpc::detail::registered_functions(), nullptr));
    }
  }
  ~Group() {
    for (auto& agent : agents_) agent->shutdown(false);  // Idempotent; only after a failed run.
  }

  int size() const { return world_.size(); }

  // Runs body(rank) on every worker's thread, then its shutdown, and joins.
  template <class F>
  void run(F&& body) {
    run_ranks(world_.size(), [&](int rank) {
      rpc::detail::AgentScope scope(agents_[static_cast<std::size_t>(rank)].get());
      body(rank);
      agents_[static_cast<std::size_t>(rank)]->shutdown(setup_.graceful);
    });
  }

  rpc::detail::Agent& agent(int rank) { return *agents_[static_cast<std::size_t>(rank)]; }

 private:
  FakeWorld world_;
  RpcSetup setup_;
  std::vector<std::unique_ptr<ops::ControlPlane>> planes_;
  std::vector<std::shared_ptr<rpc::detail::Agent>> agents_;
};

// A barrier for the ranks of one test. Once broken (a rank gave up), waits return at once, so
// that the other ranks run to their end rather than wait forever.
class Barrier {
 public:
  explicit Barrier(int size) : size_(size) {}
  void wait() {
    const int generation = generation_.load();
    if (arrived_.fetch_add(1) + 1 == size_) {
      arrived_ = 0;
      generation_.fetch_add(1);
    } else {
      while (generation_.load() == generation && !broken_.load()) std::this_thread::yield();
    }
  }
  void break_it() { broken_ = true; }

 private:
  const int size_;
  std::atomic<int> arrived_{0};
  std::atomic<int> generation_{0};
  std::atomic<bool> broken_{false};
};

// One thread's view of its group, for the shared cases.
class ThreadWorld final : public RpcWorld {
 public:
  ThreadWorld(Group& group, Barrier& barrier, int rank)
      : group_(group), barrier_(barrier), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  void barrier() override { barrier_.wait(); }
  void leave(bool graceful) override { group_.agent(rank_).shutdown(graceful); }
  int owned_rref_count() const override { return group_.agent(rank_).rrefs().owned_count(); }

 private:
  Group& group_;
  Barrier& barrier_;
  const int rank_;
};

// Runs shared case `c` on `size` threads as workers (Note [Shared RPC cases]), then asserts
// every worker's verdict. `callers_drive` as Group's.
inline void check_on_threads(int size, const RpcCase& c, bool callers_drive = false) {
  std::vector<Problems> verdicts(static_cast<std::size_t>(size));
  Group group(size, c.setup, callers_drive);
  Barrier barrier(size);
  group.run([&](int rank) {
    ThreadWorld world(group, barrier, rank);
    Problems& verdict = verdicts[static_cast<std::size_t>(rank)];
    try {
      verdict = c.body(world);
    } catch (const std::exception& e) {
      verdict.list.push_back(std::string("threw: ") + e.what());
      barrier.break_it();
    }
  });
  for (int rank = 0; rank < size; ++rank) {
    INFO("worker " << rank << " of " << size);
    CHECK(verdicts[static_cast<std::size_t>(rank)].text() == "");
  }
}

}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// The RPC, RRef, distributed autograd and rpc::DistributedOptimizer cases that both test tiers
// run, written once over a small world interface.
//
// Note [Shared RPC cases]
// A case is a body that every worker of a group runs at once (SPMD), over an RpcWorld: its own
// rank, the group's size and a barrier; every worker is a caller, and its peers are the next
// workers round the ring (itself in a group of one). The unit tier (test/unit/rpc/rpc_harness.h)
// runs a case on N threads as N workers over the fake transport; the MPI tier
// (test/mpi/rpc/rpc_test_util.h) on every rank of the job. A body uses no Catch2 assertion
// (they are not thread-safe in the unit tier, and a failing one would skip the collectives the
// other ranks wait in, in the MPI tier): it returns its worker's verdict, a Problems list, which
// each harness asserts after the body (after the join; all_ranks() in the MPI tier, Note
// [Collective assertions] in test/support/mpi_test_util.h). So that no worker waits forever for
// another, every worker calls barrier() equally often, also after a problem. An exception out of
// a body fails its worker's verdict; the unit tier's barrier then gives way, while the MPI
// tier's other ranks may wait in a barrier until the test's timeout, so bodies record what they
// expect to fail (error_of()) rather than let it escape. Expected values come from closed forms
// or the same computation with plain nn and optim (rpc_functions.h), never from the RPC code
// under test. Cases that need thread-level control (an agent's internals, failures injected on
// one worker) or that only make sense in one tier stay in that tier's files.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "src/rpc/agent.h"
#include "tutti/error.h"
#include "tutti/rpc.h"

namespace tutti::test {

// The name of the worker of rank `rank` in every RPC test: "w<rank>".
std::string worker(int rank);

// What one worker of a case sees of its group.
class RpcWorld {
 public:
  virtual ~RpcWorld() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Returns once every worker of the group has called it (as often).
  virtual void barrier() = 0;
  // Shuts this worker's RPC down now, `graceful`ly or not (rpc::shutdown()); the harness's own
  // shutdown after the body then does nothing.
  virtual void leave(bool graceful) = 0;
  // The RRef values this worker's agent owns now, also after leave().
  virtual int owned_rref_count() const = 0;

  // The worker `offset` places after this one, round the ring.
  std::string peer(int offset) const { return worker((rank() + offset) % size()); }
};

// One worker's verdict: what went wrong there, empty when nothing did.
struct Problems {
  std::vector<std::string> list;

  void expect(bool ok, const std::string& what) {
    if (!ok) list.push_back(what);
  }
  // That `got` is `want`; else names both.
  void expect_error(const std::optional<ErrorCode>& got, ErrorCode want, const std::string& what);
  // That `text` contains every one of `parts`; else quotes it.
  void expect_contains(const std::string& text, std::initializer_list<std::string> parts,
                       const std::string& what);
  // That a maximum absolute difference from an oracle is within `tolerance`.
  void expect_close(double difference, const std::string& what, double tolerance = 1e-6);

  bool ok() const { return list.empty(); }
  std::string text() const;  // "" when ok().
};

// How a harness starts the group of a case and ends it after the body.
struct RpcSetup {
  rpc::RpcOptions rpc;  // init_rpc()'s options on every worker.
  // Frames bigger than this cross the plane in pieces (rpc::detail::AgentOptions).
  std::size_t max_piece_bytes = rpc::detail::kDefaultMaxPieceBytes;
  bool graceful = true;  // How every worker shuts down after its body.
};

struct RpcCase {
  RpcSetup setup;
  std::function<Problems(RpcWorld&)> body;
};

// Calls (test/support/rpc_agent_cases.cc).
// rpc_sync, rpc_async and remote to every worker, this one included: values, copies, owners,
// worker infos.
RpcCase every_worker_reached();
// Unknown workers and functions, exceptions in the callee, timeouts and bad arguments fail the
// call with the right code and a message naming what failed. Needs a peer other than itself for
// one check (local_value() of an RRef it does not own); at one worker that check is skipped.
RpcCase failed_calls();
// Nested calls twice round every worker and back, one pool thread each, never deadlock.
RpcCase nested_chains();
// 1,000 concurrent rpc_async calls to the next three workers all complete with their own results.
RpcCase concurrent_calls();
// Four threads of each worker make 250 rpc_sync() calls each, round every worker (itself
// included), all with their own results: callers that wait at once, each possibly running the
// RPC thread's pass (Note [A waiting caller runs the pass] in src/rpc/agent_drive.cc).
RpcCase concurrent_sync_calls();
// A 1 MiB tensor crosses in pieces of `max_piece_bytes`; with the default pieces, worker 0 also
// sends one of 68 MiB (two pieces), except under ThreadSanitizer.
RpcCase big_messages(std::size_t max_piece_bytes);
// Graceful shutdown right after making calls returns once all of them are answered; calls after
// it fail with ShutDown.
RpcCase graceful_shutdown();
// Worker 1 leaving at once (shutdown(false)) fails worker 0's call waiting on it, and later calls
// to it, with ShutDown. Needs two workers; a group of one passes.
RpcCase worker_leaves();

// RRefs (test/support/rpc_rref_cases.cc).
// Forks to a third worker, back to the owner, to oneself and in responses; each owner holds
// exactly the values made for it while they live and frees them all once every reference is gone.
RpcCase rrefs_freed_under_forks();
// Graceful shutdown frees the values a worker owns for others although they still hold RRefs,
// which then fail with ShutDown.
RpcCase shutdown_releases_rrefs();

// Distributed autograd and the DistributedOptimizer (test/support/rpc_autograd_cases.cc).
// dist_autograd::backward over graphs crossing workers (the design note's example, a chain
// crossing twice, a tensor sent twice with two roots, a parameter fetched from its owner) gives
// the gradients of the same graph run locally, on the caller and on the owner.
RpcCase backward_equals_local();
// Contexts end on every worker they reached; a nested context, a root that is not a scalar and an
// ended context fail with InvalidArgument; context ids carry the creator's rank.
RpcCase contexts_end_everywhere();
// Five steps of rpc::DistributedOptimizer over parameters on other workers (and this one) equal
// five of the same optimizer run locally: `kind` 0 SGD with momentum, 1 Adam, 2 AdamW, 3
// "plain_sgd" (a factory registered by register_test_functions()); unknown optimizers and options
// fail with InvalidArgument.
RpcCase optimizer_steps(int kind);
// rpc::DistributedOptimizer (SGD with momentum) leaves a parameter the context has no gradient
// for out of the step: two steps, the second reaching only one of two values on one owner; the
// other keeps its value (closed forms).
RpcCase optimizer_skips_parameters_without_gradient();

}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// An in-memory Transport: N threads play N ranks in one process, so sessions, negotiation and
// fusion run in unit tests without MPI (gloo's approach). The control plane is a set of
// mailboxes; the backend meets all ranks at a rendezvous for every collective. take_rpc_plane()
// gives each rank a second control plane over mailboxes of its own, as the MPI transport gives
// RPC a communicator of its own.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ops/transport.h"

namespace tutti::test {

class FakeWorld {
 public:
  explicit FakeWorld(int size);
  int size() const { return size_; }
  // The transport of `rank`; call once per rank.
  std::unique_ptr<ops::Transport> transport(int rank);

  // Mailboxes and the collective rendezvous, shared by the ranks' objects.
  struct Shared;

 private:
  int size_;
  std::shared_ptr<Shared> shared_;
};

// Runs `body(rank)` on `size` threads and joins them. Catch2's assertions are not
// thread-safe: bodies fill per-rank slots, the caller asserts after.
void run_ranks(int size, const std::function<void(int rank)>& body);

}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// The process sets of a session: who is in each, and the backends that run its collectives.
//
// Note [Global and set ranks]
// The public API speaks global ranks (root_rank, join()'s result, ProcessSet::ranks(),
// messages); backends and the coordinator's per-set slots speak set ranks (a member's index in
// the set's sorted global ranks). SetInfo converts between the two; code that sees both names
// them global_rank and set_rank.
//
// Note [Device lanes]
// Device batches of a process set take Tutti's streams round-robin (TUTTI_NUM_NCCL_STREAMS),
// counting per set. Every member runs a set's batches in the same order (joined members too),
// so the n-th batch takes the same stream index everywhere, and the backend of (set, stream)
// is created, collectively, at the same batch on every member: the first that uses it. A
// rank's device tensors are all on one device (Session::claim_device), so a lane's device
// never changes.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ops/backend.h"
#include "ops/device_ops.h"
#include "ops/transport.h"
#include "src/common/mutex.h"
#include "src/common/status.h"
#include "tutti/tensor.h"

namespace tutti::core {

// One process set as this rank sees it. A value: copies stay valid after the set is removed.
struct SetInfo {
  int id = 0;
  // Sorted global ranks. Interned for the life of the process, so ProcessSet::ranks() may hand
  // out a reference that outlives the set and the session.
  const std::vector<int>* ranks = nullptr;
  int set_rank = -1;  // This rank's set rank; -1 when it is not a member.

  int size() const { return static_cast<int>(ranks->size()); }
  bool includes_me() const { return set_rank >= 0; }
  // -1 when `global_rank` is not a member.
  int set_rank_of(int global_rank) const;
  int global_rank_of(int set_rank) const { return (*ranks)[static_cast<std::size_t>(set_rank)]; }
};

// Membership is read by any thread; it changes, and the backends are used, only on the
// communication thread (before it starts: on the thread running init()).
class ProcessSetTable {
 public:
  // `options` choose each set's host backend (the same on every rank).
  ProcessSetTable(ops::Transport& transport, int num_device_streams,
                  ops::BackendOptions options = {})
      : transport_(transport), num_device_streams_(num_device_streams), options_(options) {}
  ProcessSetTable(const ProcessSetTable&) = delete;
  ProcessSetTable& operator=(const ProcessSetTable&) = delete;

  // Any thread. The set, or InvalidArgument "unknown process set <id>".
  Result<SetInfo> find(int id) const TUTTI_EXCLUDES(mutex_);
  // Any thread. Every set, by id.
  std::vector<SetInfo> all() const TUTTI_EXCLUDES(mutex_);
  // Any thread. Every known set's sorted global ranks, by id (for flight-recorder dumps).
  std::map<int, std::vector<int>> membership() const TUTTI_EXCLUDES(mutex_);
  // Any thread. Whether `global_rank` is a member of every set there is. For the coordinator:
  // the ops of every set wait for a submission of its own (Note [Quiet naps] in idle_policy.h,
  // Note [Net bell] in ops/mpi/net_bell.h).
  bool every_set_includes(int global_rank) const TUTTI_EXCLUDES(mutex_);

  // Communication thread, collective over ALL ranks of the job in the same order: creates the
  // set's communicator and host backend (null on non-members) and files its members.
  Status add(int id, const std::vector<int>& sorted_global_ranks) TUTTI_EXCLUDES(mutex_);
  // Communication thread. Forgets the set first (new ops on it are refused by their call),
  // then waits for its device streams and drops its backends.
  void remove(int id) TUTTI_EXCLUDES(mutex_);
  // Communication thread, collective at the end of the session: drops every backend. After
  // the job stopped on an error (`after_error`), without collective calls: a peer may be stuck
  // and never join them (see ops::Backend::abandon).
  void clear(bool after_error) TUTTI_EXCLUDES(mutex_);

  // Communication thread. The host backend of a set this rank is a member of.
  ops::Backend& host_backend(int id);

  // Communication thread. Routes the size classes of every set's host backend, and of sets
  // added later, as ops::Backend::route_host() says (a collective decision: autotune sends it
  // to every rank in a response list).
  void route_host(ops::HostRoutes over_mpi);
  // Communication thread. Whether set `id`'s host backend has a host transport to choose
  // (false where this rank is not a member).
  bool routes_host(int id) const;

  // Where the next device batch of a set runs (Note [Device lanes]).
  struct DeviceLane {
    ops::Backend* backend = nullptr;
    ops::DeviceStream stream;
  };
  // Communication thread. Creates the lane's backend over the set's host backend when this is
  // its first batch (collective over the set).
  Result<DeviceLane> next_device_lane(int id, Device device);
  // Communication thread. An error a device backend reported since its last call (a lost
  // peer), or OK.
  Status device_async_error();

 private:
  struct Backends {
    std::unique_ptr<ops::Backend> host;
    int device_batches = 0;  // For the round-robin over streams.
    std::map<int, std::pair<ops::DeviceStream, std::unique_ptr<ops::Backend>>> device;
  };

  ops::Transport& transport_;
  const int num_device_streams_;
  const ops::BackendOptions options_;
  mutable detail::Mutex mutex_;
  std::map<int, SetInfo> infos_ TUTTI_GUARDED_BY(mutex_);
  std::map<int, Backends> backends_;  // Communication thread only.
  // The last route_host(), which sets added later follow (before any, they start on
  // options_.host_routes, as the transport creates them). Communication thread only.
  std::optional<ops::HostRoutes> host_routes_;
};

}  // namespace tutti::core

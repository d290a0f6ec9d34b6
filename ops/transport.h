// SPDX-License-Identifier: Apache-2.0
// What a session needs from the job's processes: its place in the job, the control plane,
// and a backend per process set. Created by init() on the application thread; used by the
// communication thread afterwards.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/control_plane.h"
#include "ops/hierarchy.h"
#include "ops/p2p_channel.h"
#include "src/common/status.h"

namespace tutti::ops {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  bool homogeneous = true;
  // Some host runs at least as many of the job's ranks as it has cores (ranks then take cores
  // from each other's computation and communication threads). The same on every rank.
  bool cores_shared = false;
  bool threads_multiple = true;  // MPI provides MPI_THREAD_MULTIPLE.
};

// How the collectives of CPU tensors travel among ranks that share a host
// (TUTTI_HOST_TRANSPORT; Note [Which host transport] in ops/shm/shm_backend.h).
enum class HostTransport : std::uint8_t { Auto, Mpi, Shm };

// How a rank of a shared-memory backend writes the chunks it stages for its peers
// (TUTTI_SHM_STREAMING_STORES; Note [Streaming stores] in ops/shm/staging.h): chosen per
// collective from measurements, ordinary stores always, or streaming stores always.
enum class ShmStores : std::uint8_t { Auto, Cached, Streaming };

// What a set's backend may use. The same on every rank (agreed settings).
struct BackendOptions {
  HostTransport host_transport = HostTransport::Auto;
  // Where shared memory runs the set's collectives: the size classes that go over MPI
  // instead, from the start (Backend::route_host()).
  HostRoutes host_routes = 0;
  // Which collectives run hierarchically on sets that span several hosts (ops/hierarchy.h);
  // transports without hosts ignore it.
  HierarchyOptions hierarchy;
  // Each rank's own (a rank's stores change no result, so ranks may differ).
  ShmStores shm_stores = ShmStores::Auto;
  // Filled by the transport, not by settings: this host runs more of the job's ranks than it
  // has CPUs, so a rank waiting on a peer in shared memory yields its CPU sooner (see
  // wait_until() in ops/shm/shm_ring.cc). The same on every rank of a host, which is all a
  // host's collectives need.
  bool host_oversubscribed = true;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const Topology& topology() const = 0;
  virtual ControlPlane& control_plane() = 0;
  // A backend over the given global ranks (sorted). Collective over ALL ranks of the job, in
  // the same order everywhere; returns null on ranks outside `ranks`.
  virtual Result<std::unique_ptr<Backend>> create_backend(const std::vector<int>& ranks,
                                                          const BackendOptions& options) = 0;
  // The control plane reserved for the RPC agent (src/rpc): over a communicator of its own
  // (MPI: duplicated when the transport is created, in the same collective order as the
  // others), so RPC messages never meet negotiation's. Its user is one thread, the RPC agent's
  // own (see Note [RPC threading] in src/rpc/agent.h). Handed out once; null afterwards, and
  // from transports that have none.
  virtual std::unique_ptr<ControlPlane> take_rpc_plane() { return nullptr; }
  // The channel of point-to-point messages (tutti/p2p.h), over a communicator of its own
  // created like the RPC plane's. Used by the communication thread only. Handed out once;
  // null afterwards, and from transports that have none.
  virtual std::unique_ptr<P2PChannel> take_p2p_channel() { return nullptr; }
};

// Registers `hook` to run at the start of MPI_Finalize (through an attribute on
// MPI_COMM_SELF, which MPI deletes first), so a session still open then is shut down while
// MPI works. Application thread; the last registration wins.
void set_mpi_finalize_hook(void (*hook)());

// After the runtime stopped on an error, a peer may be alive but stuck, and MPI_Finalize (at
// exit, or the application's own) would wait for it forever. Once this is called, the next
// MPI_Finalize gets `grace` to return; then MPI_Abort(MPI_COMM_WORLD, 1) ends the whole job,
// so that its exit status reaches mpirun. Any thread; the shortest grace wins.
void bound_finalize_after_error(std::chrono::milliseconds grace);

// After this rank's own transport failed (Communication), its peers may be blocked inside a
// collective this rank will never enter, where no message reaches them. Ends the whole job
// with MPI_Abort(MPI_COMM_WORLD, 1) after `grace`, unless the process has exited by then
// (the application gets that long to save its state). Any thread; the first call counts.
void abort_job_after(std::chrono::milliseconds grace, const std::string& why);

// The MPI transport over MPI_COMM_WORLD (parent == nullptr) or over *parent (an MPI_Comm*).
// Initializes MPI with MPI_THREAD_MULTIPLE if nobody has; then MPI is finalized at exit.
// Application thread; collective over the parent communicator. Fails with Communication if
// not every rank of the parent arrives within `start_timeout` (TUTTI_START_TIMEOUT).
Result<std::unique_ptr<Transport>> create_mpi_transport(const void* parent,
                                                        std::chrono::milliseconds start_timeout);

}  // namespace tutti::ops

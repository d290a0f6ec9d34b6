// SPDX-License-Identifier: Apache-2.0
// The MPI transport: communicators for control, data and topology over a duplicate of the
// parent communicator.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include <mpi.h>

#include "ops/mpi/doorbell.h"
#include "ops/mpi/mpi_control_plane.h"
#include "ops/mpi/mpi_error.h"
#include "ops/mpi/mpi_hierarchy.h"
#include "ops/mpi/mpi_p2p.h"
#include "ops/mpi/net_bell.h"
#include "ops/transport.h"
#include "src/base/host_cpus.h"
#include "src/base/strings.h"
#include "src/common/logging.h"

namespace tutti::ops {
namespace mpi {
namespace {

// Whether MPI_Finalize has returned: set after Tutti's own MPI_Finalize (finalize_at_exit), or
// by an exit handler registered during the application's MPI_Finalize, which runs only once
// the process exits, i.e. after MPI_Finalize returned.
std::atomic<bool> g_finalize_returned{false};

void mark_finalize_returned() { g_finalize_returned.store(true); }

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
  g_finalize_returned.store(true);
}

using Clock = std::chrono::steady_clock;

// Note [A start timeout that covers MPI_Init]
// Open MPI's and MPICH's MPI_Init_thread return only once every process of the job has called
// it (they exchange the processes' addresses), so a rank slow to reach init(), or one that never
// does, held the others inside it for as long as it took: TUTTI_START_TIMEOUT timed only the
// barrier after it (wait_for_everyone()), which is all it times where the application started
// MPI itself. A call into MPI_Init_thread cannot be left, and init() cannot return while its
// thread is inside one; so a watchdog waits beside it, and if MPI_Init_thread has not returned
// by init()'s deadline it says why and ends the process with status 1 (std::_Exit: at-exit
// handlers would call into the MPI library that is still starting). The launcher then ends the
// job's other processes, the late one included, as it does for any process that fails.
//
// The job's rank as the launcher tells it (before MPI starts, nothing else knows it); empty if
// no launcher we know set one.
std::string launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return value;
  }
  return {};
}

// MPI_Init_thread with MPI_THREAD_MULTIPLE, or the end of the process if it has not returned by
// `deadline` (Note [A start timeout that covers MPI_Init]).
int init_thread_by(Clock::time_point deadline, std::chrono::milliseconds timeout, int* provided) {
  std::mutex mutex;
  std::condition_variable returned;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mutex);
    if (returned.wait_until(lock, deadline, [&] { return done; })) return;
    const std::string rank = launcher_rank();
    detail::log_message(
        detail::LogLevel::Error,
        detail::str_cat("MPI_Init_thread", rank.empty() ? "" : " on rank ", rank,
                        " did not return within TUTTI_START_TIMEOUT (", timeout.count() / 1000.0,
                        " s): not every process of the job has called tutti::init() (one may "
                        "still be starting, or have failed before it); this process ends "
                        "with status 1. Raise TUTTI_START_TIMEOUT if ranks do long work "
                        "before init()."));
    std::_Exit(1);
  });
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, provided);
  {
    std::lock_guard lock(mutex);
    done = true;
  }
  returned.notify_one();
  watchdog.join();
  return rc;
}

// MPI as the application left it, or initialized by us by `deadline` (then finalized at exit, so
// init() after shutdown() works: MPI cannot be initialized twice).
Status ensure_initialized(Clock::time_point deadline, std::chrono::milliseconds timeout,
                          bool* threads_multiple) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return Status(ErrorCode::InvalidArgument, "MPI was finalized; Tutti cannot start");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    TUTTI_MPI_RETURN_IF_ERROR(init_thread_by(deadline, timeout, &provided));
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    return Status(ErrorCode::InvalidArgument,
                  "MPI was initialized below MPI_THREAD_SERIALIZED; Tutti's background thread "
                  "needs MPI_Init_thread with MPI_THREAD_MULTIPLE (or SERIALIZED)");
  }
  *threads_multiple = provided >= MPI_THREAD_MULTIPLE;
  return Status();
}

// Every later step is a blocking collective over `parent`, which would wait forever for a
// rank that never calls init(): so first a non-blocking barrier, waited for until `deadline`,
// init()'s start plus `timeout`. After a timeout the barrier stays pending; init() has failed
// anyway.
Status wait_for_everyone(MPI_Comm parent, Clock::time_point deadline,
                         std::chrono::milliseconds timeout) {
  MPI_Request request = MPI_REQUEST_NULL;
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Ibarrier(parent, &request));
  for (int done = 0;;) {
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return Status();
    if (Clock::now() > deadline) {
      return Status(
          ErrorCode::Communication,
          detail::str_cat("not every rank called tutti::init() within TUTTI_START_TIMEOUT (",
                          timeout.count() / 1000.0, " s)"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

class MpiTransport final : public Transport {
 public:
  static Result<std::unique_ptr<Transport>> create(MPI_Comm parent,
                                                   std::chrono::milliseconds start_timeout) {
    auto transport = std::unique_ptr<MpiTransport>(new MpiTransport());
    const Clock::time_point deadline = Clock::now() + start_timeout;
    TUTTI_RETURN_IF_ERROR(
        ensure_initialized(deadline, start_timeout, &transport->topology_.threads_multiple));
    TUTTI_RETURN_IF_ERROR(wait_for_everyone(parent, deadline, start_timeout));
    TUTTI_ASSIGN_OR_RETURN(transport->base_, MpiComm::duplicate(parent));
    TUTTI_ASSIGN_OR_RETURN(MpiComm control, MpiComm::duplicate(transport->base_.get()));
    transport->control_ = std::make_unique<MpiControlPlane>(std::move(control));
    // RPC's own communicator, duplicated here so its creation is ordered with the collectives
    // above on every rank (the agent starts later, on one rank at a time).
    TUTTI_ASSIGN_OR_RETURN(MpiComm rpc, MpiComm::duplicate(transport->base_.get()));
    transport->rpc_ = std::make_unique<MpiControlPlane>(std::move(rpc));
    // Point-to-point messages' own communicator (tutti/p2p.h), likewise.
    TUTTI_ASSIGN_OR_RETURN(MpiComm p2p, MpiComm::duplicate(transport->base_.get()));
    transport->p2p_ = make_p2p_channel(std::move(p2p));
    TUTTI_RETURN_IF_ERROR(transport->read_topology());
    TUTTI_RETURN_IF_ERROR(transport->add_doorbell());
    return std::unique_ptr<Transport>(std::move(transport));
  }

  const Topology& topology() const override { return topology_; }
  ControlPlane& control_plane() override { return *control_; }
  std::unique_ptr<ControlPlane> take_rpc_plane() override { return std::move(rpc_); }
  std::unique_ptr<P2PChannel> take_p2p_channel() override { return std::move(p2p_); }

  Result<std::unique_ptr<Backend>> create_backend(const std::vector<int>& ranks,
                                                  const BackendOptions& options) override {
    TUTTI_ASSIGN_OR_RETURN(MpiComm comm, MpiComm::subset(base_.get(), ranks));
    if (!comm.valid()) return std::unique_ptr<Backend>();
    BackendOptions with_host = options;
    // Online CPUs, not the cgroup's limit: see Note [The host's CPUs] in src/base/host_cpus.h.
    const unsigned cpus = std::thread::hardware_concurrency();
    with_host.host_oversubscribed = cpus == 0 || static_cast<unsigned>(topology_.local_size) > cpus;
    return make_set_backend(std::move(comm), with_host);
  }

 private:
  MpiTransport() = default;

  Status read_topology() {
    Topology& t = topology_;
    t.rank = base_.rank();
    t.size = base_.size();
    MPI_Comm local = MPI_COMM_NULL;
    TUTTI_MPI_RETURN_IF_ERROR(
        MPI_Comm_split_type(base_.get(), MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &local));
    MPI_Comm_rank(local, &t.local_rank);
    MPI_Comm_size(local, &t.local_size);
    MPI_Comm_free(&local);
    MPI_Comm cross = MPI_COMM_NULL;
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Comm_split(base_.get(), t.local_rank, t.rank, &cross));
    MPI_Comm_rank(cross, &t.cross_rank);
    MPI_Comm_size(cross, &t.cross_size);
    MPI_Comm_free(&cross);
    int min_local = t.local_size;
    int max_local = t.local_size;
    TUTTI_MPI_RETURN_IF_ERROR(
        MPI_Allreduce(MPI_IN_PLACE, &min_local, 1, MPI_INT, MPI_MIN, base_.get()));
    TUTTI_MPI_RETURN_IF_ERROR(
        MPI_Allreduce(MPI_IN_PLACE, &max_local, 1, MPI_INT, MPI_MAX, base_.get()));
    t.homogeneous = min_local == max_local;
    // The host's CPUs within this process's cgroup limits, not this rank's binding (mpirun
    // binds each rank to one core; Note [The host's CPUs] in src/base/host_cpus.h); 0 when
    // unknown, then this host counts as roomy.
    const unsigned cores = base::host_cpus();
    int shared = cores != 0 && static_cast<unsigned>(t.local_size) >= cores ? 1 : 0;
    TUTTI_MPI_RETURN_IF_ERROR(
        MPI_Allreduce(MPI_IN_PLACE, &shared, 1, MPI_INT, MPI_MAX, base_.get()));
    t.cores_shared = shared != 0;
    return Status();
  }

  // The ranks on the coordinator's host ring it after each message they send it (Note
  // [Doorbell] in doorbell.h), those on other hosts after a message it may nap through (Note
  // [Net bell] in net_bell.h). Collective over base_.
  Status add_doorbell() {
    MPI_Comm host = MPI_COMM_NULL;
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Comm_split_type(base_.get(), MPI_COMM_TYPE_SHARED, topology_.rank,
                                                  MPI_INFO_NULL, &host));
    std::unique_ptr<Doorbell> doorbell =
        Doorbell::create(host, topology_.rank, kCoordinator, topology_.size);
    int with_coordinator = topology_.rank == kCoordinator ? 1 : 0;
    const int reduced = MPI_Allreduce(MPI_IN_PLACE, &with_coordinator, 1, MPI_INT, MPI_MAX, host);
    MPI_Comm_free(&host);
    TUTTI_MPI_RETURN_IF_ERROR(reduced);
    control_->set_doorbell(std::move(doorbell), kCoordinator);
    control_->set_net_bell(
        NetBell::create(base_.get(), kCoordinator, /*remote=*/with_coordinator == 0));
    return Status();
  }

  // The coordinator's rank in base_ and in the control plane's communicator, a duplicate of it
  // (Note [Negotiation] in src/core/negotiation/coordinator.h).
  static constexpr int kCoordinator = 0;
  Topology topology_;
  MpiComm base_;
  std::unique_ptr<MpiControlPlane> control_;
  std::unique_ptr<MpiControlPlane> rpc_;  // Until the session takes it.
  std::unique_ptr<P2PChannel> p2p_;       // Likewise.
};

// Ends the job after printing `why`. The pause lets the launcher forward what this process
// wrote to stderr: MPICH's launcher, once told of the abort, kills every rank and could drop
// output not yet read from the pipe (a CI run lost the explanation this way).
[[noreturn]] void abort_job(const std::string& why) {
  std::fprintf(stderr, "%s\n", why.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; should an implementation's do, end the process.
}

void (*g_finalize_hook)() = nullptr;
// The grace MPI_Finalize gets after an error, in ms; -1 while none happened.
std::atomic<std::int64_t> g_finalize_grace_ms{-1};

// Ends the job if MPI_Finalize has not returned within the grace: the thread is detached, and
// the process normally exits before it wakes.
void start_finalize_watchdog() {
  const std::int64_t grace_ms = g_finalize_grace_ms.load();
  if (grace_ms < 0) return;
  static std::atomic<bool> started{false};
  if (started.exchange(true)) return;
  std::thread([grace_ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(grace_ms));
    // MPI_Finalized() is already true while Open MPI's MPI_Finalize waits, so only the process's
    // exit can tell that it returned (g_finalize_returned). An application that finalizes MPI
    // itself after an error and then works on for longer than the grace is ended too (README).
    if (g_finalize_returned.load()) return;
    char why[256];
    std::snprintf(why, sizeof why,
                  "[tutti] MPI_Finalize has not returned %.3g s after the runtime stopped on an "
                  "error (a peer is stuck?): ending the job with MPI_Abort "
                  "(TUTTI_EXIT_GRACE_SECONDS)",
                  static_cast<double>(grace_ms) / 1000.0);
    abort_job(why);
  }).detach();
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes before anything else, MPI still working.
int run_finalize_hook(MPI_Comm, int, void*, void*) {
  // Exit-time work after the application's own MPI_Finalize (LeakSanitizer's scan, static
  // destructors) must not be mistaken for a finalize stuck on a peer: registered now, this
  // handler runs before those registered earlier, as soon as the process starts to exit.
  static std::atomic<bool> registered{false};
  if (!registered.exchange(true)) std::atexit(mark_finalize_returned);
  start_finalize_watchdog();  // The hook may itself wait on a stuck peer (RPC's shutdown).
  if (g_finalize_hook) g_finalize_hook();
  start_finalize_watchdog();  // Or the runtime may have stopped on an error in the hook.
  return MPI_SUCCESS;
}

}  // namespace
}  // namespace mpi

void bound_finalize_after_error(std::chrono::milliseconds grace) {
  const std::int64_t ms = grace.count();
  std::int64_t current = mpi::g_finalize_grace_ms.load();
  while ((current < 0 || ms < current) &&
         !mpi::g_finalize_grace_ms.compare_exchange_weak(current, ms)) {
  }
}

void abort_job_after(std::chrono::milliseconds grace, const std::string& why) {
  static std::atomic<bool> armed{false};
  if (armed.exchange(true)) return;
  // Said now, not only at the abort: whoever reads the log learns why the job will end.
  char text[512];
  std::snprintf(text, sizeof text,
                "[tutti] this rank's transport failed (%s); its peers may be blocked in a "
                "collective it will not enter: ending the job with MPI_Abort after %.3g s "
                "(TUTTI_EXIT_GRACE_SECONDS)",
                why.c_str(), std::chrono::duration<double>(grace).count());
  std::fprintf(stderr, "%s\n", text);
  std::fflush(stderr);
  std::thread([grace, message = std::string(text)] {
    std::this_thread::sleep_for(grace);
    mpi::abort_job(message + ": now");
  }).detach();
}

void set_mpi_finalize_hook(void (*hook)()) {
  mpi::g_finalize_hook = hook;
  static bool attached = false;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (attached || !initialized) return;
  int keyval = MPI_KEYVAL_INVALID;
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, mpi::run_finalize_hook, &keyval, nullptr) ==
          MPI_SUCCESS &&
      MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr) == MPI_SUCCESS) {
    attached = true;
  }
}

Result<std::unique_ptr<Transport>> create_mpi_transport(const void* parent,
                                                        std::chrono::milliseconds start_timeout) {
  return mpi::MpiTransport::create(parent ? *static_cast<const MPI_Comm*>(parent) : MPI_COMM_WORLD,
                                   start_timeout);
}

}  // namespace tutti::ops

// SPDX-License-Identifier: Apache-2.0
#include "src/core/session.h"

#include <pthread.h>
#include <sched.h>

#include <mutex>
#include <numeric>
#include <optional>

#include "ops/device_ops.h"
#include "ops/transport.h"
#include "src/base/fast_tls.h"
#include "src/base/host_memory_cache.h"
#include "src/base/strings.h"
#include "src/common/byte_buffers.h"
#include "src/common/check.h"
#include "src/common/logging.h"
#include "src/core/cpu_sharing.h"
#include "src/core/op_state.h"
#include "src/core/start_handshake.h"
#include "src/core/submission_window.h"
#include "tutti/cuda.h"

namespace tutti::core {

namespace {

// Note [One TUTTI_TIMELINE file per process]
// TUTTI_TIMELINE names one file for the process, and the environment does not change when a
// program calls init() again after shutdown() (a retry, an elastic restart in process, tests).
// Opening it afresh per session would truncate the earlier sessions' trace, so a later session
// continues the file where the earlier one closed it: its events follow, as the next pid on
// the same clock, so Perfetto shows each session as its own process on one time axis. The
// file must still end as the earlier stop() left it; otherwise (someone else wrote it) it
// starts afresh. start_timeline() with a path always starts a new file, as documented.
struct EnvTimeline {
  std::mutex mutex;
  std::optional<Timeline::Resume> last;  // Of this process's last TUTTI_TIMELINE file.
};

EnvTimeline& env_timeline() {
  static EnvTimeline timeline;
  return timeline;
}

}  // namespace

Session::Session(Config config, std::unique_ptr<ops::Transport> transport)
    : config_(std::move(config)),
      transport_(std::move(transport)),
      rpc_plane_(transport_->take_rpc_plane()),
      recorder_(
          std::make_shared<FlightRecorder>(static_cast<std::size_t>(config_.flight_recorder_size))),
      completer_(&timeline_, recorder_.get()),
      queue_(recorder_.get()),
      sets_(*transport_, config_.num_nccl_streams,
            {.host_transport = config_.host_transport,
             .host_routes = config_.host_routes,
             .hierarchy = config_.hierarchy,
             .shm_stores = config_.shm_stores}),
      device_(sets_, completer_, transport_->topology()),
      sharing_(this_process_cpu_sharing(transport_->topology(), !config_.thread_affinity.empty())),
      p2p_(std::make_shared<P2PEngine>(transport_->take_p2p_channel(), p2p_queue_, completer_,
                                       config_, waiting_threads_may_drive(),
                                       [this] { queue_.wake(); })),
      // No device: its ops stay on the communication thread (Note [A waiting thread runs the
      // cycle] in loop_driver.h).
      loop_driver_(std::make_shared<LoopDriver>(
          waiting_threads_may_drive() && ops::device_ops().device_count() == 0,
          [this] { queue_.wake(); })),
      loop_({.plane = transport_->control_plane(),
             .queue = queue_,
             .sets = sets_,
             .device = device_,
             .p2p = *p2p_,
             .driver = *loop_driver_,
             .completer = completer_,
             .timeline = timeline_,
             .recorder = *recorder_,
             .config = config_,
             .sharing = sharing_}) {
  // Until stop(): collectives' outputs reuse freed storage (Note [Host memory cache]).
  base::set_host_cache_capacity(static_cast<std::size_t>(config_.host_memory_cache));
  detail::set_wait_spins(!loop_.sharing().shares_cpu);
  queue_.spin_on_contention(sharing_.lock_spin);
  // See Note [Drivers by kind] in op_state.cc: ops name these by kind.
  detail::set_drivers(loop_driver_, p2p_);
  const ops::Topology& where = transport_->topology();
  recorder_->set_context({.job = config_.job_id,
                          .rank = where.rank,
                          .size = where.size,
                          .dir = config_.flight_recorder_dir});
  if (recorder_->enabled()) signal_dumper_.emplace(*recorder_);
}

namespace {

// THREAD_AFFINITY's CPU for this rank's communication thread, if set: InvalidArgument unless
// the list covers every local rank and the CPU is one this process may run on.
Result<std::optional<int>> affinity_cpu(const Config& config, const ops::Topology& topology) {
  if (config.thread_affinity.empty()) return std::optional<int>();
  const std::string knob = detail::str_cat("TUTTI_THREAD_AFFINITY='",
                                           detail::join_list(config.thread_affinity, ","), "'");
  if (static_cast<std::size_t>(topology.local_rank) >= config.thread_affinity.size()) {
    return invalid_argument(detail::str_cat(knob, " lists ", config.thread_affinity.size(),
                                            " CPUs for ", topology.local_size,
                                            " ranks on this host: give one per local rank"));
  }
  const int cpu = config.thread_affinity[static_cast<std::size_t>(topology.local_rank)];
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
      !CPU_ISSET(cpu, &allowed)) {
    return invalid_argument(
        detail::str_cat(knob, ": local rank ", topology.local_rank, " may not run on CPU ", cpu));
  }
  return std::optional<int>(cpu);
}

}  // namespace

Result<std::shared_ptr<Session>> Session::create(Result<Config> local,
                                                 std::unique_ptr<ops::Transport> transport) {
  std::optional<int> cpu;
  if (local.ok()) {
    Result<std::optional<int>> pinned = affinity_cpu(local.value(), transport->topology());
    if (pinned.ok())
      cpu = pinned.value();
    else
      local = pinned.status();
  }
  TUTTI_ASSIGN_OR_RETURN(Config config, agree_settings(transport->control_plane(), local,
                                                       local.ok() ? local.value().start_timeout
                                                                  : Config{}.start_timeout));
  std::shared_ptr<Session> session(new Session(std::move(config), std::move(transport)));
  std::vector<int> everyone(static_cast<std::size_t>(session->topology().size));
  std::iota(everyone.begin(), everyone.end(), 0);
  TUTTI_RETURN_IF_ERROR(session->sets_.add(0, everyone));
  TUTTI_ASSIGN_OR_RETURN(session->global_set_, session->sets_.find(0));
  session->recorder_->set_process_sets(session->sets_.membership());
  if (!session->config_.timeline_path.empty()) {
    // Rank 0 already opened the file once in the handshake, so this fails only if the file
    // changed since; init() must not fail on rank 0 alone now.
    const Status timeline = session->start_env_timeline();
    if (!timeline.ok()) TUTTI_LOG_ERROR("TUTTI_TIMELINE: ", timeline.message());
  }
  session->thread_ = std::thread([raw = session.get()] { raw->run(); });
  if (session->transport_->control_plane().rung_here()) {
    session->doorbell_thread_ = std::thread([raw = session.get()] {
      pthread_setname_np(pthread_self(), "tutti-doorbell");
      while (raw->transport_->control_plane().wait_for_ring()) raw->queue_.wake();
    });
  }
  if (session->transport_->control_plane().net_rung_here()) {
    session->net_bell_thread_ = std::thread([raw = session.get()] {
      pthread_setname_np(pthread_self(), "tutti-netbell");
      while (raw->transport_->control_plane().wait_for_net_ring()) raw->queue_.wake();
    });
  }
  if (cpu) {
    // Horovod's HOROVOD_THREAD_AFFINITY: keeps the communication thread off the cores the
    // application's compute threads use. Checked above, so only an odd kernel refuses.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(*cpu, &set);
    if (pthread_setaffinity_np(session->thread_.native_handle(), sizeof set, &set) != 0)
      TUTTI_LOG_WARNING("could not pin the communication thread to CPU ", *cpu);
  }
  return session;
}

Session::~Session() { stop(); }

void Session::run() {
  pthread_setname_np(pthread_self(), "tutti-comm");
  finish(loop_.run(stop_requested_));
}

Status Session::submit(std::shared_ptr<Entry> entry) {
  if (loop_done_.load()) return refused_;
  if (entry->request.device == Device::Kind::CUDA && !entry->inputs.empty()) {
    // Before the entry is visible to the communication thread, which waits for it on the GPU
    // (Note [Stream ordering] in ops/cuda/stream.h). A stream that cannot be recorded on fails
    // the call here, with nothing queued.
    TUTTI_ASSIGN_OR_RETURN(
        entry->ready,
        ops::device_ops().record_ready(cuda::current_stream(), entry->inputs.front().device()));
  }
  if (loop_driver_->enabled()) entry->state->driver = detail::DriverKind::Loop;
  // See Note [A submitting thread keeps its backlog short] in submission_window.h. The window
  // is the thread's, over all sessions: an op of an earlier one is done (or failed) by now.
  TUTTI_FAST_TLS thread_local SubmissionWindow window;  // Note [Thread-locals read without a call].
  std::shared_ptr<const detail::OpState> mark;
  if (keeps_backlog_short_ && window.count()) mark = handle_state(entry);
  // A push racing with the loop's end is either refused or failed by finish(): close() takes
  // the queue's lock too.
  TUTTI_RETURN_IF_ERROR(queue_.push(std::move(entry)));
  if (mark != nullptr) {
    // Its driver is loop_driver_, set above.
    if (const std::shared_ptr<const detail::OpState> oldest = window.mark(std::move(mark)))
      oldest->drive_for(SubmissionWindow::kMaxWait);
  }
  return Status();
}

Status Session::submit_p2p(std::vector<P2POpEntry> ops, bool caller_waits) {
  if (loop_done_.load()) return refused_;
  for (const P2POpEntry& op : ops) TUTTI_RETURN_IF_ERROR(p2p_->check_tag(op));  // All or none.
  if (p2p_->drivable()) {
    for (P2POpEntry& op : ops) op.entry->state->driver = detail::DriverKind::PointToPoint;
  }
  TUTTI_CHECK(!caller_waits || ops.size() == 1, "a blocking point-to-point call submits one op");
  const std::shared_ptr<Entry> own = caller_waits ? ops.front().entry : nullptr;
  // As submit(): finish() closes the queue, so a racing push is refused or failed there.
  TUTTI_RETURN_IF_ERROR(p2p_queue_.push(std::move(ops)));
  // This thread starts the ops itself; its step wakes the loop if some are left in flight
  // (Note [A waiting thread drives point-to-point]), but not for the op of a caller that waits
  // on it at once, which is its own to drive. If another thread holds the engine, the ops are
  // still queued, or that thread's step took them and wakes the loop as this one's would.
  if (p2p_->drivable()) {
    if (own != nullptr) {
      p2p_->drive_before_wait(*own);
    } else {
      p2p_->drive();
    }
  }
  if (!p2p_->drivable() || !p2p_queue_.empty()) queue_.wake();
  return Status();
}

Status Session::start_env_timeline() {
  if (topology().rank != 0) return Status();
  EnvTimeline& process = env_timeline();
  const std::lock_guard<std::mutex> lock(process.mutex);
  const Timeline::Resume* resume = process.last ? &*process.last : nullptr;
  TUTTI_RETURN_IF_ERROR(
      timeline_.start(config_.timeline_path, config_.timeline_mark_cycles, resume));
  process.last = timeline_.resume_point();
  return Status();
}

Status Session::start_timeline(const std::string& path, bool mark_cycles) {
  // Only the coordinator sees every rank's arrival, so only rank 0 writes a timeline.
  if (topology().rank != 0) return Status();
  return timeline_.start(path, mark_cycles);
}

void Session::stop() {
  if (thread_.joinable()) {
    stop_requested_.store(true);
    queue_.wake();
    thread_.join();
  }
  if (doorbell_thread_.joinable()) {
    transport_->control_plane().stop_ring_waits();
    doorbell_thread_.join();
  }
  if (net_bell_thread_.joinable()) {
    transport_->control_plane().stop_net_ring_waits();
    net_bell_thread_.join();
  }
  timeline_.stop();  // Leaves a complete JSON file.
  signal_dumper_.reset();
  // Communicators are freed collectively: every rank reaches here from its own shutdown().
  // Not after an error, when a peer may be stuck and never get here.
  sets_.clear(stopped_on_error_.load());
  base::set_host_cache_capacity(0);  // Frees every cached block,
  detail::release_byte_buffers();    // and every kept buffer.
}

void Session::finish(const Status& status) {
  const Status plain(ErrorCode::ShutDown, "Tutti has shut down");
  const std::optional<Status>& bye = loop_.shutdown_reason();
  const Status pending = !status.ok() ? status : bye && !bye->ok() ? *bye : plain;
  if (!status.ok()) TUTTI_LOG_ERROR(status.message());
  // Stopped by an error here or on a peer: a stuck peer must not keep this process in
  // MPI_Finalize forever (issue: jobs that never ended after an error). A bye that only says
  // ranks called shutdown() is no error: every rank reaches its own shutdown, and MPI_Finalize
  // (issue 29: every shutdown used to count as an error, arming the exit watchdog and leaving
  // communicators and windows to MPI_Finalize).
  if (!status.ok() || (bye && loop_.stopped_after_error())) {
    stopped_on_error_.store(true);
    ops::bound_finalize_after_error(config_.exit_grace);
  }
  // This rank's own transport failed: the bye below may never reach peers that wait inside a
  // collective, so the job is ended after the same grace.
  if (status.code() == ErrorCode::Communication) {
    ops::abort_job_after(config_.exit_grace, std::string(status.message()));
  }
  // Ops submitted from now on are refused with ShutDown. Where the stop was not this rank's own
  // shutdown() (a peer's, a stall, an error), the refusal names its cause as the pending ops'
  // failure does: "Tutti has shut down" alone left a rank that never called shutdown() with
  // nothing to go on.
  const bool own_shutdown = stop_requested_.load() && !stopped_on_error_.load();
  refused_ =
      own_shutdown || pending.message() == plain.message()
          ? plain
          : Status(ErrorCode::ShutDown, detail::str_cat(plain.message(), ": ", pending.message()));
  // Before the pending ops fail below: the dump shows how far each got (waiting for other
  // ranks, or executing), which is what explains the stop. Wherever the job stopped on an
  // error, every rank dumps.
  // Also where a peer's shutdown() leaves ops of this rank's pending: they fail for a reason
  // this rank's own code did not give.
  if (stopped_on_error_.load() || (!stop_requested_.load() && !queue_.empty()))
    dump_after_error(error_reason(pending));
  device_.finish(pending);
  // Every pending op fails with the reason the loop ended (for a stall: the same explanation
  // on every rank, as API.md asks); later ops are refused with ShutDown.
  completer_.complete(queue_.close(refused_), pending);
  p2p_->finish(pending, refused_);
  ops::ControlPlane& plane = transport_->control_plane();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!plane.sends_done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  loop_done_.store(true);
}

std::string Session::error_reason(const Status& why) {
  const std::string name = detail::str_cat(to_string(why.code()), ": ");
  const std::string_view message = why.message();
  return message.starts_with(name) ? std::string(message) : detail::str_cat(name, message);
}

void Session::dump_after_error(std::string_view reason) {
  if (!recorder_->enabled()) return;
  // A signal's dump after this one (the SIGTERM of MPI_Abort) goes beside it.
  const std::string path = recorder_->error_dump_path();
  const Status dumped = recorder_->dump(path, reason);
  if (dumped.ok()) {
    TUTTI_LOG_ERROR(
        "flight recorder dumped to ", path,
        "; scripts/tutti-trace on the directory of every rank's dump explains the stop");
  } else {
    TUTTI_LOG_ERROR(dumped.message());
  }
}

// Notes [A waiting thread drives point-to-point] in execution/p2p_engine.h, [A waiting thread
// runs the cycle] in loop_driver.h and [A waiting caller runs the pass] in
// src/rpc/agent_drive.cc: MPI must allow it, and their spinning must not keep a CPU that a peer
// rank needs. Reads only transport_ and sharing_, so the constructor may call it once those are
// initialized.
bool Session::waiting_threads_may_drive() const {
  return transport_->topology().threads_multiple && !sharing_.ranks_exceed_cpus;
}

}  // namespace tutti::core

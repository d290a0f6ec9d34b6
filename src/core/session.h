// SPDX-License-Identifier: Apache-2.0
// One initialized run of Tutti: the transport, process sets, tensor queue and the
// communication thread, from init() to shutdown().
//
// Note [Threading model]
// Application threads call submit() and the queries; they never touch MPI. The one
// communication thread (started by the constructor, joined by stop()) makes every MPI call of
// the session: it sends this rank's new requests to the coordinator, executes the response
// lists it receives, and on the coordinator also negotiates. When idle it sleeps on the tensor
// queue's condition variable with a growing timeout, so an idle job costs almost no CPU, and
// a submission wakes it at once, so a lone op does not wait for a cycle.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ops/transport.h"
#include "src/common/status.h"
#include "src/core/config.h"
#include "src/core/controller.h"
#include "src/core/device_path.h"
#include "src/core/executor.h"
#include "src/core/mover.h"
#include "src/core/response_cache.h"
#include "src/core/tensor_queue.h"
#include "src/core/timeline.h"

namespace tutti::core {

// A process set as this rank sees it.
struct SetInfo {
  int id = 0;
  std::shared_ptr<const std::vector<int>> ranks;  // Sorted global ranks.
  int set_rank = -1;                              // -1 when this rank is not a member.
};

class Session {
 public:
  // Starts the communication thread. Application thread, collective (see init()).
  static Result<std::shared_ptr<Session>> create(Config config,
                                                 std::unique_ptr<ops::Transport> transport);
  ~Session();

  const ops::Topology& topology() const { return transport_->topology(); }
  const Config& config() const { return config_; }

  // Any thread. Queues an op (argument checks are the caller's); ShutDown once stopped.
  Status submit(std::shared_ptr<Entry> entry);
  // Any thread. The set, or InvalidArgument if unknown.
  Result<SetInfo> process_set(int id) const;
  // Any thread. Records that this rank's CUDA tensors are on `device` (Note [Device lanes]):
  // InvalidArgument if an earlier op of this session used another device.
  Status claim_device(Device device);
  // Any thread. Numbers this rank's add_process_set()/remove_process_set() calls (0, 1, ...),
  // which every rank makes in the same order, so the n-th call has the same name everywhere.
  std::uint64_t next_set_change() { return set_changes_.fetch_add(1); }

  // Application thread, collective: asks every rank to stop, finishes what was negotiated,
  // fails the rest with ShutDown and joins the communication thread. Idempotent.
  void stop();
  // Any thread. Starts (rank 0) or replaces the timeline; a no-op on other ranks, which
  // record nothing. InvalidArgument if rank 0 cannot open `path`.
  Status start_timeline(const std::string& path, bool mark_cycles);
  void stop_timeline() { timeline_.stop(); }

  // Whether the communication thread has ended (stop(), a fault, a stall).
  bool stopped() const { return loop_done_.load(); }

 private:
  Session(Config config, std::unique_ptr<ops::Transport> transport);
  Status init_global_set();

  // The communication thread's loop (background_loop.cc).
  void run();
  Status step(bool* did_work);
  Status send_requests(bool* did_work);
  Status receive_messages(bool* did_work);
  Status emit_responses();
  Status execute(ResponseList list);
  // Runs one fusion batch. Sets *deferred when its ops complete later, once the device has
  // done the work (Note [Device completion]); otherwise the caller completes them.
  Status execute_batch(std::vector<Work>& batch, bool* deferred);
  Status run_collective(std::vector<Work>& batch, ops::Backend& backend, Mover& mover);
  // The device of a device batch on this rank (Note [Device lanes]).
  Device device_of(std::span<const Work> batch) const;
  // Whether this rank is a member of the response's set that joined without submitting it
  // (see Note [Join] in controller.h).
  bool is_absent_member(const Response& response) const;
  // The set changes, at their place in the response order (api_process_set.cc's ops).
  Status add_process_set(const Work& work);
  Status remove_process_set(const Work& work);
  Status finish_handshake();
  void check_stalls();
  void begin_shutdown(ErrorCode code, const std::string& message);
  void finish(const Status& status);

  Config config_;
  std::unique_ptr<ops::Transport> transport_;
  ops::ControlPlane* plane_ = nullptr;
  int rank_ = 0;
  bool is_coordinator_ = false;
  TensorQueue queue_;

  mutable std::mutex sets_mutex_;
  std::map<int, SetInfo> sets_;  // Guarded by sets_mutex_ (the loop reads it too).
  std::map<int, std::unique_ptr<ops::Backend>> backends_;  // Communication thread.

  // Rank 0 writes it (see Timeline); declared before its users so it outlives them.
  Timeline timeline_;

  // Communication thread state.
  std::optional<Coordinator> coordinator_;  // Rank 0 only.
  RankCache cache_;
  Executor executor_;
  HostMover host_mover_;
  DevicePath device_;
  std::vector<std::int32_t> resend_to_self_;
  bool shutdown_sent_ = false;
  bool shutdown_received_ = false;
  int shutdown_messages_ = 0;  // Coordinator: shutdown messages received from other ranks.
  Status shutdown_status_;
  Clock::time_point last_stall_check_;
  std::map<std::string, bool> stall_warned_;

  std::atomic<std::uint64_t> set_changes_{0};
  std::atomic<int> device_index_{-1};  // claim_device(); -1 until the first CUDA op.
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> loop_done_{false};
  std::thread thread_;
};

}  // namespace tutti::core

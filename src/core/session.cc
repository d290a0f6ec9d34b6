// SPDX-License-Identifier: Apache-2.0
#include "src/core/session.h"

#include <numeric>

#include "src/common/logging.h"
#include "src/common/strings.h"

namespace tutti::core {

Session::Session(Config config, std::unique_ptr<ops::Transport> transport)
    : config_(std::move(config)),
      transport_(std::move(transport)),
      plane_(&transport_->control_plane()),
      rank_(transport_->topology().rank),
      is_coordinator_(rank_ == 0),
      host_mover_(static_cast<std::size_t>(config_.fusion_threshold_bytes)),
      device_(config_.num_nccl_streams, &timeline_) {
  executor_.set_timeline(&timeline_);
}

Result<std::shared_ptr<Session>> Session::create(Config config,
                                                 std::unique_ptr<ops::Transport> transport) {
  std::shared_ptr<Session> session(new Session(std::move(config), std::move(transport)));
  TUTTI_RETURN_IF_ERROR(session->init_global_set());
  if (!session->config_.timeline_path.empty()) {
    // Only rank 0 opens the file: failing init() there alone would leave the others waiting.
    const Status timeline = session->start_timeline(session->config_.timeline_path,
                                                    session->config_.timeline_mark_cycles);
    if (!timeline.ok()) TUTTI_LOG_ERROR("TUTTI_TIMELINE: ", timeline.message());
  }
  session->last_stall_check_ = Clock::now();
  session->thread_ = std::thread([raw = session.get()] { raw->run(); });
  return session;
}

Status Session::init_global_set() {
  std::vector<int> ranks(static_cast<std::size_t>(topology().size));
  std::iota(ranks.begin(), ranks.end(), 0);
  TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<ops::Backend> backend, transport_->create_backend(ranks));
  backends_[0] = std::move(backend);
  if (is_coordinator_) {
    coordinator_.emplace(config_.cache_capacity);
    coordinator_->set_timeline(&timeline_);
    coordinator_->add_set(0, ranks);
  }
  std::lock_guard<std::mutex> lock(sets_mutex_);
  sets_[0] = SetInfo{.id = 0,
                     .ranks = std::make_shared<const std::vector<int>>(std::move(ranks)),
                     .set_rank = rank_};
  return Status();
}

Session::~Session() { stop(); }

Status Session::submit(std::shared_ptr<Entry> entry) {
  if (loop_done_.load()) return Status(ErrorCode::ShutDown, "Tutti has shut down");
  // A push racing with the loop's end is either refused or failed by finish(): close() takes
  // the queue's lock too.
  return queue_.push(std::move(entry));
}

Status Session::claim_device(Device device) {
  int expected = -1;
  if (device_index_.compare_exchange_strong(expected, device.index) || expected == device.index)
    return Status();
  return invalid_argument(detail::str_cat(
      "this rank's CUDA tensors are on cuda:", expected, ", and a rank uses one device per "
      "session (call tutti::shutdown() and tutti::init() to move to cuda:", device.index, ")"));
}

Result<SetInfo> Session::process_set(int id) const {
  std::lock_guard<std::mutex> lock(sets_mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return invalid_argument(detail::str_cat("unknown process set ", id));
  return it->second;
}

Status Session::start_timeline(const std::string& path, bool mark_cycles) {
  // Only the coordinator sees every rank's arrival, so only rank 0 writes a timeline.
  if (!is_coordinator_) return Status();
  return timeline_.start(path, mark_cycles);
}

void Session::stop() {
  if (thread_.joinable()) {
    stop_requested_.store(true);
    queue_.wake();
    thread_.join();
  }
  timeline_.stop();  // Leaves a complete JSON file.
  // Communicators are freed collectively: every rank reaches here from its own shutdown().
  backends_.clear();
}

}  // namespace tutti::core

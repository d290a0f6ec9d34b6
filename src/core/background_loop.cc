// SPDX-License-Identifier: Apache-2.0
// The communication thread of a Session. See Note [Threading model] in session.h and
// Note [Negotiation] in controller.h.
#include <pthread.h>

#include <algorithm>
#include <thread>
#include <unordered_map>

#include "ops/device_ops.h"
#include "src/common/check.h"
#include "src/common/logging.h"
#include "src/core/fusion_planner.h"
#include "src/core/message_codec.h"
#include "src/core/session.h"

namespace tutti::core {
namespace {

using detail::str_cat;
using std::chrono::microseconds;

// Idle policy: spin this long after the last work (ops often come in bursts), then sleep with
// a timeout that grows with the idle time up to a cap: short while ops are in flight (a peer's
// answer may come any moment), long when nothing is (an idle job then wakes ~200 times/s).
constexpr microseconds kSpinTime{50};
constexpr microseconds kBusyCap{200};
constexpr microseconds kIdleCap{5000};
// The coordinator waits this long for every rank's shutdown message.
constexpr std::chrono::seconds kShutdownAnswerTimeout{10};
// New ops arriving closer together than this are sent to the coordinator as one message.
constexpr microseconds kBatchGap{3};
constexpr std::chrono::seconds kStallCheckInterval{1};

}  // namespace

// Note [Shutdown handshake]
// Every rank sends the coordinator exactly one RequestList with `shutdown` set per session,
// and it is the rank's last message: its own request when stop() is called, or, if the
// coordinator's "bye" came first, an acknowledgement of it. The coordinator sends "bye" to every rank once (after the ready
// responses) and keeps receiving until it has that one message from every rank. So no message
// of a session is left unreceived when its communicators are freed; OpenMPI reuses a freed
// communicator's context, and a stray message would reach the next session.
void Session::run() {
  pthread_setname_np(pthread_self(), "tutti-comm");
  Status status;
  Clock::time_point idle_since = Clock::now();
  try {
    while (status.ok() && !shutdown_received_) {
      if (stop_requested_.load() && !shutdown_sent_) {
        shutdown_sent_ = true;
        if (is_coordinator_) {
          begin_shutdown(ErrorCode::ShutDown, str_cat("rank ", rank_, " shut down"));
          continue;
        }
        RequestList bye;
        bye.shutdown = true;
        TUTTI_LOG_DEBUG("asking the coordinator to shut down");
        status = plane_->send(0, encode(bye));
        continue;
      }
      bool did_work = false;
      status = step(&did_work);
      const Clock::time_point now = Clock::now();
      if (did_work) {
        idle_since = now;
        timeline_.mark_cycle();
        continue;
      }
      const auto idle = std::chrono::duration_cast<microseconds>(now - idle_since);
      if (idle < kSpinTime) {
        std::this_thread::yield();
        continue;
      }
      const microseconds cap = queue_.empty() ? kIdleCap : kBusyCap;
      queue_.wait_for_work(std::clamp(idle / 8, microseconds{10}, cap));
    }
    if (status.ok()) status = finish_handshake();
  } catch (const std::exception& e) {
    status = Status(ErrorCode::Internal, str_cat("Tutti's communication thread failed: ", e.what()));
  }
  finish(status);
}

// See Note [Shutdown handshake].
Status Session::finish_handshake() {
  if (!is_coordinator_) {
    if (shutdown_sent_) return Status();
    shutdown_sent_ = true;
    RequestList ack;
    ack.shutdown = true;
    TUTTI_LOG_DEBUG("acknowledging the coordinator's shutdown");
    return plane_->send(0, encode(ack));
  }
  const Clock::time_point deadline = Clock::now() + kShutdownAnswerTimeout;
  while (shutdown_messages_ < plane_->size() - 1) {
    TUTTI_ASSIGN_OR_RETURN(std::optional<ops::Message> message, plane_->poll());
    if (!message) {
      if (Clock::now() > deadline) {
        TUTTI_LOG_WARNING("not every rank acknowledged the shutdown (", shutdown_messages_, " of ",
                          plane_->size() - 1, "); stopping anyway");
        return Status();
      }
      std::this_thread::sleep_for(microseconds{50});
      continue;
    }
    TUTTI_ASSIGN_OR_RETURN(RequestList list, decode_request_list(message->bytes));
    if (list.shutdown) ++shutdown_messages_;
  }
  return Status();
}

Status Session::step(bool* did_work) {
  TUTTI_RETURN_IF_ERROR(device_.check());
  TUTTI_RETURN_IF_ERROR(receive_messages(did_work));
  if (shutdown_received_) return Status();
  TUTTI_RETURN_IF_ERROR(send_requests(did_work));
  if (is_coordinator_) {
    check_stalls();
    if (coordinator_->has_ready() && !shutdown_received_) {
      *did_work = true;
      TUTTI_RETURN_IF_ERROR(emit_responses());
    }
  }
  return Status();
}

Status Session::send_requests(bool* did_work) {
  // A rank's shutdown message is its last (Note [Shutdown handshake]); ops still queued then
  // are failed by finish().
  if (shutdown_sent_) return Status();
  std::vector<std::shared_ptr<Entry>> entries = queue_.drain_new();
  if (entries.empty() && resend_to_self_.empty()) return Status();
  *did_work = true;
  // Batch while ops keep arriving (a training step submits many at once), but never longer
  // than the cycle time: a lone op goes out after one short gap.
  const Clock::time_point deadline = Clock::now() + config_.cycle_time;
  for (Clock::time_point gap_end = Clock::now() + kBatchGap; Clock::now() < deadline;) {
    std::vector<std::shared_ptr<Entry>> more = queue_.drain_new();
    if (!more.empty()) {
      for (auto& entry : more) entries.push_back(std::move(entry));
      gap_end = Clock::now() + kBatchGap;
    } else if (Clock::now() >= gap_end) {
      break;
    }
  }
  RequestList list;
  for (const std::shared_ptr<Entry>& entry : entries) {
    if (std::optional<std::int32_t> id = cache_.lookup(entry->request)) {
      entry->cache_hit = *id;
      list.cache_hits.push_back(*id);
    } else {
      list.requests.push_back(entry->request);
    }
  }
  if (!is_coordinator_) return plane_->send(0, encode(list));
  std::vector<std::int32_t> resend;
  coordinator_->receive(rank_, std::move(list), Clock::now(), &resend);
  TUTTI_CHECK(resend.empty(), "the coordinator's own cache hits went stale");
  return Status();
}

Status Session::receive_messages(bool* did_work) {
  while (!shutdown_received_) {
    TUTTI_ASSIGN_OR_RETURN(std::optional<ops::Message> message, plane_->poll());
    if (!message) return Status();
    *did_work = true;
    if (is_coordinator_) {
      TUTTI_ASSIGN_OR_RETURN(RequestList list, decode_request_list(message->bytes));
      if (list.shutdown) ++shutdown_messages_;
      ResponseList answer;
      coordinator_->receive(message->source, std::move(list), Clock::now(), &answer.resend);
      if (!answer.resend.empty()) TUTTI_RETURN_IF_ERROR(plane_->send(message->source, encode(answer)));
      if (coordinator_->shutdown_requested()) {
        begin_shutdown(ErrorCode::ShutDown, str_cat("rank ", message->source, " shut down"));
      }
    } else {
      TUTTI_ASSIGN_OR_RETURN(ResponseList list, decode_response_list(message->bytes));
      TUTTI_RETURN_IF_ERROR(execute(std::move(list)));
    }
  }
  return Status();
}

Status Session::emit_responses() {
  ResponseList list = coordinator_->take_ready();
  const std::string bytes = encode(list);
  for (int r = 0; r < plane_->size(); ++r) {
    if (r != rank_) TUTTI_RETURN_IF_ERROR(plane_->send(r, bytes));
  }
  return execute(std::move(list));
}

void Session::begin_shutdown(ErrorCode code, const std::string& message) {
  // Finish what is negotiated first, so every rank ends after the same responses.
  if (coordinator_->has_ready()) static_cast<void>(emit_responses());
  ResponseList bye;
  bye.shutdown = true;
  bye.shutdown_code = code;
  bye.shutdown_message = message;
  const std::string bytes = encode(bye);
  for (int r = 0; r < plane_->size(); ++r) {
    // A failed send here has no one left to report to; the peers time out instead.
    if (r != rank_) static_cast<void>(plane_->send(r, bytes));
  }
  static_cast<void>(execute(std::move(bye)));
}

Status Session::execute(ResponseList list) {
  if (!list.resend.empty() && !shutdown_sent_) {
    // The coordinator evicted ids this rank sent as hits: send those requests in full.
    RequestList again;
    for (std::int32_t id : list.resend) {
      for (const auto& entry : queue_.with_cache_hit(id)) {
        entry->cache_hit = -1;
        again.requests.push_back(entry->request);
      }
    }
    TUTTI_RETURN_IF_ERROR(plane_->send(0, encode(again)));
  }
  std::vector<Work> works;
  works.reserve(list.responses.size());
  for (std::size_t i = 0; i < list.responses.size(); ++i) {
    const Response* response = &list.responses[i];
    if (list.hit[i]) {
      response = cache_.response(list.cache_ids[i]);
      TUTTI_CHECK(response != nullptr, "cache id ", list.cache_ids[i], " is unknown on rank ", rank_);
    }
    std::shared_ptr<Entry> entry = queue_.take(response->process_set_id, response->name);
    if (!list.hit[i] && list.cache_ids[i] >= 0) {
      // Every rank stores every cached response, members of its set or not: hits are sent
      // to every rank, and each must resolve them. A non-member never looks its request up.
      Request placeholder;
      placeholder.process_set_id = response->process_set_id;
      placeholder.name = response->name;
      cache_.insert(list.cache_ids[i], entry != nullptr ? entry->request : placeholder, *response);
    }
    if (entry == nullptr) {
      // Not a member of the set, or a member that joined without submitting the op: it
      // still takes part in the collective (see Note [Join] in controller.h).
      if (is_absent_member(*response)) {
        queue_.skip_automatic_name(response->process_set_id, response->name);
        if (response->ok) works.push_back(Work{.response = response, .entry = nullptr});
      }
      continue;
    }
    if (!response->ok) {
      entry->state->complete(Status(response->error_code, response->error_message));
      continue;
    }
    if (timeline_.enabled()) {
      const TensorSpec& spec = response->tensors.empty() ? TensorSpec{} : response->tensors.front();
      timeline_.op_start(response->name, to_string(response->op), to_string(spec.dtype),
                         detail::shape_string(spec.shape));
    }
    works.push_back(Work{.response = response, .entry = std::move(entry)});
  }
  std::vector<FusionItem> items;
  items.reserve(works.size());
  for (const Work& work : works) {
    const std::uint64_t key = fusion_key(*work.response);
    items.push_back(
        FusionItem{.key = key, .bytes = key == 0 ? SIZE_MAX : fusion_bytes(*work.response)});
  }
  Status fault;
  for (const std::vector<std::size_t>& indices : plan_fusion(items, static_cast<std::size_t>(config_.fusion_threshold_bytes))) {
    std::vector<Work> batch;
    for (std::size_t i : indices) batch.push_back(works[i]);
    // After a transport fault the peers are in an unknown state: fail the rest, run nothing.
    bool deferred = false;
    const Status status = fault.ok() ? execute_batch(batch, &deferred) : fault;
    for (Work& work : batch) {
      if (deferred) break;
      if (work.entry == nullptr) continue;
      if (timeline_.enabled()) timeline_.op_end(work.response->name, status.ok() ? "OK" : status.message());
      work.entry->state->complete(status);
    }
    if (!status.ok() && status.code() == ErrorCode::Communication) fault = status;
  }
  // Evictions last: ids are never reused, a list that inserts more entries than the capacity
  // evicts some of its own (the coordinator did so while building it), and `works` point into
  // the cache until their batches have run.
  for (std::int32_t id : list.evicted) cache_.erase(id);
  if (list.shutdown) {
    shutdown_received_ = true;
    shutdown_status_ = Status(list.shutdown_code, list.shutdown_message);
  }
  return fault;
}

Status Session::execute_batch(std::vector<Work>& batch, bool* deferred) {
  Work& first = batch.front();
  const Response& response = *first.response;
  switch (response.op) {
    case Collective::Join:
      // Every member has joined: nothing to move, only the answer (see Note [Join]).
      first.entry->state->join_result = response.last_joined_rank;
      return Status();
    case Collective::AddProcessSet: return add_process_set(first);
    case Collective::RemoveProcessSet: return remove_process_set(first);
    default: break;
  }
  ops::Backend& backend = *backends_.at(response.process_set_id);
  if (response.device == Device::Kind::CPU) return run_collective(batch, backend, host_mover_);
  TUTTI_ASSIGN_OR_RETURN(DevicePath::Lane lane,
                         device_.next_lane(response.process_set_id, backend, device_of(batch)));
  TUTTI_RETURN_IF_ERROR(run_collective(batch, *lane.backend, *lane.mover));
  TUTTI_RETURN_IF_ERROR(device_.complete_later(lane, batch));
  *deferred = true;
  return Status();
}

Status Session::run_collective(std::vector<Work>& batch, ops::Backend& backend, Mover& mover) {
  Work& first = batch.front();
  const Response& response = *first.response;
  if (response.op != Collective::Allreduce) executor_.mark(batch, to_string(response.op));
  switch (response.op) {
    case Collective::Allreduce: return executor_.allreduce(batch, backend, mover);
    case Collective::Broadcast: {
      const SetInfo set = process_set(response.process_set_id).value();
      const auto& ranks = *set.ranks;
      const int root = static_cast<int>(std::find(ranks.begin(), ranks.end(), response.root_rank) -
                                        ranks.begin());
      return executor_.broadcast(first, backend, mover, root);
    }
    case Collective::Allgather: return executor_.allgather(batch, backend, mover);
    case Collective::Alltoall: return executor_.alltoall(first, backend, mover);
    case Collective::Reducescatter: return executor_.reducescatter(batch, backend, mover);
    case Collective::Barrier: return backend.barrier();
    case Collective::Join:
    case Collective::AddProcessSet:
    case Collective::RemoveProcessSet: break;  // Handled by execute_batch.
  }
  TUTTI_CHECK(false, "unknown collective ", static_cast<int>(response.op));
}

Device Session::device_of(std::span<const Work> batch) const {
  for (const Work& work : batch) {
    if (work.entry != nullptr && !work.entry->inputs.empty())
      return work.entry->inputs.front().device();
  }
  const int claimed = device_index_.load();
  if (claimed >= 0) return Device::cuda(claimed);
  const int devices = std::max(1, ops::device_ops().device_count());
  return Device::cuda(topology().local_rank % devices);
}

bool Session::is_absent_member(const Response& response) const {
  if (response.joined.empty()) return false;
  Result<SetInfo> set = process_set(response.process_set_id);
  if (!set.ok() || set.value().set_rank < 0) return false;
  const int me = set.value().set_rank;
  return std::find(response.joined.begin(), response.joined.end(), me) != response.joined.end();
}

// Every rank runs this at the same point of the response order, so create_backend (collective
// over all ranks) lines up everywhere. The coordinator already numbered and filed the set.
Status Session::add_process_set(const Work& work) {
  const Response& response = *work.response;
  const std::vector<int> ranks(response.rows.begin(), response.rows.end());
  TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<ops::Backend> backend, transport_->create_backend(ranks));
  const auto member = std::find(ranks.begin(), ranks.end(), rank_);
  if (backend != nullptr) backends_[response.target_set_id] = std::move(backend);
  {
    std::lock_guard<std::mutex> lock(sets_mutex_);
    sets_[response.target_set_id] =
        SetInfo{.id = response.target_set_id,
                .ranks = std::make_shared<const std::vector<int>>(ranks),
                .set_rank = member == ranks.end() ? -1 : static_cast<int>(member - ranks.begin())};
  }
  if (work.entry != nullptr) work.entry->state->join_result = response.target_set_id;
  return Status();
}

Status Session::remove_process_set(const Work& work) {
  const int id = work.response->target_set_id;
  // Forget the set first, so that new ops on it are refused by the call, then fail the ones
  // in flight (the coordinator dropped them).
  {
    std::lock_guard<std::mutex> lock(sets_mutex_);
    sets_.erase(id);
  }
  const Status removed(ErrorCode::ShutDown, str_cat("process set ", id, " was removed"));
  for (const std::shared_ptr<Entry>& entry : queue_.take_set(id)) entry->state->complete(removed);
  device_.remove_set(id);  // Its backends use the host backend.
  backends_.erase(id);
  return Status();
}

void Session::check_stalls() {
  const Clock::time_point now = Clock::now();
  if (config_.stall_check_disabled || now - last_stall_check_ < kStallCheckInterval) return;
  last_stall_check_ = now;
  const std::vector<Coordinator::Stall> stalls = coordinator_->stalls(now, config_.stall_check_time);
  if (stalls.empty()) return;
  // Up to a few names per missing rank, in one explanation used for the warning and the error.
  std::map<int, std::vector<std::string>> by_rank;
  bool past_limit = false;
  bool fresh = false;
  for (const Coordinator::Stall& stall : stalls) {
    for (int r : stall.missing) {
      if (by_rank[r].size() < 5) by_rank[r].push_back(stall.name);
    }
    past_limit = past_limit || (config_.stall_shutdown_time.count() > 0 && stall.waited >= config_.stall_shutdown_time);
    fresh = fresh || !stall_warned_[stall.name];
    stall_warned_[stall.name] = true;
  }
  std::string missing;
  for (const auto& [r, names] : by_rank) {
    missing += str_cat(missing.empty() ? "" : "; ", "rank ", r, ": ", detail::join_list(names));
  }
  const std::string explanation =
      str_cat("ops were submitted by some ranks but not by others for more than ",
              std::chrono::duration_cast<std::chrono::seconds>(config_.stall_check_time).count(),
              " s; missing: ", missing);
  if (past_limit) {
    begin_shutdown(ErrorCode::Stalled, str_cat("Stalled: ", explanation, " (past TUTTI_STALL_SHUTDOWN_TIME_SECONDS=",
                                               config_.stall_shutdown_time.count() / 1000.0, ")"));
  } else if (fresh) {
    TUTTI_LOG_WARNING("Stall: ", explanation);
  }
}

void Session::finish(const Status& status) {
  const Status refused(ErrorCode::ShutDown, "Tutti has shut down");
  const Status pending = !status.ok() ? status : shutdown_status_.ok() ? refused : shutdown_status_;
  if (!status.ok()) TUTTI_LOG_ERROR(status.message());
  device_.finish(pending);
  // Every pending op fails with the reason the loop ended (for a stall: the same explanation
  // on every rank, as API.md asks); later ops are refused with ShutDown.
  for (const std::shared_ptr<Entry>& entry : queue_.close(refused)) entry->state->complete(pending);
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(2);
  while (!plane_->sends_done() && Clock::now() < deadline) std::this_thread::yield();
  loop_done_.store(true);
}

}  // namespace tutti::core

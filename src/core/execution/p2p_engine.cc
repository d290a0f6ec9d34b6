// SPDX-License-Identifier: Apache-2.0
// See Note [P2P stage] in p2p_engine.h.
#include "src/core/execution/p2p_engine.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "src/base/coarse_clock.h"
#include "src/base/strings.h"
#include "src/common/logging.h"
#include "src/core/op_state.h"

namespace tutti::core {
namespace {

using detail::str_cat;

// A header's fixed part: dtype, inline flag, element count (in host byte order: every rank of a
// job runs on the same kind of machine).
constexpr std::size_t kHeaderBytes = 1 + 1 + 8;

}  // namespace

std::string encode_p2p_header(DataType dtype, std::int64_t count, const void* inline_data,
                              std::size_t inline_bytes) {
  std::string bytes(kHeaderBytes + inline_bytes, '\0');
  bytes[0] = static_cast<char>(dtype);
  bytes[1] = static_cast<char>(inline_data != nullptr ? 1 : 0);
  std::memcpy(bytes.data() + 2, &count, sizeof count);
  if (inline_bytes > 0) std::memcpy(bytes.data() + kHeaderBytes, inline_data, inline_bytes);
  return bytes;
}

Status P2PQueue::push(std::vector<P2POpEntry> ops) {
  detail::MutexLock lock(mutex_);
  if (!closed_.ok()) return closed_;
  for (P2POpEntry& op : ops) new_.push_back(std::move(op));
  return Status();
}

std::vector<P2POpEntry> P2PQueue::drain() {
  detail::MutexLock lock(mutex_);
  std::vector<P2POpEntry> out;
  out.swap(new_);
  return out;
}

bool P2PQueue::empty() {
  detail::MutexLock lock(mutex_);
  return new_.empty();
}

std::vector<P2POpEntry> P2PQueue::close(const Status& status) {
  detail::MutexLock lock(mutex_);
  closed_ = status;
  std::vector<P2POpEntry> out;
  out.swap(new_);
  return out;
}

std::vector<P2POpEntry> P2PQueue::take_set(int set_id) {
  detail::MutexLock lock(mutex_);
  std::vector<P2POpEntry> out;
  std::erase_if(new_, [&](P2POpEntry& op) {
    if (op.set_id != set_id) return false;
    out.push_back(std::move(op));
    return true;
  });
  return out;
}

P2PEngine::P2PEngine(std::unique_ptr<ops::P2PChannel> channel, P2PQueue& queue,
                     const Completer& completer, const Config& config, bool drivable,
                     std::function<void()> wake_loop)
    : channel_(std::move(channel)),
      queue_(queue),
      completer_(completer),
      config_(config),
      drivable_(drivable),
      max_channel_tag_(channel_ != nullptr ? channel_->max_tag() : std::numeric_limits<int>::max()),
      wake_loop_(std::move(wake_loop)) {}

int P2PEngine::channel_tag(int set_id, int tag) {
  // 2^22 channel tags, 32768 for each of the sets 0 ... kMaxSetId; the MPI channel doubles them
  // (Note [P2P protocol]), which Open MPI's MPI_TAG_UB (2^31 - 1) and Debian's MPICH's (2^28 - 1)
  // hold. The MPI standard asks only for 32767: check_tag() refuses what lies beyond.
  static_assert((kMaxSetId + 1) * (kMaxUserTag + 1) == (1 << 22));
  if (set_id < 0 || set_id > kMaxSetId) return -1;
  return set_id * (kMaxUserTag + 1) + tag;
}

Status P2PEngine::check_tag(const P2POpEntry& op) const {
  if (op.channel_tag <= max_channel_tag_) return Status();
  return invalid_argument(str_cat(
      op.send ? "isend" : "irecv", ": tag ", op.tag, " on process set ", op.set_id,
      " lies beyond this MPI's tag space (its MPI_TAG_UB leaves point-to-point ",
      max_channel_tag_ + 1, " tags: tags 0 to ", std::min(max_channel_tag_, kMaxUserTag),
      " on set 0", max_channel_tag_ > kMaxUserTag ? ", and likewise on the next sets" : "", ")"));
}

std::string P2PEngine::describe(const P2POpEntry& op) {
  const std::string peer = op.peer < 0 ? std::string("any rank") : str_cat("rank ", op.peer);
  return str_cat(op.send ? "isend to " : "irecv from ", peer, " with tag ", op.tag,
                 op.set_id != 0 ? str_cat(" on process set ", op.set_id) : std::string());
}

void P2PEngine::complete(P2POpEntry& op, const Status& status) {
  warned_.erase(op.entry.get());
  completer_.complete(*op.entry, status);
}

Status P2PEngine::progress(Clock::time_point now, bool* did_work) {
  // Held: an application thread is running a step (Note [A waiting thread drives
  // point-to-point]).
  if (!mutex_.try_lock()) return Status();
  // This step sees what driving threads left to it; the loop's naps after it are short while
  // any of it is in flight (busy()).
  left_to_loop_.store(false, std::memory_order_relaxed);
  if (failed_.ok()) failed_ = step(now, did_work);
  Status status = failed_;
  mutex_.unlock();
  return status;
}

void P2PEngine::drive() { step_on_app_thread(nullptr); }

void P2PEngine::drive_before_wait(const Entry& own) { step_on_app_thread(&own); }

void P2PEngine::step_on_app_thread(const Entry* own) {
  if (!mutex_.try_lock()) return;
  if (!finished_ && failed_.ok()) {
    bool did_work = false;
    started_ = false;
    // The caller's poll() never throws; the loop turns its own exceptions into a stop too.
    try {
      // The time is only for stall checks, which count in seconds; a waiting thread runs a
      // step every few hundred nanoseconds (Note [Coarse clock] in src/base/coarse_clock.h).
      failed_ = step(base::coarse_now(), &did_work);
    } catch (const std::exception& e) {
      failed_ =
          Status(ErrorCode::Internal,
                 str_cat("point-to-point progress on an application thread failed: ", e.what()));
    }
    // The loop may be asleep, not knowing of the ops this step started (perhaps other
    // threads' ops) that are still in flight (Note [Waking the loop for point-to-point]),
    // unless it looks soon anyway (Note [A wake left to the loop's next look]).
    if (!failed_.ok()) {
      wake_loop_();
    } else if (started_ && needs_polling(own)) {
      left_to_loop_.store(true);  // Before next_look_ is read: before_pause() reads the two.
      if (!loop_looks_soon()) wake_loop_();
    }
  }
  mutex_.unlock();
}

void P2PEngine::hand_back() {
  detail::MutexLock lock(mutex_);
  if (!finished_) wake_loop_();
}

std::chrono::microseconds P2PEngine::before_pause(Clock::time_point now,
                                                  std::chrono::microseconds nap) {
  // See Note [A wake left to the loop's next look]: the announcement, then left_to_loop_, in this
  // order.
  next_look_.store((now + nap).time_since_epoch().count());
  if (nap <= kLookWithin || !left_to_loop_.load()) return nap;
  next_look_.store((now + kLookWithin).time_since_epoch().count());
  return kLookWithin;
}

bool P2PEngine::loop_looks_soon() const {
  // left_to_loop_ was stored before this load, in sequential consistency.
  return next_look_.load() <= (Clock::now() + kLookWithin).time_since_epoch().count();
}

bool P2PEngine::needs_polling(const Entry* own) const {
  for (const auto& [id, active] : active_) {
    if (active.op.entry.get() != own) return true;
  }
  return std::any_of(waiting_.begin(), waiting_.end(), [own](const P2POpEntry& op) {
    return op.entry.get() != own && op.entry->inputs[0].byte_size() > kInlineBytes;
  });
}

Status P2PEngine::step(Clock::time_point now, bool* did_work) {
  Status status = advance(now, did_work);
  busy_.store(!waiting_.empty() || !active_.empty(), std::memory_order_release);
  return status;
}

Status P2PEngine::advance(Clock::time_point now, bool* did_work) {
  for (P2POpEntry& op : queue_.drain()) {
    *did_work = true;
    started_ = true;
    TUTTI_RETURN_IF_ERROR(start(std::move(op)));
  }
  if (channel_ == nullptr) return Status();
  TUTTI_RETURN_IF_ERROR(match_waiting(did_work));
  TUTTI_RETURN_IF_ERROR(complete_finished(did_work));
  return check_stalls(now);
}

Status P2PEngine::match_waiting(bool* did_work) {
  // Oldest receive first: it gets the earlier of two messages both could take (MPI's order).
  // A receive that found nothing blocks the later ones that could take only what it waits for
  // (a message may arrive between two probes): a later receive from the same peer, and every
  // later receive behind an unmatched any-source one, wait for the next cycle. A later
  // any-source receive behind receives from given peers still probes, since a message from
  // another peer is its to take (before, it waited until those receives matched: for ever, if
  // their peer sent only after it completed); a header it dequeues from the peer of an older
  // unmatched receive goes to the oldest such receive instead.
  std::set<std::pair<int, int>> blocked;  // (channel tag, peer or -1) of unmatched receives.
  std::vector<bool> matched(waiting_.size(), false);
  for (std::size_t i = 0; i < waiting_.size(); ++i) {
    P2POpEntry& op = waiting_[i];
    const bool is_blocked = blocked.count({op.channel_tag, -1}) != 0 ||
                            (op.peer >= 0 && blocked.count({op.channel_tag, op.peer}) != 0);
    while (!is_blocked && !matched[i]) {
      TUTTI_ASSIGN_OR_RETURN(std::optional<ops::P2PChannel::Header> header,
                             channel_->take_header(op.peer, op.channel_tag));
      if (!header) break;
      std::size_t taker = i;  // Else the oldest unmatched receive from the header's source.
      if (op.peer < 0 && blocked.count({op.channel_tag, header->source}) != 0) {
        for (std::size_t j = 0; j < i && taker == i; ++j) {
          const P2POpEntry& older = waiting_[j];
          if (!matched[j] && older.channel_tag == op.channel_tag && older.peer == header->source)
            taker = j;
        }
      }
      TUTTI_RETURN_IF_ERROR(accept(waiting_[taker], std::move(header).value()));
      matched[taker] = true;
      *did_work = true;
    }
    if (!matched[i]) blocked.insert({op.channel_tag, op.peer});
  }
  if (std::find(matched.begin(), matched.end(), true) != matched.end()) {
    std::deque<P2POpEntry> left;
    for (std::size_t i = 0; i < waiting_.size(); ++i) {
      if (!matched[i]) left.push_back(std::move(waiting_[i]));
    }
    waiting_.swap(left);
  }
  return Status();
}

Status P2PEngine::complete_finished(bool* did_work) {
  if (active_.empty()) return Status();
  TUTTI_ASSIGN_OR_RETURN(const std::vector<ops::P2PChannel::Id> done, channel_->completed());
  for (const ops::P2PChannel::Id id : done) {
    auto it = active_.find(id);
    if (it == active_.end()) continue;
    *did_work = true;
    complete(it->second.op, it->second.status);
    active_.erase(it);
  }
  return Status();
}

Status P2PEngine::start(P2POpEntry op) {
  if (channel_ == nullptr) {
    complete(op, Status(ErrorCode::Internal, "this transport has no point-to-point channel"));
    return Status();
  }
  if (!op.send) {
    waiting_.push_back(std::move(op));
    return Status();
  }
  const TensorView& tensor = op.entry->inputs[0];
  const std::size_t bytes = tensor.byte_size();
  const bool inline_payload = bytes <= kInlineBytes;
  std::string header =
      encode_p2p_header(tensor.dtype(), tensor.num_elements(),
                        inline_payload ? tensor.data() : nullptr, inline_payload ? bytes : 0);
  TUTTI_ASSIGN_OR_RETURN(const ops::P2PChannel::Id id,
                         channel_->start_send(op.peer, op.channel_tag, std::move(header),
                                              tensor.data(), inline_payload ? 0 : bytes));
  active_.emplace(id, Active{.op = std::move(op), .status = Status(), .scratch = {}});
  return Status();
}

Status P2PEngine::accept(P2POpEntry& op, ops::P2PChannel::Header header) {
  const std::string& bytes = header.bytes;
  if (bytes.size() < kHeaderBytes) {
    return Status(ErrorCode::Communication,
                  str_cat(describe(op), ": a malformed message header (", bytes.size(), " bytes)"));
  }
  const auto dtype = static_cast<DataType>(static_cast<std::uint8_t>(bytes[0]));
  const bool is_inline = bytes[1] != 0;
  std::int64_t count = 0;
  std::memcpy(&count, bytes.data() + 2, sizeof count);
  const std::size_t payload = static_cast<std::size_t>(count) * element_size(dtype);
  op.entry->state->mutable_results().source = header.source;
  const TensorView& tensor = op.entry->inputs[0];
  Status status;
  if (dtype != tensor.dtype() || count != tensor.num_elements()) {
    status = Status(ErrorCode::Mismatch,
                    str_cat("irecv from rank ", header.source, " with tag ", op.tag,
                            ": the message holds ", count, " ", to_string(dtype),
                            " elements, the receive expects ", tensor.num_elements(), " ",
                            to_string(tensor.dtype()), " (the message was consumed)"));
  }
  if (is_inline) {
    if (status.ok() && payload > 0) {
      std::memcpy(tensor.data(), bytes.data() + kHeaderBytes, payload);
    }
    complete(op, status);
    return Status();
  }
  Active active{.op = op, .status = status, .scratch = {}};
  void* into = tensor.data();
  if (!status.ok()) {
    active.scratch.resize(payload);
    into = active.scratch.data();
  }
  TUTTI_ASSIGN_OR_RETURN(const ops::P2PChannel::Id id,
                         channel_->start_receive(header.source, op.channel_tag, into, payload));
  // Moving the vector keeps its heap block, so the scratch pointer given to MPI stays valid.
  active_.emplace(id, std::move(active));
  return Status();
}

Status P2PEngine::check_stalls(Clock::time_point now) {
  if (config_.stall_check_disabled || (waiting_.empty() && active_.empty())) return Status();
  // As the collectives' inspector looks: every tenth of the smaller limit, 10 ms to 1 s apart,
  // so that a shutdown limit below the check time is met within a tenth of itself too (before,
  // a quarter of the check time: a 0.5 s shutdown limit beside a 30 s check fired at 1.5 s).
  const Clock::duration smaller =
      config_.stall_shutdown_time.count() > 0
          ? std::min(config_.stall_check_time, config_.stall_shutdown_time)
          : config_.stall_check_time;
  const auto period = std::clamp<Clock::duration>(smaller / 10, std::chrono::milliseconds(10),
                                                  std::chrono::seconds(1));
  if (now - last_stall_check_ < period) return Status();
  last_stall_check_ = now;
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    const Status stalled = inspect(*it, now);
    if (!stalled.ok()) return stalled;  // finish() fails it, and the rest, with `stalled`.
  }
  for (auto it = active_.begin(); it != active_.end(); ++it) {
    const Status stalled = inspect(it->second.op, now);
    if (!stalled.ok()) return stalled;  // finish() fails it, and the rest, with `stalled`.
  }
  return Status();
}

Status P2PEngine::inspect(P2POpEntry& op, Clock::time_point now) {
  const Clock::duration waited = now - op.entry->submitted;
  const double seconds = std::chrono::duration<double>(waited).count();
  if (config_.stall_shutdown_time.count() > 0 && waited > config_.stall_shutdown_time) {
    return Status(ErrorCode::Stalled,
                  str_cat(describe(op), " found no match within ", seconds,
                          " s (TUTTI_STALL_SHUTDOWN_TIME_SECONDS); Tutti stops"));
  }
  if (waited > config_.stall_check_time && !warned_[op.entry.get()]) {
    warned_[op.entry.get()] = true;
    TUTTI_LOG_WARNING(describe(op), " has waited ", seconds,
                      " s for its peer (TUTTI_STALL_CHECK_TIME_SECONDS)");
  }
  return Status();
}

void P2PEngine::fail_set(int set_id, const Status& status) {
  detail::MutexLock lock(mutex_);
  if (finished_) return;
  for (P2POpEntry& op : queue_.take_set(set_id)) complete(op, status);
  // A loop, not erase_if: the thread-safety analysis cannot see the lock inside a lambda.
  std::deque<P2POpEntry> kept;
  for (P2POpEntry& op : waiting_) {
    if (op.set_id == set_id) {
      complete(op, status);
    } else {
      kept.push_back(std::move(op));
    }
  }
  waiting_.swap(kept);
  busy_.store(!waiting_.empty() || !active_.empty(), std::memory_order_release);
}

void P2PEngine::settle() {
  // See Note [Settling at the end].
  const Clock::time_point deadline = Clock::now() + kSettleTime;
  while (!waiting_.empty() || !active_.empty()) {
    bool did_work = false;
    if (!match_waiting(&did_work).ok() || !complete_finished(&did_work).ok()) return;
    if (did_work) continue;
    if (Clock::now() >= deadline) return;
    std::this_thread::yield();
  }
}

void P2PEngine::finish(const Status& status, const Status& refused) {
  detail::MutexLock lock(mutex_);
  finished_ = true;
  for (P2POpEntry& op : queue_.close(refused)) {
    // A receive submitted before the end may still find its message (settle() below). A send
    // not started yet is not started now: its peer's session is ending too.
    if (op.send) {
      complete(op, status);
    } else {
      waiting_.push_back(std::move(op));
    }
  }
  if (channel_ != nullptr && failed_.ok() && status.code() != ErrorCode::Communication) settle();
  if (channel_ != nullptr) channel_->abandon();
  for (P2POpEntry& op : waiting_) complete(op, status);
  waiting_.clear();
  for (auto& [id, active] : active_) complete(active.op, status);
  active_.clear();
  busy_.store(false, std::memory_order_release);
  channel_.reset();
}

}  // namespace tutti::core

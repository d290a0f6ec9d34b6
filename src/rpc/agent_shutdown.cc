// SPDX-License-Identifier: Apache-2.0
// The agent's ends: the shutdown handshake on the RPC thread, shutdown() and the teardown.
//
// Note [Graceful shutdown]
// shutdown(true) must return only when the whole group is quiet: no call in flight anywhere, no
// function running, every RRef released. A worker cannot tell that alone (a peer may still be
// about to call it), so rank 0 leads a termination detection over control frames, which are
// not counted as traffic:
//  1. Each worker whose application called shutdown(true) sends Intent to every worker (the
//     others only note it, for the wait below). Until the end every worker keeps serving and
//     calling as usual.
//  2. Once all Intents are in, the leader sends Probe(round) to everyone. A worker answers when
//     it is locally idle (nothing queued, no call of its own pending, no request being served,
//     pool idle) by first releasing the user RRefs nobody waits on (their deletes make it busy
//     again, so it answers in a later round) and then sending Report(round, sent, received):
//     its counts of requests and responses posted and decoded.
//  3. When every worker has reported, the leader sends Finish to all if the totals balance
//     (sent == received: nothing in flight) and every worker's counts equal its report of the
//     previous round; otherwise it probes again.
// Why that suffices: each worker was idle when it reported in round r and, its counts being
// unchanged, received and sent nothing until it reported in round r + 1; an idle worker only
// wakes on a message, and the rounds do not overlap, so at the moment the last report of round r
// was taken every worker was idle with nothing in flight, which is final.
// A worker that leaves without the handshake (shutdown(false)) sends Goodbye to everyone; calls
// waiting on it then fail with ShutDown.
// How long shutdown(true) waits: as long as the group makes progress, as PyTorch's graceful
// shutdown waits without limit, since a worker that called it early (a parameter server) must
// serve its peers' calls until they are done, however long that takes. Before, it gave up after
// the RpcOptions timeout plus kShutdownSlack counted from the call, and left while its peers
// still called it, failing their calls with ShutDown. But nothing may wait forever on a mistake
// (a worker that never calls shutdown(), a function that never returns), so it gives up once a
// whole window, shutdown_patience(), passes without progress: no request or response sent or
// received by this worker, no worker's Intent arriving. The window is the larger of the RPC
// timeout plus kShutdownSlack and the runtime's stall-shutdown time, after which a collective
// waiting on a peer fails too. Each RPC timeout of waiting it logs a warning naming the workers
// whose Intent has not arrived; giving up, a warning, and it stops as shutdown(false) does.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "src/base/strings.h"
#include "src/common/logging.h"
#include "src/rpc/agent.h"

namespace tutti::rpc::detail {
namespace {

using ::tutti::detail::str_cat;

constexpr auto kShutdownSlack = std::chrono::seconds(5);
constexpr int kLeader = 0;

}  // namespace

void Agent::handle_control(int source, const Frame& frame) {
  switch (frame.control) {
    case ControlKind::Goodbye:
      peer_left(source,
                Status(ErrorCode::ShutDown, str_cat("worker '", info(source).name, "' shut down")));
      break;
    case ControlKind::Intent: {
      {
        const tutti::detail::MutexLock lock(intents_mutex_);
        if (intended_[static_cast<std::size_t>(source)]) break;  // Once per worker.
        intended_[static_cast<std::size_t>(source)] = true;
      }
      last_progress_.store(Clock::now());
      if (++intents_ == size() && rank() == kLeader) {
        round_ = 1;
        for (int r = 0; r < size(); ++r) send_control(r, ControlKind::Probe, round_);
      }
      break;
    }
    case ControlKind::Probe: probe_round_ = frame.round; break;
    case ControlKind::Report: {
      if (frame.round != round_) break;
      reports_[source] = {frame.sent, frame.received};
      if (static_cast<int>(reports_.size()) < size()) break;
      std::uint64_t sent = 0, received = 0;
      for (const auto& [rank, counts] : reports_) {
        sent += counts.first;
        received += counts.second;
      }
      const bool quiet = sent == received && reports_ == last_reports_;
      last_reports_ = std::move(reports_);
      reports_.clear();
      ++round_;
      for (int r = 0; r < size(); ++r)
        send_control(r, quiet ? ControlKind::Finish : ControlKind::Probe, round_);
      break;
    }
    case ControlKind::Finish: finished_ = true; break;
  }
}

bool Agent::locally_idle() {
  if (!loopback_.empty() || in_progress_.load() != 0 || !pool_->idle()) return false;
  {
    const tutti::detail::MutexLock lock(queue_mutex_);
    if (!outgoing_.empty()) return false;
  }
  const tutti::detail::MutexLock lock(pending_mutex_);
  return pending_.empty();
}

bool Agent::shutdown_step() {
  if (force_requested_.load()) {
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      Frame bye;
      bye.kind = FrameKind::Control;
      bye.epoch = options_.epoch;
      bye.control = ControlKind::Goodbye;
      static_cast<void>(plane_.send(r, encode(bye)));  // Best effort: we are leaving anyway.
    }
    return true;
  }
  if (finished_) return true;
  if (graceful_requested_.load() && !intent_sent_) {
    intent_sent_ = true;
    for (int r = 0; r < size(); ++r) send_control(r, ControlKind::Intent);
  }
  if (sent_ != seen_sent_ || received_ != seen_received_) {  // Progress, for shutdown()'s wait.
    seen_sent_ = sent_;
    seen_received_ = received_;
    last_progress_.store(Clock::now());
  }
  if (probe_round_ != 0 && locally_idle() && rrefs_.release_users() == 0) {
    send_control(kLeader, ControlKind::Report, probe_round_, sent_, received_);
    probe_round_ = 0;
  }
  return false;
}

Clock::duration Agent::shutdown_patience() const {
  return std::max<Clock::duration>(default_timeout() + kShutdownSlack, options_.stall_shutdown);
}

std::string Agent::missing_intents() {
  std::vector<std::string> missing;
  const tutti::detail::MutexLock lock(intents_mutex_);
  for (int r = 0; r < size(); ++r) {
    if (!intended_[static_cast<std::size_t>(r)]) missing.push_back("'" + info(r).name + "'");
  }
  return missing.empty() ? std::string("none (calls or functions are still under way)")
                         : ::tutti::detail::join_list(missing);
}

void Agent::shutdown(bool graceful) {
  const tutti::detail::MutexLock once(shutdown_mutex_);
  if (torn_down_) return;
  torn_down_ = true;
  if (thread_.joinable()) {
    (graceful ? graceful_requested_ : force_requested_).store(true);
    wake();
    {
      const tutti::detail::MutexLock lock(state_mutex_);
      const Clock::time_point start = Clock::now();
      const Clock::duration patience = shutdown_patience();
      Clock::time_point next_warning = start + default_timeout();
      while (!loop_done_) {
        const Clock::time_point now = Clock::now();
        const Clock::time_point give_up = std::max(start, last_progress_.load()) + patience;
        if (now >= give_up) break;
        if (now >= next_warning) {
          if (graceful) {
            TUTTI_LOG_WARNING(
                "RPC: shutdown() on worker '", name(), "' has waited ", to_seconds(now - start),
                " s for the group; workers that have not called shutdown(): ", missing_intents());
          }
          next_warning = now + default_timeout();
        }
        state_cv_.wait_until(state_mutex_, std::min(give_up, next_warning));
      }
      if (!loop_done_) {
        TUTTI_LOG_WARNING("RPC: the graceful shutdown on worker '", name(),
                          "' saw no progress for ", to_seconds(patience),
                          " s (no call sent or answered here, no worker newly calling "
                          "shutdown()); workers that have not called shutdown(): ",
                          missing_intents(), "; stopping now");
        force_requested_.store(true);
        wake();
        while (!loop_done_) state_cv_.wait(state_mutex_);
      }
    }
    thread_.join();
  }
  // Running functions end (their calls fail fast now); queued ones are dropped.
  if (pool_) pool_->stop();
  rrefs_.clear();
  contexts_.clear();
  handlers_.clear();
  keep_alive_.reset();
}

void Agent::teardown(const Status& why) {
  {
    const tutti::detail::MutexLock pending(pending_mutex_);
    const tutti::detail::MutexLock queue(queue_mutex_);
    stopped_ = true;
    outgoing_.clear();
  }
  std::map<std::uint64_t, Pending> failed;
  {
    const tutti::detail::MutexLock lock(pending_mutex_);
    failed.swap(pending_);
    deadlines_.clear();
  }
  for (auto& [id, p] : failed) {
    p.future->complete(
        Status(why.code(), str_cat("RPC '", p.function, "' to worker '", info(p.destination).name,
                                   "' failed: ", why.message())));
  }
  const tutti::detail::MutexLock lock(state_mutex_);
  loop_done_ = true;
  state_cv_.notify_all();
}

}  // namespace tutti::rpc::detail

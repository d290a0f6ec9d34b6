// SPDX-License-Identifier: Apache-2.0
// See Note [The cycle] and Note [Shutdown handshake] in background_loop.h.
#include "src/core/background_loop.h"

#include <thread>

#include "src/base/strings.h"
#include "src/common/check.h"
#include "src/common/logging.h"
#include "src/core/negotiation/message_codec.h"
#include "src/core/op_state.h"

namespace tutti::core {
namespace {

using detail::str_cat;
using std::chrono::microseconds;

// While an application thread runs the cycles, the loop looks in this often anyway (a stop
// request; a stream of overlapping drivers): Note [A waiting thread runs the cycle].
constexpr microseconds kDrivenWatch{1000};
// Else a driving thread that starts point-to-point ops during a nap of the busy loop would wake
// it (Note [A wake left to the loop's next look] in execution/p2p_engine.h).
static_assert(P2PEngine::kLookWithin >= kBusyCap);
// The coordinator waits this long for every rank's last message.
constexpr std::chrono::seconds kShutdownAnswerTimeout{10};

}  // namespace

BackgroundLoop::BackgroundLoop(Parts parts)
    : parts_(parts),
      rank_(parts.plane.rank()),
      executor_({.queue = parts.queue,
                 .sets = parts.sets,
                 .device = parts.device,
                 .completer = parts.completer,
                 .timeline = &parts.timeline,
                 .recorder = &parts.recorder,
                 .p2p = &parts.p2p},
                static_cast<std::size_t>(parts.config.fusion_threshold_bytes)),
      sender_(parts.queue, executor_.cache(), parts.config.cycle_time, parts.config.desync_check,
              parts.sharing.shares_cpu) {
  if (rank_ == 0) {
    coordinator_.emplace(parts.config, parts.sets, &parts.timeline, parts.plane.size());
  }
}

Status BackgroundLoop::run(const std::atomic<bool>& stop_requested) {
  if (is_coordinator() && parts_.config.autotune) {
    // Here rather than in the constructor: the global set's backend exists by now, and says
    // whether there is a host transport to choose. The user's TUTTI_HOST_TRANSPORT=shm or
    // =mpi is a choice already.
    Autotuner::Options options = Autotuner::options_of(parts_.config);
    options.tune_host_routes =
        parts_.config.host_transport == ops::HostTransport::Auto && parts_.sets.routes_host(0);
    tuner_.emplace(std::move(options));
  }
  Status status;
  try {
    // LoopDriver::drive() calls it under the cycle lock, which the analysis cannot follow
    // through the std::function.
    parts_.driver.attach([this](bool* in_flight)
                             TUTTI_NO_THREAD_SAFETY_ANALYSIS { return driven_cycle(in_flight); });
    status = run_cycles(stop_requested);
    parts_.driver.detach();  // Nothing runs a cycle from here on.
    if (status.ok()) status = finish_handshake();
  } catch (const std::exception& e) {
    parts_.driver.detach();
    status =
        Status(ErrorCode::Internal, str_cat("Tutti's communication thread failed: ", e.what()));
  }
  if (!status.ok()) {
    // Tell the others, best effort, so that they stop instead of waiting for this rank (the
    // failure may be the transport itself, then they learn it from their own).
    static_cast<void>(stop_here(status));
    // A stall is no transport failure: the coordinator still collects every rank's last
    // message (a point-to-point stall may stop several ranks at once, each sending its own),
    // so none is left for the next session (Note [Shutdown handshake]).
    if (is_coordinator() && status.code() == ErrorCode::Stalled) {
      static_cast<void>(finish_handshake());
    }
  }
  return status;
}

Status BackgroundLoop::run_cycles(const std::atomic<bool>& stop_requested) {
  for (;;) {
    // Note [A waiting thread runs the cycle] in loop_driver.h.
    if (parts_.driver.driven()) parts_.driver.sleep_while_driven(kDrivenWatch);
    Pause pause;
    {
      detail::MutexLock lock(parts_.driver.cycle_mutex());
      std::optional<Status> end;
      try {
        end = step(stop_requested, &pause);
      } catch (const std::exception& e) {
        end =
            Status(ErrorCode::Internal, str_cat("Tutti's communication thread failed: ", e.what()));
      }
      if (end) {
        // Before the lock is let go: no driver may run a cycle after the loop's last (after a
        // fault, the peers are in an unknown state).
        parts_.driver.stop_driving();
        return *end;
      }
    }
    // Outside the lock, which a driver may be waiting for.
    if (pause.yield) std::this_thread::yield();
    if (pause.nap > microseconds{0}) parts_.queue.wait_for_work(pause.nap);
    if (pause.rung) parts_.plane.nap_ends();
  }
}

std::optional<Status> BackgroundLoop::step(const std::atomic<bool>& stop_requested, Pause* pause) {
  TUTTI_RETURN_IF_ERROR(parts_.driver.failure());
  if (executor_.shutdown()) return Status();
  if (stop_requested.load() && !sender_.last_sent()) {
    TUTTI_RETURN_IF_ERROR(stop_here(Status()));
    // Work like any other send: the bye it asks for comes soon, and the naps that wait for it
    // start short again instead of at the idle job's cap.
    last_work_ = Clock::now();
    return std::nullopt;
  }
  bool did_work = false;
  TUTTI_RETURN_IF_ERROR(cycle(&did_work));
  const Clock::time_point now = Clock::now();
  if (did_work) {
    last_work_ = now;
    parts_.timeline.mark_cycle();
    return std::nullopt;
  }
  // A ring from another host may come before the request it announces: look often again
  // (Note [Net bell] in ops/mpi/net_bell.h).
  if (parts_.plane.take_net_ring()) last_work_ = now;
  IdleFacts facts{.idle = std::chrono::duration_cast<microseconds>(now - last_work_),
                  .app_waiting = detail::app_threads_waiting(),
                  .receiving = parts_.plane.receiving(),
                  .p2p_busy = parts_.p2p.busy(),
                  .queue_empty = parts_.queue.empty()};
  // Read only by an idle loop's cap: not worked out between the polls of a busy one.
  facts.messages_may_wait = facts.queue_empty && !facts.p2p_busy && messages_may_wait();
  *pause = idle_pause(facts);
  // Says when this loop looks next, and naps shorter if a driving thread has meanwhile started
  // point-to-point ops without waking it (Note [A wake left to the loop's next look] in
  // execution/p2p_engine.h).
  pause->nap = parts_.p2p.before_pause(now, pause->nap);
  // Only the idle coordinator's naps (no op of its own in flight) go past kBusyCap, and only
  // they are rung: shorter ones end soon anyway, and each ring costs the sender a system call.
  if (pause->nap > kBusyCap && parts_.plane.rung_here()) {
    if (parts_.plane.nap_begins()) {
      parts_.plane.nap_ends();  // A message came meanwhile: the next cycle takes it.
      *pause = Pause{};
    } else {
      pause->rung = true;
    }
  }
  return std::nullopt;
}

bool BackgroundLoop::messages_may_wait() const {
  // See Note [Quiet naps] in idle_policy.h.
  if (sender_.last_sent()) return false;  // The bye is due.
  if (!is_coordinator()) return true;
  // Where this rank is in every set, a request from a rank that cannot ring names an op this
  // rank submits too, and that submission ends the nap.
  return coordinator_->quiet() &&
         (parts_.plane.all_senders_ring() || parts_.sets.every_set_includes(rank_));
}

Status BackgroundLoop::send_to_coordinator(const RequestList& list) {
  TUTTI_RETURN_IF_ERROR(parts_.plane.send(0, encode(list)));
  // See Note [Net bell] in ops/mpi/net_bell.h. Where the coordinator is in every set, its own
  // submission of each op ends its nap; only a rank's last message needs the ring then.
  if (parts_.plane.rings_net_bell() && (list.shutdown || !parts_.sets.every_set_includes(0))) {
    parts_.plane.ring_net_bell();
  }
  return Status();
}

Status BackgroundLoop::driven_cycle(bool* in_flight) {
  Status status;
  // Not after the bye: the loop ends on it (and the driver's let_go() wakes it to).
  if (!executor_.shutdown()) {
    try {
      bool did_work = false;
      status = cycle(&did_work);
      if (did_work) {
        last_work_ = Clock::now();  // The loop's idle policy counts from here.
        parts_.timeline.mark_cycle();
      }
    } catch (const std::exception& e) {
      status = Status(ErrorCode::Internal,
                      str_cat("a cycle on an application thread failed: ", e.what()));
    }
  }
  *in_flight = executor_.shutdown() || !parts_.queue.empty() || parts_.p2p.busy();
  return status;
}

Status BackgroundLoop::cycle(bool* did_work) {
  TUTTI_RETURN_IF_ERROR(parts_.device.check());
  TUTTI_RETURN_IF_ERROR(parts_.p2p.progress(Clock::now(), did_work));
  TUTTI_RETURN_IF_ERROR(receive(did_work));
  if (executor_.shutdown()) return Status();
  TUTTI_RETURN_IF_ERROR(send_new(did_work));
  if (is_coordinator()) {
    if (std::optional<ResponseList> list = coordinator_->take_list(Clock::now())) {
      *did_work = true;
      TUTTI_RETURN_IF_ERROR(broadcast_and_execute(std::move(*list)));
    }
  }
  return Status();
}

Status BackgroundLoop::receive(bool* did_work) {
  while (!executor_.shutdown()) {
    TUTTI_ASSIGN_OR_RETURN(std::optional<ops::Message> message, parts_.plane.poll());
    if (!message) return Status();
    *did_work = true;
    if (is_coordinator()) {
      TUTTI_ASSIGN_OR_RETURN(RequestList list, decode_request_list(message->bytes));
      ResponseList answer;
      answer.resend = coordinator_->receive(message->source, std::move(list), Clock::now());
      if (!answer.resend.empty())
        TUTTI_RETURN_IF_ERROR(parts_.plane.send(message->source, encode(answer)));
      continue;
    }
    TUTTI_ASSIGN_OR_RETURN(ResponseList list, decode_response_list(message->bytes));
    // Evicted hits go out again in full before the list runs (they cannot be in it).
    if (std::optional<RequestList> again = sender_.take_resend(list.resend)) {
      TUTTI_RETURN_IF_ERROR(send_to_coordinator(*again));
    }
    adopt_cycle_time(list);
    TUTTI_RETURN_IF_ERROR(executor_.execute(std::move(list)));
  }
  return Status();
}

void BackgroundLoop::adopt_cycle_time(const ResponseList& list) {
  if (list.cycle_time_us >= 0)
    sender_.set_cycle_time(std::chrono::microseconds(list.cycle_time_us));
}

Status BackgroundLoop::send_new(bool* did_work) {
  // A driving thread waits on its op; nothing is gained by letting it submit more.
  std::optional<RequestList> list = sender_.take_new(/*batch_by_yielding=*/!parts_.driver.driven());
  if (!list) return Status();
  *did_work = true;
  if (!is_coordinator()) return send_to_coordinator(*list);
  const std::vector<std::int32_t> resend =
      coordinator_->receive(rank_, std::move(*list), Clock::now());
  TUTTI_CHECK(resend.empty(), "the coordinator's own cache hits went stale");
  return Status();
}

Status BackgroundLoop::broadcast_and_execute(ResponseList list) {
  if (tuner_ && !tuner_->settled()) {
    if (std::optional<TunedSettings> tuned =
            tuner_->observe(seen_ops(list, executor_.cache()), Clock::now())) {
      list.fusion_threshold_bytes = tuned->fusion_threshold_bytes;
      list.cycle_time_us = tuned->cycle_time_us;
      list.host_routes = tuned->host_routes;
    }
  }
  const std::string bytes = encode(list);
  for (int r = 0; r < parts_.plane.size(); ++r) {
    if (r != rank_) TUTTI_RETURN_IF_ERROR(parts_.plane.send(r, bytes));
  }
  adopt_cycle_time(list);
  return executor_.execute(std::move(list));
}

Status BackgroundLoop::stop_here(const Status& why) {
  if (sender_.last_sent()) return Status();
  RequestList last = sender_.take_last(why);
  TUTTI_LOG_DEBUG("stopping: ", why.ok() ? "shutdown() was called" : why.message());
  if (!is_coordinator()) return send_to_coordinator(last);
  coordinator_->begin_shutdown(
      why.ok() ? Status(ErrorCode::ShutDown, "rank 0 shut down")
               : Status(ErrorCode::ShutDown, str_cat("rank 0 stopped: ", why.message())),
      /*after_error=*/!why.ok());
  if (!why.ok()) {
    // This rank cannot execute any more: send the bye only.
    if (std::optional<ResponseList> bye = coordinator_->take_list(Clock::now())) {
      const std::string bytes = encode(*bye);
      for (int r = 1; r < parts_.plane.size(); ++r)
        static_cast<void>(parts_.plane.send(r, bytes));  // No one left to report to.
    }
    return Status();
  }
  return Status();  // The next cycle emits the bye after the ready responses.
}

Status BackgroundLoop::finish_handshake() {
  if (!is_coordinator()) {
    // The bye came first: acknowledge it (Note [Shutdown handshake]).
    if (sender_.last_sent()) return Status();
    TUTTI_LOG_DEBUG("acknowledging the coordinator's shutdown");
    return parts_.plane.send(0, encode(sender_.take_last(Status())));
  }
  const Clock::time_point deadline = Clock::now() + kShutdownAnswerTimeout;
  while (!coordinator_->all_last_messages()) {
    TUTTI_ASSIGN_OR_RETURN(std::optional<ops::Message> message, parts_.plane.poll());
    if (!message) {
      if (Clock::now() > deadline) {
        TUTTI_LOG_WARNING("not every rank acknowledged the shutdown (",
                          coordinator_->last_messages(), " of ", parts_.plane.size() - 1,
                          "); stopping anyway");
        return Status();
      }
      std::this_thread::sleep_for(microseconds{50});
      continue;
    }
    TUTTI_ASSIGN_OR_RETURN(RequestList list, decode_request_list(message->bytes));
    if (list.shutdown)
      static_cast<void>(coordinator_->receive(message->source, std::move(list), Clock::now()));
  }
  return Status();
}

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// The agent's calls and its RPC thread (Note [RPC threading] in agent.h).
#include "src/rpc/agent.h"

#include <algorithm>
#include <utility>

#include "src/base/strings.h"
#include "src/common/byte_buffers.h"
#include "src/common/logging.h"
#include "src/dist_autograd/dist_engine.h"
#include "src/rpc/optimizer_host.h"
#include "src/rpc/serialize.h"

namespace tutti::rpc::detail {

using dist_autograd::detail::record_send;
namespace {

using ::tutti::detail::str_cat;

constexpr int kMaxPollsPerRound = 64;  // Then post what the handlers queued.

thread_local Agent* t_agent = nullptr;

}  // namespace

Agent* thread_agent() { return t_agent; }
AgentScope::AgentScope(Agent* agent) : previous_(t_agent) { t_agent = agent; }
AgentScope::~AgentScope() { t_agent = previous_; }

Agent::Agent(ops::ControlPlane& plane, AgentOptions options,
             std::map<std::string, Function> functions, std::shared_ptr<const void> keep_alive)
    : plane_(plane),
      options_(std::move(options)),
      keep_alive_(std::move(keep_alive)),
      functions_(std::move(functions)),
      rrefs_(*this),
      contexts_(options_.rank),
      gone_(options_.names.size(), 0),
      intended_(options_.names.size(), false) {}

Agent::~Agent() {
  // Only reached without shutdown() when an owner (a test) dropped the agent early.
  shutdown(false);
}

Result<int> Agent::rank_of(std::string_view name) const {
  for (std::size_t r = 0; r < options_.names.size(); ++r) {
    if (options_.names[r] == name) return static_cast<int>(r);
  }
  return invalid_argument(str_cat("unknown RPC worker '", name,
                                  "' (workers: ", ::tutti::detail::join_list(options_.names), ")"));
}

Clock::duration to_duration(double seconds) {
  // Capped at about 30 years, so that now() + timeout cannot overflow the clock.
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::min(seconds, 1e9)));
}

Clock::duration Agent::default_timeout() const {
  return to_duration(options_.options.timeout_seconds);
}

void Agent::add_handler(const std::string& name, Place place, Handler handler) {
  handlers_[name] = {place, std::move(handler)};
}

std::shared_ptr<FutureState> Agent::call(int to, std::string function, Message args,
                                         Clock::duration timeout, std::int64_t context_id,
                                         std::string meta, std::string shown) {
  return submit_call(to, std::move(function), std::move(args), timeout, context_id, std::move(meta),
                     std::move(shown), /*notify=*/true);
}

std::shared_ptr<FutureState> Agent::submit_call(int to, std::string function, Message args,
                                                Clock::duration timeout, std::int64_t context_id,
                                                std::string meta, std::string shown, bool notify) {
  auto future = std::make_shared<FutureState>();
  if (shown.empty()) shown = function;
  std::string refused;
  {
    const tutti::detail::MutexLock lock(pending_mutex_);
    if (stopped_) {
      refused = str_cat("RPC has shut down on worker '", name(), "'");
    } else if (gone_[static_cast<std::size_t>(to)]) {
      refused = str_cat("worker '", info(to).name, "' shut down");
    }
  }
  if (!refused.empty()) {  // Completed outside the lock: callbacks may call again.
    future->complete(Status(ErrorCode::ShutDown, str_cat("RPC '", shown, "' to worker '",
                                                         info(to).name, "' failed: ", refused)));
    return future;
  }
  Frame frame;
  frame.kind = FrameKind::Request;
  frame.epoch = options_.epoch;
  frame.id = next_id_.fetch_add(1);
  frame.function = function;
  frame.meta = std::move(meta);
  if (context_id >= 0) {
    if (std::shared_ptr<DistContext> context = contexts_.find(context_id)) {
      context->add_worker(to);
      frame.context_id = context_id;
      frame.autograd_message_id = record_send(*context, args.tensors);
    }
  }
  frame.payload = to_wire(args, to);
  std::string bytes = encode(frame);
  {
    const tutti::detail::MutexLock lock(pending_mutex_);
    const Clock::time_point deadline = Clock::now() + timeout;
    future->set_deadline(deadline, timed_out(shown, to, timeout));
    pending_.emplace(frame.id, Pending{.future = future,
                                       .destination = to,
                                       .function = std::move(shown),
                                       .deadline = deadline,
                                       .timeout = timeout});
    deadlines_.emplace(deadline, frame.id);
  }
  enqueue(to, std::move(bytes), /*counted=*/true, notify);
  return future;
}

Status Agent::timed_out(const std::string& function, int destination,
                        Clock::duration timeout) const {
  return Status(ErrorCode::Timeout,
                str_cat("RPC '", function, "' to worker '", info(destination).name,
                        "' timed out after ", to_seconds(timeout), " s"));
}

void Agent::enqueue(int destination, std::string bytes, bool counted, bool notify) {
  {
    const tutti::detail::MutexLock lock(queue_mutex_);
    outgoing_.push_back(
        Outgoing{.destination = destination, .bytes = std::move(bytes), .counted = counted});
  }
  if (notify) queue_cv_.notify_one();
}

void Agent::wake() {
  {
    const tutti::detail::MutexLock lock(queue_mutex_);
    wake_ = true;
  }
  queue_cv_.notify_one();
}

void Agent::send_control(int destination, ControlKind kind, std::uint64_t round, std::uint64_t sent,
                         std::uint64_t received) {
  Frame frame;
  frame.kind = FrameKind::Control;
  frame.epoch = options_.epoch;
  frame.control = kind;
  frame.round = round;
  frame.sent = sent;
  frame.received = received;
  enqueue(destination, encode(frame), /*counted=*/false);
}

void Agent::respond(const Incoming& request, const Result<Message>& result) {
  Frame frame;
  frame.kind = FrameKind::Response;
  frame.epoch = options_.epoch;
  frame.id = request.id;
  if (result.ok()) {
    const Message& message = result.value();
    if (Status valid = check_message(message, *this); !valid.ok()) {
      frame.status = Status(ErrorCode::InvalidArgument,
                            str_cat("RPC '", request.function, "' on worker '", name(),
                                    "' returned a bad Message: ", valid.message()));
    } else {
      if (request.context_id >= 0) {
        if (std::shared_ptr<DistContext> context = contexts_.find(request.context_id)) {
          frame.context_id = request.context_id;
          frame.autograd_message_id = record_send(*context, message.tensors);
        }
      }
      frame.payload = to_wire(message, request.source);
    }
  } else {
    frame.status = result.status();
  }
  enqueue(request.source, encode(frame), /*counted=*/true);
  in_progress_.fetch_sub(1);  // After the enqueue: see locally_idle().
}

std::shared_ptr<FutureState> Agent::run_function(const std::shared_ptr<Incoming>& request,
                                                 const std::string& function) {
  auto future = std::make_shared<FutureState>();
  auto it = functions_.find(function);
  if (it == functions_.end()) {
    future->complete(
        invalid_argument(str_cat("unknown RPC function '", function, "' on worker '", name(),
                                 "' (every worker registers it with register_function() "
                                 "before init_rpc())")));
    return future;
  }
  pool_->submit([this, request, future, &fn = it->second, function] {
    AgentScope agent(this);
    ContextScope context(request->context_id);
    const std::string prefix = str_cat("RPC '", function, "' on worker '", name(), "' failed: ");
    try {
      future->complete(fn(request->args));
    } catch (const Error& e) {
      future->complete(Status(e.code(), prefix + e.what()));
    } catch (const std::exception& e) {
      future->complete(Status(ErrorCode::Internal, prefix + e.what()));
    } catch (...) {
      future->complete(
          Status(ErrorCode::Internal, prefix + "an exception that is not a std::exception"));
    }
  });
  return future;
}

void Agent::dispatch(std::shared_ptr<Incoming> request) {
  auto handler = handlers_.find(request->function);
  if (handler == handlers_.end()) {
    run_handler(request,
                [this, request](Incoming&) { return run_function(request, request->function); });
    return;
  }
  if (handler->second.first == Place::RpcThread) {
    run_handler(request, handler->second.second);
    return;
  }
  pool_->submit([this, request, &fn = handler->second.second] {
    AgentScope agent(this);
    ContextScope context(request->context_id);
    run_handler(request, fn);
  });
}

void Agent::run_handler(const std::shared_ptr<Incoming>& request, const Handler& handler) {
  std::shared_ptr<FutureState> result;
  try {
    result = handler(*request);
  } catch (const Error& e) {
    result = FutureState::ready(Status(e.code(), e.what()));
  } catch (const std::exception& e) {
    result = FutureState::ready(Status(ErrorCode::Internal, e.what()));
  }
  result->then([weak = weak_from_this(), request](const Result<Message>& r) {
    if (std::shared_ptr<Agent> self = weak.lock()) self->respond(*request, r);
  });
}

// ---- The RPC thread ----

void Agent::run() {
  AgentScope scope(this);
  Clock::time_point last_activity = Clock::now();
  Clock::duration sleep = kMinSleep;
  Status fatal;
  while (true) {
    if (drivers_.load(std::memory_order_acquire) > 0) {
      // A waiting caller runs the passes (agent_drive.cc); one pass here after each sleep, so
      // that callers driving one after another cannot keep the loop from shutting down.
      sleep_while_driven();
      last_activity = Clock::now();
      sleep = kMinSleep;
    }
    bool did_work = false;
    bool transferring = false;
    Clock::time_point next_deadline;
    {
      const tutti::detail::MutexLock pass(pass_mutex_);
      in_pass_ = true;
      did_work = exchange(&fatal);
      if (fatal.ok()) fatal = driven_fatal_;
      next_deadline = expire_calls();
      in_pass_ = false;
      if (!fatal.ok() || shutdown_step()) {
        loop_ended_ = true;
        break;
      }
      // Also MPI's progress on our sends and receives: while one is in flight (a big message's
      // rendezvous needs both sides' MPI calls) the thread keeps polling instead of sleeping.
      transferring = !plane_.sends_done() || plane_.receiving();
    }
    const Clock::time_point now = Clock::now();
    if (did_work) {
      last_activity = now;
      sleep = kMinSleep;
      continue;
    }
    if (transferring || now - last_activity < kSpinWindow) {
      std::this_thread::yield();
      continue;
    }
    const tutti::detail::MutexLock lock(queue_mutex_);
    const Clock::time_point until = std::min(now + sleep, next_deadline);
    while (outgoing_.empty() && !wake_ && queue_cv_.wait_until(queue_mutex_, until)) {
    }
    wake_ = false;
    sleep = std::min<Clock::duration>(sleep * 2, kMaxSleep);
  }
  teardown(fatal.ok()
               ? Status(ErrorCode::ShutDown, str_cat("RPC has shut down on worker '", name(), "'"))
               : fatal);
}

bool Agent::exchange(Status* fatal) {
  bool did_work = flush_outgoing(fatal);
  while (fatal->ok() && !loopback_.empty()) {
    std::string bytes = std::move(loopback_.front());
    loopback_.pop_front();
    process(rank(), std::move(bytes));
    did_work = true;
  }
  if (fatal->ok()) did_work |= poll_incoming(fatal);
  return did_work;
}

bool Agent::flush_outgoing(Status* fatal) {
  std::deque<Outgoing> out;
  {
    const tutti::detail::MutexLock lock(queue_mutex_);
    out.swap(outgoing_);
  }
  for (Outgoing& o : out) {
    if (o.counted) ++sent_;
    if (o.destination == rank()) {
      loopback_.push_back(std::move(o.bytes));
      continue;
    }
    for (std::string& piece : fragment(std::move(o.bytes), options_.max_piece_bytes)) {
      Status status = plane_.send(o.destination, std::move(piece));
      if (!status.ok()) {
        *fatal = Status(ErrorCode::Communication,
                        str_cat("RPC send to worker '", info(o.destination).name,
                                "' failed: ", status.message()));
        return true;
      }
    }
  }
  return !out.empty();
}

bool Agent::poll_incoming(Status* fatal) {
  bool did_work = false;
  for (int i = 0; i < kMaxPollsPerRound; ++i) {
    Result<std::optional<ops::Message>> message = plane_.poll();
    if (!message.ok()) {
      *fatal = Status(ErrorCode::Communication,
                      str_cat("RPC receive failed: ", message.status().message()));
      return true;
    }
    if (!message.value()) break;
    did_work = true;
    ops::Message& m = *message.value();
    Result<std::optional<std::string>> frame = reassembler_.add(m.source, std::move(m.bytes));
    if (!frame.ok()) {
      TUTTI_LOG_ERROR("RPC: dropped a message from rank ", m.source, ": ",
                      frame.status().message());
    } else if (frame.value()) {
      process(m.source, std::move(*frame.value()));
    }
  }
  return did_work;
}

void Agent::process(int source, std::string bytes) {
  Result<Frame> frame = decode(bytes);
  // The frame holds copies of everything (its tensors' storage comes from the host memory cache).
  ::tutti::detail::give_back_byte_buffer(std::move(bytes));
  if (!frame.ok()) {
    TUTTI_LOG_ERROR("RPC: dropped a frame from rank ", source, ": ", frame.status().message());
    return;
  }
  if (frame.value().epoch != options_.epoch) {
    TUTTI_LOG_DEBUG("RPC: dropped a frame of an earlier init_rpc() from rank ", source);
    return;
  }
  switch (frame.value().kind) {
    case FrameKind::Request:
      ++received_;
      handle_request(source, std::move(frame).value());
      break;
    case FrameKind::Response:
      ++received_;
      handle_response(source, std::move(frame).value());
      break;
    case FrameKind::Control: handle_control(source, frame.value()); break;
  }
}

void Agent::handle_request(int source, Frame frame) {
  auto request = std::make_shared<Incoming>();
  request->source = source;
  request->id = frame.id;
  request->function = std::move(frame.function);
  request->meta = std::move(frame.meta);
  request->context_id = frame.context_id;
  std::shared_ptr<DistContext> context;
  if (frame.context_id >= 0) {
    context = contexts_.get_or_create(frame.context_id);
    if (context != nullptr) {
      context->add_worker(source);
    } else {
      // Sent before its sender heard that the context ended: it runs outside any context (the
      // context's gradients can no longer be asked for), and its own calls carry none.
      TUTTI_LOG_DEBUG("RPC: request ", frame.id, " from rank ", source, " in context ",
                      frame.context_id, ", which has ended here, runs outside it");
      request->context_id = -1;
    }
  }
  request->args = from_wire(std::move(frame.payload), source, context, frame.autograd_message_id);
  in_progress_.fetch_add(1);
  dispatch(std::move(request));
}

void Agent::handle_response(int source, Frame frame) {
  // Decoded even when nobody waits any more (timed out), so its RRefs are accepted and released.
  Message message = from_wire(std::move(frame.payload), source,
                              frame.context_id >= 0 ? contexts_.find(frame.context_id) : nullptr,
                              frame.autograd_message_id);
  std::shared_ptr<FutureState> future;
  {
    const tutti::detail::MutexLock lock(pending_mutex_);
    auto it = pending_.find(frame.id);
    if (it == pending_.end() || it->second.destination != source) return;
    future = std::move(it->second.future);
    deadlines_.erase({it->second.deadline, frame.id});
    pending_.erase(it);
  }
  if (frame.status.ok()) {
    future->complete(std::move(message));
  } else {
    future->complete(frame.status);
  }
}

Clock::time_point Agent::expire_calls() {
  std::vector<Pending> expired;
  Clock::time_point next = Clock::time_point::max();
  {
    const tutti::detail::MutexLock lock(pending_mutex_);
    const Clock::time_point now = Clock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      auto it = pending_.find(deadlines_.begin()->second);
      deadlines_.erase(deadlines_.begin());
      expired.push_back(std::move(it->second));
      pending_.erase(it);
    }
    if (!deadlines_.empty()) next = deadlines_.begin()->first;
  }
  // Usually a waiter has failed them already (FutureState::set_deadline); these are the calls
  // nobody waits for, whose callbacks must still run.
  for (Pending& p : expired) p.future->complete(timed_out(p.function, p.destination, p.timeout));
  return next;
}

void Agent::peer_left(int peer, const Status& why) {
  std::vector<Pending> failed;
  {
    const tutti::detail::MutexLock lock(pending_mutex_);
    gone_[static_cast<std::size_t>(peer)] = 1;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.destination != peer) {
        ++it;
        continue;
      }
      deadlines_.erase({it->second.deadline, it->first});
      failed.push_back(std::move(it->second));
      it = pending_.erase(it);
    }
  }
  for (Pending& p : failed) {
    p.future->complete(Status(why.code(), str_cat("RPC '", p.function, "' to worker '",
                                                  info(peer).name, "' failed: ", why.message())));
  }
}

std::shared_ptr<Agent> Agent::start(ops::ControlPlane& plane, AgentOptions options,
                                    std::map<std::string, Function> functions,
                                    std::shared_ptr<const void> keep_alive) {
  std::shared_ptr<Agent> agent(
      new Agent(plane, std::move(options), std::move(functions), std::move(keep_alive)));
  register_rref_handlers(*agent);
  dist_autograd::detail::register_dist_autograd_handlers(*agent);
  register_optimizer_handlers(*agent);
  agent->pool_ = std::make_unique<ThreadPool>(agent->options_.options.num_worker_threads);
  agent->thread_ = std::thread([raw = agent.get()] { raw->run(); });
  return agent;
}

}  // namespace tutti::rpc::detail

// SPDX-License-Identifier: Apache-2.0
// The free functions of tutti/rpc.h over the process's RPC state: registered functions, the
// running agent, and init_rpc()'s collective name exchange.
#include <cmath>
#include <map>
#include <utility>

#include "src/base/strings.h"
#include "src/common/mutex.h"
#include "src/common/thread_annotations.h"
#include "src/core/own_ops.h"
#include "src/core/runtime.h"
#include "src/rpc/agent.h"
#include "src/rpc/rpc_runtime.h"
#include "src/rpc/serialize.h"
#include "tutti/collectives.h"
#include "tutti/rpc.h"

namespace tutti::rpc {
namespace detail {
namespace {

using ::tutti::detail::str_cat;

// The process's RPC state: like core::Runtime, one object that is never destroyed (the exit
// hook may reach it during static teardown).
struct RpcRuntime {
  ::tutti::detail::Mutex mutex;
  std::map<std::string, Function> functions TUTTI_GUARDED_BY(mutex);
  std::shared_ptr<Agent> agent TUTTI_GUARDED_BY(mutex);
  bool was_shut_down TUTTI_GUARDED_BY(mutex) = false;
  std::uint32_t epochs TUTTI_GUARDED_BY(mutex) = 0;
  std::size_t max_piece_bytes TUTTI_GUARDED_BY(mutex) = kDefaultMaxPieceBytes;
};

RpcRuntime& runtime() {
  static RpcRuntime* r = new RpcRuntime();
  return *r;
}

// Runs first in tutti::shutdown() (core::Runtime::set_before_shutdown).
void shutdown_before_tutti() {
  try {
    rpc::shutdown(true);
  } catch (const std::exception&) {  // Nothing may escape tutti::shutdown().
  }
}

// RpcOptions::num_worker_threads' most (include/tutti/rpc.h).
constexpr int kMaxWorkerThreads = 4096;

// What is wrong with this rank's init_rpc() call, or "".
std::string local_problem(const std::string& name, const RpcOptions& options,
                          const core::Session& session) {
  if (name.empty()) return "the worker name is empty";
  if (!(options.timeout_seconds > 0) || !std::isfinite(options.timeout_seconds)) {
    return str_cat("RpcOptions::timeout_seconds must be a positive, finite number of seconds, got ",
                   options.timeout_seconds);
  }
  // Each is a thread init_rpc() starts at once, so a count past what a process can start
  // (INT_MAX) must be refused here, before any is started.
  if (options.num_worker_threads < 1 || options.num_worker_threads > kMaxWorkerThreads) {
    return str_cat("RpcOptions::num_worker_threads must be from 1 to ", kMaxWorkerThreads, ", got ",
                   options.num_worker_threads);
  }
  if (!session.topology().threads_multiple) {
    return "MPI was initialized without MPI_THREAD_MULTIPLE, which the RPC agent needs (its thread "
           "calls "
           "MPI beside Tutti's communication thread): initialize MPI with MPI_Init_thread(..., "
           "MPI_THREAD_MULTIPLE, ...), or let tutti::init() do it";
  }
  if (session.rpc_plane() == nullptr) return "this Tutti session has no RPC channel";
  RpcRuntime& r = runtime();
  const ::tutti::detail::MutexLock lock(r.mutex);
  if (r.agent != nullptr) return "RPC is already initialized (call rpc::shutdown() first)";
  return "";
}

}  // namespace

Result<std::shared_ptr<Agent>> current_agent() {
  if (Agent* agent = thread_agent()) return agent->shared_from_this();
  RpcRuntime& r = runtime();
  const ::tutti::detail::MutexLock lock(r.mutex);
  if (r.agent != nullptr) return r.agent;
  if (r.was_shut_down)
    return Status(ErrorCode::ShutDown, "RPC has shut down (init_rpc() starts it again)");
  return Status(ErrorCode::NotInitialized, "RPC is not initialized: call rpc::init_rpc() first");
}

Clock::duration call_timeout(const Agent& agent, double timeout_seconds) {
  if (timeout_seconds == 0) return agent.default_timeout();
  if (!(timeout_seconds > 0) || !std::isfinite(timeout_seconds)) {
    throw Error(ErrorCode::InvalidArgument,
                str_cat("an RPC timeout must be a positive, finite number of seconds (or 0 for "
                        "RpcOptions' timeout), got ",
                        timeout_seconds));
  }
  return to_duration(timeout_seconds);
}

std::map<std::string, Function> registered_functions() {
  RpcRuntime& r = runtime();
  const ::tutti::detail::MutexLock lock(r.mutex);
  return r.functions;
}

void set_max_piece_bytes_for_testing(std::size_t bytes) {
  RpcRuntime& r = runtime();
  const ::tutti::detail::MutexLock lock(r.mutex);
  r.max_piece_bytes = bytes;
}

std::size_t max_piece_bytes() {
  RpcRuntime& r = runtime();
  const ::tutti::detail::MutexLock lock(r.mutex);
  return r.max_piece_bytes;
}

int owned_rref_count_for_testing() {
  return current_agent().value_or_throw()->rrefs().owned_count();
}
std::size_t context_count_for_testing() {
  return current_agent().value_or_throw()->contexts().size();
}

}  // namespace detail

namespace {

using ::tutti::detail::str_cat;

// A call to a worker by name, checked before anything is sent: the caller's agent, the callee's
// rank and the call's timeout. What rpc_async(), rpc_sync() and remote() start from.
struct CheckedCall {
  std::shared_ptr<detail::Agent> agent;
  int rank = 0;
  detail::Clock::duration timeout{};
};

CheckedCall checked_call(const std::string& to, const std::string& function, const Message& args,
                         double timeout_seconds) {
  std::shared_ptr<detail::Agent> agent = detail::current_agent().value_or_throw();
  const int rank = agent->rank_of(to).value_or_throw();
  if (function.empty()) throw Error(ErrorCode::InvalidArgument, "an RPC needs a function name");
  if (function.starts_with("tutti.")) {
    throw Error(
        ErrorCode::InvalidArgument,
        str_cat("RPC function names starting with 'tutti.' are reserved ('", function, "')"));
  }
  detail::check_message(args, *agent).throw_if_error();
  const detail::Clock::duration timeout = detail::call_timeout(*agent, timeout_seconds);
  return {.agent = std::move(agent), .rank = rank, .timeout = timeout};
}

}  // namespace

void register_function(const std::string& name, Function function) {
  if (name.empty() || !function)
    throw Error(ErrorCode::InvalidArgument, "register_function() needs a name and a function");
  if (name.starts_with("tutti.")) {
    throw Error(ErrorCode::InvalidArgument,
                str_cat("RPC function names starting with 'tutti.' are reserved ('", name, "')"));
  }
  detail::RpcRuntime& r = detail::runtime();
  const ::tutti::detail::MutexLock lock(r.mutex);
  if (r.agent != nullptr) {
    throw Error(ErrorCode::InvalidArgument, str_cat("register_function('", name,
                                                    "') after init_rpc(): register every "
                                                    "function before init_rpc(), on every worker"));
  }
  r.functions[name] = std::move(function);
}

void init_rpc(const std::string& name, RpcOptions options) {
  std::shared_ptr<core::Session> session = core::Runtime::get().session().value_or_throw();
  const int rank = session->topology().rank;
  const std::string problem = detail::local_problem(name, options, *session);
  // Every rank learns every rank's name or problem, so all fail alike (nobody hangs).
  detail::ByteWriter mine;
  mine.put<std::uint8_t>(problem.empty() ? 1 : 0);
  mine.put_string(problem.empty() ? name : problem);
  const std::vector<std::string> all = core::allgather_own(mine.take(), "tutti.rpc.init");
  std::vector<std::string> names;
  std::string problems;
  for (std::size_t r = 0; r < all.size(); ++r) {
    detail::ByteReader reader(all[r]);
    std::uint8_t ok = 0;
    std::string text;
    if (!reader.get(&ok) || !reader.get_string(&text) || !reader.done())
      text = "corrupt init_rpc() message";
    if (ok != 1) problems += str_cat(problems.empty() ? "" : "; ", "rank ", r, ": ", text);
    names.push_back(std::move(text));
  }
  if (!problems.empty()) throw Error(ErrorCode::InvalidArgument, "init_rpc() failed: " + problems);
  std::map<std::string, std::size_t> first;
  for (std::size_t r = 0; r < names.size(); ++r) {
    auto [it, fresh] = first.emplace(names[r], r);
    if (!fresh) {
      throw Error(ErrorCode::InvalidArgument,
                  str_cat("init_rpc() failed: ranks ", it->second, " and ", r,
                          " both chose the worker name '", names[r], "'"));
    }
  }
  detail::RpcRuntime& r = detail::runtime();
  const ::tutti::detail::MutexLock lock(r.mutex);
  detail::AgentOptions agent_options{.rank = rank,
                                     .names = std::move(names),
                                     .options = options,
                                     .epoch = ++r.epochs,
                                     .max_piece_bytes = r.max_piece_bytes,
                                     .callers_drive = session->waiting_threads_may_drive(),
                                     .stall_shutdown = session->config().stall_check_disabled
                                                           ? detail::Clock::duration::zero()
                                                           : session->config().stall_shutdown_time};
  r.agent =
      detail::Agent::start(*session->rpc_plane(), std::move(agent_options), r.functions, session);
  r.was_shut_down = false;
  core::Runtime::get().set_before_shutdown(&detail::shutdown_before_tutti);
}

void shutdown(bool graceful) {
  if (detail::ThreadPool::on_pool_thread()) {
    throw Error(ErrorCode::InvalidArgument,
                "rpc::shutdown() from a function running on the RPC pool");
  }
  detail::RpcRuntime& r = detail::runtime();
  std::shared_ptr<detail::Agent> agent;
  {
    const ::tutti::detail::MutexLock lock(r.mutex);
    agent = r.agent;
  }
  if (agent == nullptr) return;
  agent->shutdown(graceful);
  const ::tutti::detail::MutexLock lock(r.mutex);
  if (r.agent == agent) {
    r.agent.reset();
    r.was_shut_down = true;
  }
}

WorkerInfo get_worker_info(const std::string& name) {
  std::shared_ptr<detail::Agent> agent = detail::current_agent().value_or_throw();
  if (name.empty()) return agent->info(agent->rank());
  return agent->info(agent->rank_of(name).value_or_throw());
}

std::vector<WorkerInfo> get_worker_infos() {
  std::shared_ptr<detail::Agent> agent = detail::current_agent().value_or_throw();
  std::vector<WorkerInfo> infos;
  for (int r = 0; r < agent->size(); ++r) infos.push_back(agent->info(r));
  return infos;
}

Future rpc_async(const std::string& to, const std::string& function, Message args,
                 double timeout_seconds) {
  const auto [agent, rank, timeout] = checked_call(to, function, args, timeout_seconds);
  return detail::FutureAccess::wrap(
      agent->call(rank, function, std::move(args), timeout, detail::current_context_id()));
}

Message rpc_sync(const std::string& to, const std::string& function, Message args,
                 double timeout_seconds) {
  const auto [agent, rank, timeout] = checked_call(to, function, args, timeout_seconds);
  // Waits in the call, running the RPC thread's pass meanwhile where that is allowed (Note [A
  // waiting caller runs the pass] in agent_drive.cc).
  return detail::FutureAccess::wrap(agent->call_sync(rank, function, std::move(args), timeout,
                                                     detail::current_context_id()))
      .wait();
}

RRef remote(const std::string& to, const std::string& function, Message args,
            double timeout_seconds) {
  const auto [agent, rank, timeout] = checked_call(to, function, args, timeout_seconds);
  const std::uint64_t rref_id = agent->rrefs().new_id();
  detail::ByteWriter meta;
  meta.put(rref_id);
  meta.put(rref_id);  // The creator's fork id: Note [RRef protocol], step 1.
  meta.put_string(function);
  std::shared_ptr<detail::FutureState> created;
  if (rank == agent->rank()) {
    RRef ref = agent->rrefs().make_remote_owned(rref_id);
    std::shared_ptr<detail::OwnerValue> value = detail::RRefAccess::impl(ref)->owned;
    created = agent->call(rank, "tutti.rref.create", std::move(args), timeout,
                          detail::current_context_id(), meta.take(), function);
    // A call that failed before the function ran (timeout, shutdown) fails the value; the first
    // outcome wins.
    created->then([value](const Result<Message>& result) {
      if (!result.ok()) value->value->complete(result.status());
    });
    return ref;
  }
  RRef ref = agent->rrefs().make_remote_user(rank, rref_id);
  std::shared_ptr<detail::UserState> user = detail::RRefAccess::impl(ref)->user;
  created = agent->call(rank, "tutti.rref.create", std::move(args), timeout,
                        detail::current_context_id(), meta.take(), function);
  user->creation = created;
  // Holds the user until the owner answered (Note [RRef protocol], step 3); the cycle with
  // `creation` ends when the call completes and drops its callbacks.
  created->then([user](const Result<Message>& result) {
    user->set_outcome(result.status());
    user->confirmed = result.ok();
  });
  return ref;
}

Future::Future() = default;

bool Future::done() const { return state_ != nullptr && state_->done(); }

Message Future::wait() {
  if (state_ == nullptr) throw Error(ErrorCode::InvalidArgument, "wait() on an empty rpc::Future");
  const Result<Message>& result = state_->wait();
  result.status().throw_if_error();
  return result.value();
}

}  // namespace tutti::rpc

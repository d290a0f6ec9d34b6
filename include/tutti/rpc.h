// SPDX-License-Identifier: Apache-2.0
// Remote procedure calls between the ranks of a job (torch.distributed.rpc): named functions,
// futures, remote references (RRefs) with distributed reference counting, and the RPC-based
// distributed optimizer. Distributed autograd is in tutti/distributed_autograd.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/nn/variable.h"
#include "tutti/optim/optimizer.h"

namespace tutti::rpc {

namespace detail {
struct RRefImpl;
struct RRefAccess;
class FutureState;
struct FutureAccess;
}  // namespace detail

// A worker of the RPC group: the name it gave init_rpc() and its id, which is its global rank.
struct WorkerInfo {
  std::string name;
  int id = -1;
  friend bool operator==(const WorkerInfo&, const WorkerInfo&) = default;
};

struct RpcOptions {
  // Default deadline of every call (rpc_sync, rpc_async, remote, RRef::to_here) whose own
  // timeout is 0; must be > 0. Also sets how long shutdown(true) waits without progress (see
  // shutdown()).
  double timeout_seconds = 60;
  // Threads that run the functions called on this worker, 1 to 4096 (each started by
  // init_rpc(); InvalidArgument outside that range). A function that waits on a
  // nested call does not count: the pool starts a helper thread meanwhile, so nested calls
  // never deadlock for want of threads.
  int num_worker_threads = 4;
};

struct Message;

// A reference to a Message (the "value") that lives on one worker, its owner
// (torch.distributed.rpc.RRef). remote() returns one at once, before the value exists.
//
// RRefs travel inside Messages. The value stays on its owner while any RRef to it exists on
// any worker, including RRefs passed on to third workers and RRefs still in flight, and is
// freed once the last one is gone (PyTorch's owner/user protocol: the owner counts the forks it
// has been told about; a user that passes its RRef on keeps its own reference until the
// receiver has registered with the owner). An RRef passed back to its owner becomes the owner's
// own reference again: is_owner() is true and local_value() works.
//
// Copies share one reference. Any thread. A default-constructed RRef is empty: every accessor
// throws InvalidArgument. After shutdown(), RRefs still held by the application are released
// (their owners may free the values): owner(), is_owner() and confirmed_by_owner() still
// answer, to_here() throws ShutDown; an owner's RRef keeps its value, so local_value() keeps
// working.
class TUTTI_API RRef {
 public:
  RRef();

  WorkerInfo owner() const;
  bool is_owner() const;
  // True on the owner; on a user, once the owner has registered this reference (remote(): once
  // the function has run there). Never blocks.
  bool confirmed_by_owner() const;
  // A copy of the value on this worker: on a user a fetch from the owner, which waits until the
  // value exists (remote() still running) for at most `timeout_seconds` (0: the RpcOptions
  // timeout), else Timeout. On the owner the value itself (Variables shared, not copied).
  // Throws what remote()'s function threw (with the owner's name), or Timeout when remote()'s
  // own timeout passed before the owner confirmed it. Inside a dist_autograd::Context the fetch
  // is recorded like an RPC: gradients flow back to the owner's tensors.
  Message to_here(double timeout_seconds = 0) const;
  // The value, on the owner only (InvalidArgument elsewhere); waits up to the RpcOptions
  // timeout until remote()'s function has run, and throws what it threw. The reference stays
  // valid while this RRef (or a copy) lives.
  const Message& local_value() const;

  // Tutti addition: false for a default-constructed RRef.
  bool defined() const { return impl_ != nullptr; }

 private:
  friend struct detail::RRefAccess;
  std::shared_ptr<detail::RRefImpl> impl_;
};

// What an RPC carries, both ways.
//   tensors: inside a dist_autograd::Context, those that require grad are recorded by
//            distributed autograd (a send/recv pair); the receiver gets them as results of a
//            "recv" operation through which backward() sends the gradients back. Outside a
//            context the receiver gets leaves with the sender's requires_grad. Values are
//            copied (also for calls to this worker itself).
//   rrefs:   RRefs passed on (see RRef).
//   bytes:   anything else, serialized by the application.
struct Message {
  std::vector<nn::Variable> tensors;
  std::vector<RRef> rrefs;
  std::string bytes;
};

// A function callable by name. It runs on the callee's pool (RpcOptions::num_worker_threads),
// may make RPCs itself (nested calls, also to its caller or to itself), and may throw: the
// caller then gets a tutti::Error with the thrown Error's code (Internal for other exceptions)
// and a message naming the callee worker, the function and the exception's text. Inside a
// distributed autograd context the function runs with that context current.
using Function = std::function<Message(const Message& args)>;

// The result of rpc_async(). Copies share the result. Any thread.
class TUTTI_API Future {
 public:
  Future();  // Empty: done() is false, wait() throws InvalidArgument.

  // Whether the call has finished (result, error or timeout). Never blocks.
  bool done() const;
  // Blocks until done and returns the result (a copy each time); throws the tutti::Error that
  // failed the call: the remote function's, Timeout past the call's timeout, ShutDown when
  // this worker or the callee shut down first. Never waits past the call's deadline.
  Message wait();

 private:
  friend struct detail::FutureAccess;
  std::shared_ptr<detail::FutureState> state_;
};

// Makes `function` callable as `name` on this worker. Every worker registers the same functions
// (SPMD): a call is resolved by name on the callee. Call before init_rpc(); registering a name
// again replaces the function (for later init_rpc() calls). Any thread.
// Throws InvalidArgument for an empty name or function, a name starting with "tutti." (reserved
// for Tutti's own calls), or while RPC is initialized.
TUTTI_API void register_function(const std::string& name, Function function);

// Joins this process to the RPC group as worker `name`: collective over every rank of the
// global process set, after tutti::init(). Starts the RPC agent: its own thread, on a
// communicator of its own, and the function pool (see Note [RPC threading] in src/rpc/agent.h).
// Throws, on every rank: InvalidArgument when names are not unique (naming both ranks), a name
// is empty, an option is out of range, RPC is already initialized, or MPI was initialized
// without MPI_THREAD_MULTIPLE (the agent calls MPI beside the communication thread); the
// message names the rank whose call was wrong. NotInitialized before tutti::init().
// init_rpc() after shutdown() works again (RRefs and futures of the earlier group stay dead).
TUTTI_API void init_rpc(const std::string& name, RpcOptions options = {});

// Stops the RPC agent. Application thread; a no-op when RPC is not initialized.
// graceful (collective: every worker calls it): returns once every worker has called it and
// the whole group is quiet: every RPC in flight anywhere has been answered, every function has
// returned, and every RRef has been released (those the application still holds are released
// now; see RRef), so owners have freed every value. Until then this worker keeps serving and
// calling, for as long as the group makes progress (a worker that calls it early, such as a
// parameter server, serves its peers until they are done, as in PyTorch). It gives up only
// after a whole window without progress (no request or response sent or received by this
// worker, no worker newly calling shutdown()), the window being the larger of RpcOptions'
// timeout plus 5 s and the stall-shutdown time (TUTTI_STALL_SHUTDOWN_TIME_SECONDS, unless 0 or
// the stall inspector is off): then a warning is logged and the agent stops as below. Each
// RpcOptions timeout of waiting it logs a warning naming the workers that have not called
// shutdown() yet.
// Not graceful (local): stops now; this worker's pending calls fail with ShutDown, and the
// other workers are told, so their calls to this worker fail with ShutDown instead of waiting.
// Requests queued for this worker's pool are dropped; a function already running on it is
// waited for (a thread cannot be stopped from outside; PyTorch's agent joins its pool too):
// its own RPCs fail fast from then on, so only its own computation delays the return.
// Once a worker has left that way the others cannot complete a graceful shutdown (it would wait
// out a window without progress, above): they leave with shutdown(false) too.
// tutti::shutdown() shuts RPC down gracefully first if the application has not.
TUTTI_API void shutdown(bool graceful = true);

// This worker (empty name) or the worker called `name`. Any thread, after init_rpc().
// Throws InvalidArgument for an unknown name, NotInitialized/ShutDown without RPC.
TUTTI_API WorkerInfo get_worker_info(const std::string& name = {});
// Every worker, by id.
TUTTI_API std::vector<WorkerInfo> get_worker_infos();

// Calls `function` on worker `to` with `args` and waits for the result. `timeout_seconds`
// bounds the whole call (0: RpcOptions' timeout; negative: InvalidArgument). Any thread,
// including functions running on the pool. Throws InvalidArgument from the call for an
// unknown worker, a function name that is empty or starts with "tutti.", or an empty Variable
// or RRef in `args`; every other failure as Future::wait() (an unknown function on the callee
// is InvalidArgument naming it). Inside a dist_autograd::Context the call is recorded (see
// Message).
TUTTI_API Message rpc_sync(const std::string& to, const std::string& function, Message args = {},
                           double timeout_seconds = 0);
// As rpc_sync(), but returns at once.
TUTTI_API Future rpc_async(const std::string& to, const std::string& function, Message args = {},
                           double timeout_seconds = 0);
// Runs `function` on `to` and keeps its result there, as the value of the returned RRef, whose
// owner is `to`; returns at once. Errors of the call (including `timeout_seconds` passing before
// the owner has run the function) are thrown by the RRef's to_here()/local_value().
TUTTI_API RRef remote(const std::string& to, const std::string& function, Message args = {},
                      double timeout_seconds = 0);

// The RPC-based distributed optimizer (torch.distributed.optim.DistributedOptimizer).
//
// Builds a local optimizer from `parameters` (the tensors of a value) and `options`.
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(
    std::vector<nn::Variable> parameters, const std::map<std::string, double>& options)>;
// Makes `factory` available as `name` to DistributedOptimizer. Built in: "sgd", "adam", "adamw",
// reading the StateDict scalar names ("lr", "momentum", "dampening", "weight_decay",
// "nesterov", 0 or 1; "lr", "beta1", "beta2", "eps", "weight_decay"); an unknown option name is
// InvalidArgument. Like functions, every worker registers the same optimizers (the owners build
// them); registering a name again replaces it. Any thread. InvalidArgument for an empty name or
// factory.
TUTTI_API void register_optimizer(const std::string& name, OptimizerFactory factory);

class TUTTI_API DistributedOptimizer {
 public:
  // Creates, on every owner of `parameters`, one local optimizer `optimizer` with `options`
  // over the tensors of that owner's values (each RRef's value: tensors = parameters), and
  // waits until all exist. Application thread (any thread), after init_rpc().
  // Throws InvalidArgument for an unknown optimizer name (here or on an owner), bad options,
  // an empty RRef, no RRefs at all (as torch.optim refuses an empty parameter list: its options
  // would go unchecked and its steps do nothing); errors of the owners as rpc_sync().
  DistributedOptimizer(const std::string& optimizer, std::map<std::string, double> options,
                       std::vector<RRef> parameters);
  // Drops the owners' optimizers (without waiting).
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Makes every owner step its optimizer, in parallel, with the gradients that context
  // `context_id` accumulated on that owner (dist_autograd::get_gradient()) written into the
  // parameters' grad(); returns when all have stepped. A parameter the context has no gradient
  // for (the backward pass did not reach it) is left out of the step, as PyTorch's optimizers
  // skip a parameter whose grad is None: its value, grad() and optimizer state stay as they
  // are (optim::Optimizer::step_only(); a registered rule that does not override it steps
  // such parameters with zero gradients). All steps on one owner are serialized (one lock per
  // worker, as PyTorch's _LocalOptimizer), since the optimizers of several trainers may share
  // parameters; forward passes that read those parameters meanwhile are the application's to
  // coordinate.
  // Throws InvalidArgument, stepping nothing, if this worker knows no context `context_id`
  // (it ended, or was never created: step inside the Context); what an owner's step threw
  // (as rpc_sync()).
  void step(std::int64_t context_id);

 private:
  struct Remote {
    int owner = -1;
    std::uint64_t id = 0;
  };
  std::vector<Remote> remotes_;
};

}  // namespace tutti::rpc

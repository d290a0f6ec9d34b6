// SPDX-License-Identifier: Apache-2.0
// rpc::RRef's methods (the protocol is in rref_context.h).
#include <utility>

#include "src/base/strings.h"
#include "src/dist_autograd/dist_context.h"
#include "src/rpc/agent.h"
#include "src/rpc/rpc_runtime.h"
#include "tutti/rpc.h"

namespace tutti::rpc {
namespace {

using ::tutti::detail::str_cat;

const detail::RRefImpl& checked(const std::shared_ptr<detail::RRefImpl>& impl) {
  if (impl == nullptr)
    throw Error(ErrorCode::InvalidArgument, "empty rpc::RRef: assign one before use");
  return *impl;
}

std::shared_ptr<detail::Agent> live_agent(const detail::RRefImpl& impl) {
  std::shared_ptr<detail::Agent> agent = impl.agent.lock();
  if (agent == nullptr || agent->stopped()) {
    throw Error(ErrorCode::ShutDown, "the RPC group of this RRef has shut down");
  }
  return agent;
}

// The owner's value once it exists, waiting until `deadline`.
const Message& owned_value(const detail::RRefImpl& impl, detail::Clock::time_point deadline,
                           double seconds) {
  if (!impl.owned->value->wait_until(deadline)) {
    throw Error(ErrorCode::Timeout, str_cat("RRef: the value on its owner '", impl.owner.name,
                                            "' did not exist within ", seconds, " s"));
  }
  const Result<Message>& result = impl.owned->value->result();
  result.status().throw_if_error();
  return result.value();
}

}  // namespace

RRef::RRef() = default;

WorkerInfo RRef::owner() const { return checked(impl_).owner; }

bool RRef::is_owner() const { return checked(impl_).owned != nullptr; }

bool RRef::confirmed_by_owner() const {
  const detail::RRefImpl& impl = checked(impl_);
  return impl.owned != nullptr || impl.user->confirmed.load();
}

Message RRef::to_here(double timeout_seconds) const {
  const detail::RRefImpl& impl = checked(impl_);
  std::shared_ptr<detail::Agent> agent = live_agent(impl);
  const detail::Clock::duration timeout = detail::call_timeout(*agent, timeout_seconds);
  const double seconds = std::chrono::duration<double>(timeout).count();
  // One deadline for the whole call: the wait for remote() and the fetch share `timeout`, so
  // to_here(t) returns or throws within t (the fetch once got all of t again, nearly 2t).
  const detail::Clock::time_point deadline = detail::Clock::now() + timeout;
  if (impl.owned != nullptr) return owned_value(impl, deadline, seconds);
  if (impl.user->released.load())
    throw Error(ErrorCode::ShutDown, "this RRef was released at rpc::shutdown()");
  const auto too_late = [&](const char* what) {
    return Error(ErrorCode::Timeout, str_cat("RRef::to_here(): the value on '", impl.owner.name,
                                             "' ", what, " within ", seconds, " s"));
  };
  if (const std::shared_ptr<detail::FutureState>& creation = impl.user->creation) {
    // Made by remote(): its outcome first (the owner answers once the value exists).
    if (!creation->wait_until(deadline)) throw too_late("did not exist");
    creation->result().status().throw_if_error();
  }
  impl.user->outcome().throw_if_error();  // remote() failed.
  const detail::Clock::duration left = deadline - detail::Clock::now();
  if (left <= detail::Clock::duration::zero()) throw too_late("could not be fetched");
  std::shared_ptr<detail::FutureState> fetched =
      agent->call(impl.owner.id, "tutti.rref.fetch", {}, left, detail::current_context_id(),
                  detail::rref_meta(impl.rref_id));
  const Result<Message>& result = fetched->wait();
  // The fetch's own Timeout (its deadline is `deadline` or a moment later, so that has passed)
  // names the internal call and what was left of the timeout: the user asked for to_here(t). A
  // Timeout before the deadline is the value's own error (remote()'s function threw it).
  if (result.status().code() == ErrorCode::Timeout && detail::Clock::now() >= deadline)
    throw too_late("could not be fetched");
  result.status().throw_if_error();
  return result.value();
}

const Message& RRef::local_value() const {
  const detail::RRefImpl& impl = checked(impl_);
  if (impl.owned == nullptr) {
    std::shared_ptr<detail::Agent> agent = impl.agent.lock();
    throw Error(ErrorCode::InvalidArgument,
                str_cat("RRef::local_value() on worker '", agent ? agent->name() : std::string("?"),
                        "', which is not the RRef's owner ('", impl.owner.name, "')"));
  }
  std::shared_ptr<detail::Agent> agent = impl.agent.lock();
  const detail::Clock::duration timeout =
      agent ? agent->default_timeout() : detail::Clock::duration(std::chrono::seconds(60));
  return owned_value(impl, detail::Clock::now() + timeout,
                     std::chrono::duration<double>(timeout).count());
}

}  // namespace tutti::rpc

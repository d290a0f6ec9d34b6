// SPDX-License-Identifier: Apache-2.0
// Note [RRef protocol] in rref_context.h; the owner's handlers at the end.
#include "src/rpc/rref_context.h"

#include <utility>

#include "src/base/strings.h"
#include "src/rpc/agent.h"

namespace tutti::rpc::detail {
namespace {

using ::tutti::detail::str_cat;

// Reads the ids written by rref_meta(); false if the bytes are not exactly that.
bool read_ids(const std::string& meta, std::uint64_t* a, std::uint64_t* b) {
  ByteReader r(meta);
  r.get(a);
  r.get(b);
  return r.done();
}

Status corrupt(const Incoming& request) {
  return Status(ErrorCode::Internal,
                str_cat("corrupt ", request.function, " request from rank ", request.source));
}

}  // namespace

OwnerValue::OwnerValue(std::uint64_t id, std::shared_ptr<std::atomic<int>> live)
    : rref_id(id), live_(std::move(live)) {
  live_->fetch_add(1);
}

OwnerValue::~OwnerValue() { live_->fetch_sub(1); }

UserState::UserState(std::weak_ptr<Agent> a, int owner_rank, std::uint64_t rref, std::uint64_t fork)
    : agent(std::move(a)), owner(owner_rank), rref_id(rref), fork_id(fork) {}

UserState::~UserState() {
  if (released.load()) return;
  std::shared_ptr<Agent> a = agent.lock();
  if (a == nullptr || a->stopped()) return;  // The owner forgets everything at shutdown too.
  static_cast<void>(a->call(owner, "tutti.rref.delete", {}, a->default_timeout(), -1,
                            rref_meta(rref_id, fork_id)));
}

void UserState::set_outcome(const Status& status) {
  const tutti::detail::MutexLock lock(mutex_);
  outcome_ = status;
}

Status UserState::outcome() const {
  const tutti::detail::MutexLock lock(mutex_);
  return outcome_;
}

std::string rref_meta(std::uint64_t a, std::uint64_t b) {
  ByteWriter w;
  w.put(a);
  w.put(b);
  return w.take();
}

RRefContext::RRefContext(Agent& agent) : agent_(agent) {}

std::uint64_t RRefContext::new_id() {
  return static_cast<std::uint64_t>(make_global_id(agent_.rank()));
}

std::shared_ptr<UserState> RRefContext::make_user(int owner, std::uint64_t rref_id,
                                                  std::uint64_t fork_id) {
  auto user = std::make_shared<UserState>(agent_.weak_from_this(), owner, rref_id, fork_id);
  const tutti::detail::MutexLock lock(mutex_);
  if (users_.size() >= 64 && users_.size() == users_.capacity()) {  // Prune before growing.
    std::erase_if(users_, [](const std::weak_ptr<UserState>& u) { return u.expired(); });
  }
  users_.push_back(user);
  return user;
}

RRef RRefContext::wrap_owned(std::shared_ptr<OwnerValue> value) {
  auto impl = std::make_shared<RRefImpl>();
  impl->owner = agent_.info(agent_.rank());
  impl->rref_id = value->rref_id;
  impl->agent = agent_.weak_from_this();
  impl->owned = std::move(value);
  return RRefAccess::wrap(std::move(impl));
}

RRef RRefContext::wrap_user(std::shared_ptr<UserState> user) {
  auto impl = std::make_shared<RRefImpl>();
  impl->owner = agent_.info(user->owner);
  impl->rref_id = user->rref_id;
  impl->agent = agent_.weak_from_this();
  impl->user = std::move(user);
  return RRefAccess::wrap(std::move(impl));
}

RRef RRefContext::make_remote_owned(std::uint64_t rref_id) {
  return wrap_owned(add_fork(rref_id, rref_id));
}

RRef RRefContext::make_remote_user(int owner, std::uint64_t rref_id) {
  return wrap_user(make_user(owner, rref_id, rref_id));
}

std::shared_ptr<OwnerValue> RRefContext::add_fork(std::uint64_t rref_id, std::uint64_t fork_id) {
  const tutti::detail::MutexLock lock(mutex_);
  OwnerEntry& entry = owners_[rref_id];
  if (entry.value == nullptr) entry.value = std::make_shared<OwnerValue>(rref_id, live_);
  entry.forks.insert(fork_id);
  return entry.value;
}

void RRefContext::remove_fork(std::uint64_t rref_id, std::uint64_t fork_id) {
  std::shared_ptr<OwnerValue> dropped;  // Freed outside the lock.
  const tutti::detail::MutexLock lock(mutex_);
  auto it = owners_.find(rref_id);
  if (it == owners_.end()) return;
  it->second.forks.erase(fork_id);
  if (!it->second.forks.empty()) return;
  dropped = std::move(it->second.value);
  owners_.erase(it);
}

std::shared_ptr<OwnerValue> RRefContext::find_or_create(std::uint64_t rref_id) {
  const tutti::detail::MutexLock lock(mutex_);
  OwnerEntry& entry = owners_[rref_id];
  if (entry.value == nullptr) entry.value = std::make_shared<OwnerValue>(rref_id, live_);
  return entry.value;
}

WireRRef RRefContext::fork(const RRefImpl& ref, int destination) {
  static_cast<void>(destination);  // Every fork is alike; the receiver tells the cases apart.
  const std::uint64_t fork_id = new_id();
  {
    const tutti::detail::MutexLock lock(mutex_);
    if (ref.owned != nullptr) {
      OwnerEntry& entry = owners_[ref.rref_id];
      if (entry.value == nullptr) entry.value = ref.owned;  // Its forks were all gone: back again.
      entry.forks.insert(fork_id);
    } else {
      pending_children_[fork_id] = ref.user;
    }
  }
  return WireRRef{
      .owner = ref.owner.id, .rref_id = ref.rref_id, .fork_id = fork_id, .parent = agent_.rank()};
}

RRef RRefContext::accept(const WireRRef& wire, int source) {
  const std::shared_ptr<Agent> agent = agent_.shared_from_this();
  if (wire.owner == agent_.rank()) {
    std::shared_ptr<OwnerValue> value;
    {
      const tutti::detail::MutexLock lock(mutex_);
      auto it = owners_.find(wire.rref_id);
      if (it != owners_.end()) value = it->second.value;
    }
    if (value ==
        nullptr) {  // Cannot happen while the protocol holds; fail the handle, not the job.
      value = std::make_shared<OwnerValue>(wire.rref_id, live_);
      value->value->complete(
          Status(ErrorCode::Internal, str_cat("RRef ", wire.rref_id, " from rank ", source,
                                              " is unknown on its owner '", agent_.name(), "'")));
    }
    if (wire.parent == agent_.rank()) {
      remove_fork(wire.rref_id, wire.fork_id);  // The phantom fork of a message to itself.
    } else {
      static_cast<void>(agent->call(wire.parent, "tutti.rref.accept", {}, agent->default_timeout(),
                                    -1, rref_meta(wire.fork_id)));
    }
    return wrap_owned(std::move(value));
  }
  std::shared_ptr<UserState> user = make_user(wire.owner, wire.rref_id, wire.fork_id);
  if (wire.parent == wire.owner) {
    user->confirmed = true;  // The owner registered the fork when it sent it.
  } else {
    send_fork_request(user, wire.parent);
  }
  return wrap_user(std::move(user));
}

void RRefContext::send_fork_request(const std::shared_ptr<UserState>& user, int parent) {
  std::shared_ptr<FutureState> registered =
      agent_.call(user->owner, "tutti.rref.fork", {}, agent_.default_timeout(), -1,
                  rref_meta(user->rref_id, user->fork_id));
  // Holds `user` until the owner answered: an unconfirmed user cannot send its delete.
  registered->then([user, parent](const Result<Message>& result) {
    user->set_outcome(result.status());
    user->confirmed = result.ok();
    if (std::shared_ptr<Agent> agent = user->agent.lock()) {
      static_cast<void>(agent->call(parent, "tutti.rref.accept", {}, agent->default_timeout(), -1,
                                    rref_meta(user->fork_id)));
    }
  });
}

void RRefContext::child_accepted(std::uint64_t fork_id) {
  std::shared_ptr<UserState> parent;  // Released outside the lock: may send its delete.
  const tutti::detail::MutexLock lock(mutex_);
  auto it = pending_children_.find(fork_id);
  if (it == pending_children_.end()) return;
  parent = std::move(it->second);
  pending_children_.erase(it);
}

int RRefContext::release_users() {
  std::vector<std::shared_ptr<UserState>> releasable;
  {
    const tutti::detail::MutexLock lock(mutex_);
    for (const std::weak_ptr<UserState>& weak : users_) {
      std::shared_ptr<UserState> user = weak.lock();
      if (user == nullptr || user->released.load()) continue;
      if (!user->confirmed.load() && user->outcome().ok()) continue;  // Its confirmation is coming.
      bool has_children = false;
      for (const auto& [fork, parent] : pending_children_)
        has_children = has_children || parent == user;
      if (!has_children) releasable.push_back(std::move(user));
    }
    std::erase_if(users_, [](const std::weak_ptr<UserState>& u) { return u.expired(); });
  }
  std::shared_ptr<Agent> agent = agent_.shared_from_this();
  for (const std::shared_ptr<UserState>& user : releasable) {
    user->released = true;
    static_cast<void>(agent->call(user->owner, "tutti.rref.delete", {}, agent->default_timeout(),
                                  -1, rref_meta(user->rref_id, user->fork_id)));
  }
  return static_cast<int>(releasable.size());
}

void RRefContext::clear() {
  std::map<std::uint64_t, OwnerEntry> owners;
  std::map<std::uint64_t, std::shared_ptr<UserState>> children;
  {
    const tutti::detail::MutexLock lock(mutex_);
    owners.swap(owners_);
    children.swap(pending_children_);
    for (const std::weak_ptr<UserState>& weak : users_) {
      if (std::shared_ptr<UserState> user = weak.lock()) user->released = true;
    }
    users_.clear();
  }
}

// ---- The owner's handlers (all on the RPC thread, in arrival order) ----

void register_rref_handlers(Agent& agent) {
  // remote(): meta = rref id, fork id, function.
  agent.add_handler("tutti.rref.create", Place::RpcThread, [&agent](Incoming& request) {
    ByteReader meta(request.meta);
    std::uint64_t rref_id = 0, fork_id = 0;
    std::string function;
    meta.get(&rref_id);
    meta.get(&fork_id);
    meta.get_string(&function);
    if (!meta.done()) return FutureState::ready(corrupt(request));
    const bool to_self = request.source == agent.rank();
    // To itself the caller registered the (phantom) fork already: see Note [RRef protocol].
    std::shared_ptr<OwnerValue> value =
        to_self ? agent.rrefs().find_or_create(rref_id) : agent.rrefs().add_fork(rref_id, fork_id);
    auto call = std::make_shared<Incoming>();
    call->source = request.source;
    call->id = request.id;
    call->function = function;
    call->context_id = request.context_id;
    call->args = std::move(request.args);
    auto done = std::make_shared<FutureState>();
    agent.run_function(call, function)
        ->then([&agent, value, rref_id, fork_id, to_self, done](const Result<Message>& r) {
          // The creator's answer is queued before the answers to fetches waiting on the value, so a
          // user is confirmed by the time its to_here() returns.
          done->complete(r.ok() ? Result<Message>(Message{}) : Result<Message>(r.status()));
          value->value->complete(r);
          if (to_self) agent.rrefs().remove_fork(rref_id, fork_id);
        });
    return done;
  });
  agent.add_handler("tutti.rref.fork", Place::RpcThread, [&agent](Incoming& request) {
    std::uint64_t rref_id = 0, fork_id = 0;
    if (!read_ids(request.meta, &rref_id, &fork_id)) return FutureState::ready(corrupt(request));
    agent.rrefs().add_fork(rref_id, fork_id);
    return FutureState::ready(Message{});
  });
  agent.add_handler("tutti.rref.delete", Place::RpcThread, [&agent](Incoming& request) {
    std::uint64_t rref_id = 0, fork_id = 0;
    if (!read_ids(request.meta, &rref_id, &fork_id)) return FutureState::ready(corrupt(request));
    agent.rrefs().remove_fork(rref_id, fork_id);
    return FutureState::ready(Message{});
  });
  agent.add_handler("tutti.rref.accept", Place::RpcThread, [&agent](Incoming& request) {
    std::uint64_t fork_id = 0, unused = 0;
    if (!read_ids(request.meta, &fork_id, &unused)) return FutureState::ready(corrupt(request));
    agent.rrefs().child_accepted(fork_id);
    return FutureState::ready(Message{});
  });
  // to_here(): answered once the value exists.
  agent.add_handler("tutti.rref.fetch", Place::RpcThread, [&agent](Incoming& request) {
    std::uint64_t rref_id = 0, unused = 0;
    if (!read_ids(request.meta, &rref_id, &unused)) return FutureState::ready(corrupt(request));
    std::shared_ptr<OwnerValue> value = agent.rrefs().find_or_create(rref_id);
    auto done = std::make_shared<FutureState>();
    value->value->then([done](const Result<Message>& r) { done->complete(r); });
    return done;
  });
}

}  // namespace tutti::rpc::detail

// SPDX-License-Identifier: Apache-2.0
// RRefs: the owner's table of values and forks, the users' references, and the fork protocol
// that tells an owner when the last reference anywhere is gone.
//
// Note [RRef protocol]
// PyTorch's owner/user protocol. Each RRef value has an id and lives on its owner. Every
// worker-local reference other than the owner's is a user with a fork id of its own; the owner
// keeps, per value, the set of fork ids it knows about, and drops the value from its table when
// the set is empty (the owner's own handles keep the value alive locally).
//  1. remote(): the caller makes a user with fork id = value id and sends "create"; the owner
//     adds the fork when the request arrives, runs the function, stores the result and answers
//     (the user is then confirmed). To itself, the owner adds the fork before sending and removes
//     it once the function has run, so a handle dropped at once cannot free a value in the making.
//  2. Passing an RRef in a message to worker D makes a new fork id f:
//     - from the owner: f joins the owner's set at once (also for D = owner: the "phantom" fork
//       that keeps the value alive in flight, removed when D, the owner itself, receives it);
//     - from a user U: U keeps its own reference alive as a "pending child" f. If D is the owner,
//       D takes its own value and sends "accept(f)" to U. Otherwise D makes an unconfirmed user
//       with fork f and sends "fork(f)" to the owner; once the owner has added f, D is confirmed
//       and sends "accept(f)" to U. U drops the pending child on accept.
//  3. A user's last handle going away sends "delete(fork)" to the owner, which removes the fork.
//     An unconfirmed user cannot be deleted: the call that will confirm it holds it.
// Invariant: at every moment some fork the owner knows of, or a phantom, covers every reference
// and every message in flight, so the set is empty only when nothing refers to the value.
// Messages from one worker to another arrive in order, and the owner handles "create" (its
// fork part), "fork", "delete" and "fetch" on the RPC thread in arrival order; "fork" or
// "fetch" may arrive before the "create" of the same value from another worker, so both create
// the entry if it is missing.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/common/thread_annotations.h"
#include "src/rpc/future.h"
#include "src/rpc/wire.h"
#include "tutti/rpc.h"

namespace tutti::rpc::detail {

class Agent;

// A value on its owner. `value` completes when remote()'s function has run (or failed).
// Counts itself in the owner's live count while it exists. Any thread.
struct OwnerValue {
  OwnerValue(std::uint64_t rref_id, std::shared_ptr<std::atomic<int>> live);
  ~OwnerValue();
  OwnerValue(const OwnerValue&) = delete;
  OwnerValue& operator=(const OwnerValue&) = delete;

  const std::uint64_t rref_id;
  const std::shared_ptr<FutureState> value = std::make_shared<FutureState>();

 private:
  std::shared_ptr<std::atomic<int>> live_;
};

// One user's reference. Its destruction (the last handle gone) sends "delete" to the owner
// unless it was released at shutdown. Any thread.
struct UserState {
  UserState(std::weak_ptr<Agent> agent, int owner, std::uint64_t rref_id, std::uint64_t fork_id);
  ~UserState();
  UserState(const UserState&) = delete;
  UserState& operator=(const UserState&) = delete;

  // Not confirmed yet: OK. Confirmed: OK. Failed (remote() or the fork request failed): why.
  void set_outcome(const Status& status);
  Status outcome() const;

  const std::weak_ptr<Agent> agent;
  const int owner;
  const std::uint64_t rref_id;
  const std::uint64_t fork_id;
  std::atomic<bool> confirmed{false};
  std::atomic<bool> released{false};  // Released at shutdown: no delete, no fetch.
  // remote()'s call, for a user it made: to_here() waits for it (bounded by its own timeout),
  // so remote()'s failures, Timeout included, surface there deterministically. Set before the
  // handle is shared; null for users made by forks.
  std::shared_ptr<FutureState> creation;

 private:
  mutable tutti::detail::Mutex mutex_;
  Status outcome_ TUTTI_GUARDED_BY(mutex_);
};

// Behind the public RRef: exactly one of `owned` (on the owner) and `user` is set.
struct RRefImpl {
  WorkerInfo owner;
  std::uint64_t rref_id = 0;
  std::weak_ptr<Agent> agent;
  std::shared_ptr<OwnerValue> owned;
  std::shared_ptr<UserState> user;
};

struct RRefAccess {
  static const std::shared_ptr<RRefImpl>& impl(const RRef& r) { return r.impl_; }
  static RRef wrap(std::shared_ptr<RRefImpl> impl) {
    RRef r;
    r.impl_ = std::move(impl);
    return r;
  }
};

// One agent's side of the protocol. Any thread; `agent` owns it.
class RRefContext {
 public:
  explicit RRefContext(Agent& agent);

  // A new id, unique in the job (this rank in the high bits).
  std::uint64_t new_id();

  // remote(): the handle the caller gets, and for a call to itself the value (with its phantom
  // fork `rref_id` registered).
  RRef make_remote_user(int owner, std::uint64_t rref_id);
  RRef make_remote_owned(std::uint64_t rref_id);

  // Owner side. Adds `fork_id` to the value's set, creating the entry (and the value) if
  // missing, and returns the value.
  std::shared_ptr<OwnerValue> add_fork(std::uint64_t rref_id, std::uint64_t fork_id);
  // Removes `fork_id`; drops the entry once its set is empty. Unknown ids are ignored.
  void remove_fork(std::uint64_t rref_id, std::uint64_t fork_id);
  // The value, creating an entry without forks if it is missing (a fetch before "create").
  std::shared_ptr<OwnerValue> find_or_create(std::uint64_t rref_id);

  // Sending `ref` to `destination`: step 2 of Note [RRef protocol], sender's part.
  WireRRef fork(const RRefImpl& ref, int destination);
  // Receiving it from `source`: the receiver's part (sends "fork" / "accept").
  RRef accept(const WireRRef& wire, int source);
  // "accept(fork)" arrived: drop the pending child.
  void child_accepted(std::uint64_t fork_id);

  // Shutdown: releases every user reference that nothing else waits on (confirmed or failed,
  // no pending child), sending its delete now; returns how many were released.
  int release_users();
  // Values alive on this owner (held by the table or by local handles).
  int owned_count() const { return live_->load(); }
  // Teardown: forget everything without messages.
  void clear();

 private:
  struct OwnerEntry {
    std::shared_ptr<OwnerValue> value;
    std::set<std::uint64_t> forks;
  };
  std::shared_ptr<UserState> make_user(int owner, std::uint64_t rref_id, std::uint64_t fork_id);
  RRef wrap_owned(std::shared_ptr<OwnerValue> value);
  RRef wrap_user(std::shared_ptr<UserState> user);
  void send_fork_request(const std::shared_ptr<UserState>& user, int parent);

  Agent& agent_;
  std::atomic<std::uint64_t> next_{1};
  const std::shared_ptr<std::atomic<int>> live_ = std::make_shared<std::atomic<int>>(0);
  mutable tutti::detail::Mutex mutex_;
  std::map<std::uint64_t, OwnerEntry> owners_ TUTTI_GUARDED_BY(mutex_);
  std::map<std::uint64_t, std::shared_ptr<UserState>> pending_children_ TUTTI_GUARDED_BY(mutex_);
  std::vector<std::weak_ptr<UserState>> users_ TUTTI_GUARDED_BY(mutex_);
};

// Registers the owner-side handlers of the protocol ("tutti.rref.*") on `agent`.
void register_rref_handlers(Agent& agent);

// The ids inside an RRef request's meta.
std::string rref_meta(std::uint64_t a, std::uint64_t b = 0);

}  // namespace tutti::rpc::detail

// SPDX-License-Identifier: Apache-2.0
// Distributed autograd contexts as one worker holds them: the sends recorded under a context,
// the gradients accumulated in it, and the workers it reached.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/common/thread_annotations.h"
#include "src/nn/autograd_seam.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::dist_autograd::detail {

// A job-wide unique id: `rank` in bits 48..62, a process-wide counter below.
std::int64_t make_global_id(int rank);

// One context on one worker. Any thread.
class DistContext {
 public:
  explicit DistContext(std::int64_t id) : id_(id) {}
  std::int64_t id() const { return id_; }

  // A send: the tensors of an outgoing message, in message order (null: did not require grad).
  // The context keeps their graphs alive until it is released.
  void record_send(std::int64_t message_id,
                   std::vector<std::shared_ptr<nn::detail::VariableImpl>> inputs);
  // Input `slot` of send `message_id`, or Internal if there is none.
  Result<std::shared_ptr<nn::detail::VariableImpl>> send_input(std::int64_t message_id,
                                                               std::size_t slot) const;

  // Adds `gradient` (not kept: copied or summed into a tensor of the context's own).
  void accumulate(const std::shared_ptr<nn::detail::VariableImpl>& leaf, const Tensor& gradient);
  // A copy of the leaf's gradient, or an empty Tensor if it has none.
  Tensor gradient(const nn::detail::VariableImpl* leaf) const;
  std::vector<std::pair<nn::Variable, Tensor>> gradients() const;

  void add_worker(int rank);
  std::set<int> workers() const;

 private:
  const std::int64_t id_;
  mutable tutti::detail::Mutex mutex_;
  std::map<std::int64_t, std::vector<std::shared_ptr<nn::detail::VariableImpl>>> sends_
      TUTTI_GUARDED_BY(mutex_);
  std::map<const nn::detail::VariableImpl*,
           std::pair<std::shared_ptr<nn::detail::VariableImpl>, Tensor>>
      gradients_ TUTTI_GUARDED_BY(mutex_);
  std::set<int> workers_ TUTTI_GUARDED_BY(mutex_);
};

// The contexts of one worker, by id. Any thread.
class ContextContainer {
 public:
  explicit ContextContainer(int rank) : rank_(rank) {}
  // A new context created here (the caller's Context object).
  std::shared_ptr<DistContext> create();
  // The context of a request that arrived, made on its first request; null if it has ended here:
  // one this worker created and no longer holds, or one released here lately (kRememberedReleases).
  // A late request (sent before its sender heard of the release) must not make it again: nobody
  // would release it a second time, and it would live until rpc::shutdown().
  std::shared_ptr<DistContext> get_or_create(std::int64_t id);
  std::shared_ptr<DistContext> find(std::int64_t id) const;
  // Removes it and remembers it ended; returns it (null if unknown).
  std::shared_ptr<DistContext> release(std::int64_t id);
  void clear();
  std::size_t size() const;

  // How many ended contexts of other workers get_or_create() refuses: a late request trails its
  // release by one message's flight, so the newest few thousand are plenty (8 bytes each).
  static constexpr std::size_t kRememberedReleases = 4096;

 private:
  bool ended_here(std::int64_t id) const TUTTI_REQUIRES(mutex_);

  const int rank_;
  mutable tutti::detail::Mutex mutex_;
  std::map<std::int64_t, std::shared_ptr<DistContext>> contexts_ TUTTI_GUARDED_BY(mutex_);
  // Other workers' contexts released here, oldest first (at most kRememberedReleases).
  std::deque<std::int64_t> released_ TUTTI_GUARDED_BY(mutex_);
};

// The rank that created context `id` (make_global_id()'s bits 48..62).
int creator_of(std::int64_t id);

// The current context of the calling thread (-1: none): a Context's creator, or a pool thread
// serving a request that carried one.
std::int64_t current_context_id();
// RAII: makes `id` the calling thread's current context (thread-local; the calling thread only).
class ContextScope {
 public:
  explicit ContextScope(std::int64_t id);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  std::int64_t previous_;
};
// For Context, which outlives no scope: sets the thread's current id, returning the old one.
std::int64_t exchange_current_context_id(std::int64_t id);

}  // namespace tutti::dist_autograd::detail

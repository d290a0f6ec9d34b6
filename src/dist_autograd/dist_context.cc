// SPDX-License-Identifier: Apache-2.0
#include "src/dist_autograd/dist_context.h"

#include <algorithm>
#include <atomic>
#include <span>

#include "src/base/strings.h"

namespace tutti::dist_autograd::detail {
namespace {

thread_local std::int64_t t_context_id = -1;

}  // namespace

std::int64_t make_global_id(int rank) {
  // Process-wide, so ids stay unique across agents (init_rpc() again) and across the agents of
  // unit tests that run several ranks in one process (their ranks differ).
  static std::atomic<std::int64_t> counter{0};
  constexpr std::int64_t kLowBits = (std::int64_t{1} << 48) - 1;
  return (static_cast<std::int64_t>(rank) << 48) | ((counter.fetch_add(1) + 1) & kLowBits);
}

void DistContext::record_send(std::int64_t message_id,
                              std::vector<std::shared_ptr<nn::detail::VariableImpl>> inputs) {
  const tutti::detail::MutexLock lock(mutex_);
  sends_[message_id] = std::move(inputs);
}

Result<std::shared_ptr<nn::detail::VariableImpl>> DistContext::send_input(std::int64_t message_id,
                                                                          std::size_t slot) const {
  const tutti::detail::MutexLock lock(mutex_);
  auto it = sends_.find(message_id);
  if (it == sends_.end() || slot >= it->second.size() || it->second[slot] == nullptr) {
    return Status(
        ErrorCode::Internal,
        ::tutti::detail::str_cat("distributed autograd context ", id_, " has no send ", message_id,
                                 " with a tensor ", slot, " that requires grad"));
  }
  return it->second[slot];
}

void DistContext::accumulate(const std::shared_ptr<nn::detail::VariableImpl>& leaf,
                             const Tensor& gradient) {
  const tutti::detail::MutexLock lock(mutex_);
  auto it = gradients_.find(leaf.get());
  if (it == gradients_.end()) {
    gradients_.emplace(leaf.get(), std::make_pair(leaf, gradient.clone()));
    return;
  }
  std::span<float> total = it->second.second.span<float>();
  std::span<const float> add = gradient.span<float>();
  for (std::size_t i = 0; i < total.size(); ++i) total[i] += add[i];
}

Tensor DistContext::gradient(const nn::detail::VariableImpl* leaf) const {
  const tutti::detail::MutexLock lock(mutex_);
  auto it = gradients_.find(leaf);
  return it == gradients_.end() ? Tensor() : it->second.second.clone();
}

std::vector<std::pair<nn::Variable, Tensor>> DistContext::gradients() const {
  const tutti::detail::MutexLock lock(mutex_);
  std::vector<std::pair<nn::Variable, Tensor>> out;
  out.reserve(gradients_.size());
  for (const auto& [key, entry] : gradients_) {
    out.emplace_back(nn::detail::variable_of(entry.first), entry.second.clone());
  }
  return out;
}

void DistContext::add_worker(int rank) {
  const tutti::detail::MutexLock lock(mutex_);
  workers_.insert(rank);
}

std::set<int> DistContext::workers() const {
  const tutti::detail::MutexLock lock(mutex_);
  return workers_;
}

std::shared_ptr<DistContext> ContextContainer::create() {
  auto context = std::make_shared<DistContext>(make_global_id(rank_));
  const tutti::detail::MutexLock lock(mutex_);
  contexts_.emplace(context->id(), context);
  return context;
}

int creator_of(std::int64_t id) { return static_cast<int>(id >> 48); }

bool ContextContainer::ended_here(std::int64_t id) const {
  // Contexts this worker created are in contexts_ from create() until release(), so one missing
  // has ended; for others, the list of recent releases (linear: a miss is rare, 4096 compares).
  if (creator_of(id) == rank_) return true;
  return std::find(released_.begin(), released_.end(), id) != released_.end();
}

std::shared_ptr<DistContext> ContextContainer::get_or_create(std::int64_t id) {
  const tutti::detail::MutexLock lock(mutex_);
  auto it = contexts_.find(id);
  if (it != contexts_.end()) return it->second;
  if (ended_here(id)) return nullptr;
  return contexts_.emplace(id, std::make_shared<DistContext>(id)).first->second;
}

std::shared_ptr<DistContext> ContextContainer::find(std::int64_t id) const {
  const tutti::detail::MutexLock lock(mutex_);
  auto it = contexts_.find(id);
  return it == contexts_.end() ? nullptr : it->second;
}

std::shared_ptr<DistContext> ContextContainer::release(std::int64_t id) {
  const tutti::detail::MutexLock lock(mutex_);
  auto it = contexts_.find(id);
  if (it == contexts_.end()) return nullptr;
  std::shared_ptr<DistContext> context = std::move(it->second);
  contexts_.erase(it);
  if (creator_of(id) != rank_) {
    released_.push_back(id);
    if (released_.size() > kRememberedReleases) released_.pop_front();
  }
  return context;
}

void ContextContainer::clear() {
  std::map<std::int64_t, std::shared_ptr<DistContext>> dropped;
  {
    const tutti::detail::MutexLock lock(mutex_);
    dropped.swap(contexts_);
    released_.clear();
  }
}

std::size_t ContextContainer::size() const {
  const tutti::detail::MutexLock lock(mutex_);
  return contexts_.size();
}

std::int64_t current_context_id() { return t_context_id; }

ContextScope::ContextScope(std::int64_t id) : previous_(t_context_id) { t_context_id = id; }
ContextScope::~ContextScope() { t_context_id = previous_; }

std::int64_t exchange_current_context_id(std::int64_t id) {
  const std::int64_t previous = t_context_id;
  t_context_id = id;
  return previous;
}

}  // namespace tutti::dist_autograd::detail

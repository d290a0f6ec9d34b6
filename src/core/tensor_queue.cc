// SPDX-License-Identifier: Apache-2.0
#include "src/core/tensor_queue.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "src/common/strings.h"

namespace tutti::core {
namespace {

std::string lower(std::string_view text) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

Status TensorQueue::push(std::shared_ptr<Entry> entry) {
  bool notify = false;
  {
    detail::MutexLock lock(mutex_);
    if (!closed_.ok()) return closed_;
    Request& request = entry->request;
    auto& table = in_flight_[request.process_set_id];
    if (request.name.empty()) {
      // See Note [Automatic names].
      request.name = detail::str_cat(lower(to_string(request.op)), ".noname.",
                                     unnamed_counts_[request.process_set_id]++);
    }
    auto [it, inserted] = table.try_emplace(request.name, entry);
    if (!inserted) {
      return invalid_argument(detail::str_cat(
          "an op named '", request.name, "' is already in flight (",
          to_string(it->second->request.op), "); wait for it before reusing the name"));
    }
    new_.push_back(std::move(entry));
    notify = sleeping_;
  }
  if (notify) cv_.notify_one();
  return Status();
}

std::vector<std::shared_ptr<Entry>> TensorQueue::drain_new() {
  detail::MutexLock lock(mutex_);
  std::vector<std::shared_ptr<Entry>> drained;
  drained.swap(new_);
  return drained;
}

std::shared_ptr<Entry> TensorQueue::take(int process_set_id, const std::string& name) {
  detail::MutexLock lock(mutex_);
  auto set = in_flight_.find(process_set_id);
  if (set == in_flight_.end()) return nullptr;
  auto it = set->second.find(name);
  if (it == set->second.end()) return nullptr;
  std::shared_ptr<Entry> entry = std::move(it->second);
  set->second.erase(it);
  return entry;
}

void TensorQueue::skip_automatic_name(int process_set_id, const std::string& name) {
  constexpr std::string_view kMarker = ".noname.";
  const std::size_t at = name.rfind(kMarker);
  if (at == std::string::npos) return;
  const std::string_view digits = std::string_view(name).substr(at + kMarker.size());
  std::uint64_t n = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty()) return;
  detail::MutexLock lock(mutex_);
  std::uint64_t& count = unnamed_counts_[process_set_id];
  count = std::max(count, n + 1);
}

std::vector<std::shared_ptr<Entry>> TensorQueue::take_set(int process_set_id) {
  detail::MutexLock lock(mutex_);
  std::vector<std::shared_ptr<Entry>> taken;
  auto set = in_flight_.find(process_set_id);
  if (set == in_flight_.end()) return taken;
  for (auto& [name, entry] : set->second) taken.push_back(std::move(entry));
  in_flight_.erase(set);
  return taken;
}

std::vector<std::shared_ptr<Entry>> TensorQueue::with_cache_hit(std::int32_t id) const {
  detail::MutexLock lock(mutex_);
  std::vector<std::shared_ptr<Entry>> found;
  for (const auto& [set, table] : in_flight_) {
    for (const auto& [name, entry] : table) {
      if (entry->cache_hit == id) found.push_back(entry);
    }
  }
  return found;
}

bool TensorQueue::empty() const {
  detail::MutexLock lock(mutex_);
  for (const auto& [id, table] : in_flight_) {
    if (!table.empty()) return false;
  }
  return true;
}

std::vector<std::shared_ptr<Entry>> TensorQueue::close(const Status& status) {
  std::vector<std::shared_ptr<Entry>> pending;
  {
    detail::MutexLock lock(mutex_);
    if (closed_.ok()) closed_ = status;
    for (auto& [id, table] : in_flight_) {
      for (auto& [name, entry] : table) pending.push_back(std::move(entry));
      table.clear();
    }
    new_.clear();
  }
  cv_.notify_all();
  return pending;
}

void TensorQueue::wait_for_work(std::chrono::microseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  detail::MutexLock lock(mutex_);
  sleeping_ = true;
  while (new_.empty() && !woken_ && cv_.wait_until(mutex_, deadline)) {
  }
  sleeping_ = false;
  woken_ = false;
}

void TensorQueue::wake() {
  {
    detail::MutexLock lock(mutex_);
    woken_ = true;
  }
  cv_.notify_all();
}

}  // namespace tutti::core

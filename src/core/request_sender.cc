// SPDX-License-Identifier: Apache-2.0
#include "src/core/request_sender.h"

namespace tutti::core {
namespace {

// New ops arriving closer together than this are sent to the coordinator as one message.
constexpr std::chrono::microseconds kBatchGap{3};

}  // namespace

std::optional<RequestList> RequestSender::take_new() {
  // A rank's last message is its last (Note [Shutdown handshake]); ops still queued then are
  // failed when the session ends.
  if (last_sent_) return std::nullopt;
  queue_.drain_new(&entries_);
  if (entries_.empty()) return std::nullopt;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + cycle_time_;
  for (Clock::time_point gap_end = Clock::now() + kBatchGap; Clock::now() < deadline;) {
    const std::size_t before = entries_.size();
    queue_.drain_new(&entries_);
    if (entries_.size() > before) {
      gap_end = Clock::now() + kBatchGap;
    } else if (Clock::now() >= gap_end) {
      break;
    }
  }
  RequestList list;
  list.cache_hits.reserve(entries_.size());
  for (const std::shared_ptr<Entry>& entry : entries_) {
    if (std::optional<std::int32_t> id = cache_.lookup(entry->request)) {
      entry->cache_hit = *id;
      list.cache_hits.push_back(*id);
    } else {
      list.requests.push_back(entry->request);
    }
  }
  entries_.clear();  // Keeps its buffer, which drain_new() swaps with the queue's.
  return list;
}

std::optional<RequestList> RequestSender::take_resend(std::span<const std::int32_t> ids) {
  if (last_sent_ || ids.empty()) return std::nullopt;
  RequestList again;
  for (std::int32_t id : ids) {
    for (const auto& entry : queue_.with_cache_hit(id)) {
      entry->cache_hit = -1;
      again.requests.push_back(entry->request);
    }
  }
  return again;
}

RequestList RequestSender::take_last(const Status& why) {
  last_sent_ = true;
  RequestList last;
  last.shutdown = true;
  if (!why.ok()) {
    last.shutdown_code = why.code();
    last.shutdown_message = std::string(why.message());
  }
  return last;
}

}  // namespace tutti::core

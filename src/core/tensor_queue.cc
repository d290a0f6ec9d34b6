// SPDX-License-Identifier: Apache-2.0
#include "src/core/tensor_queue.h"

#include <algorithm>
#include <utility>

#include "src/base/coarse_clock.h"
#include "src/base/recycling_allocator.h"
#include "src/base/strings.h"
#include "src/core/automatic_name.h"

namespace tutti::core {
namespace {

// make_entry()'s one allocation. The empty constructor makes allocate_shared default-initialize
// it (every member has its initializer) instead of zeroing the whole block first.
struct EntryWithState {
  EntryWithState() {}  // NOLINT(modernize-use-equals-default): `= default` would zero it.
  Entry entry;
  detail::OpState state;
};

// A thread keeps up to this many freed blocks, if it once had as many ops out at once (Note
// [Blocks kept per thread] in src/base/recycling_allocator.h): a step's worth of P3's 10,000, and
// at most about 6 MB (a block is about 380 bytes).
using EntryBlocks = base::RecyclingAllocator<EntryWithState, 16384>;

}  // namespace

std::shared_ptr<Entry> make_entry() {
  // See Note [Blocks kept per thread] in src/base/recycling_allocator.h.
  auto both = std::allocate_shared<EntryWithState>(EntryBlocks());
  // Not owning: an owning pointer inside the entry would keep its own allocation alive forever.
  both->entry.state = std::shared_ptr<detail::OpState>(std::shared_ptr<void>(), &both->state);
  Entry* entry = &both->entry;
  return std::shared_ptr<Entry>(std::move(both), entry);  // Moved: no count up and down.
}

std::shared_ptr<detail::OpState> handle_state(const std::shared_ptr<Entry>& entry) {
  return std::shared_ptr<detail::OpState>(entry, entry->state.get());
}

TensorQueue::TensorQueue(FlightRecorder* recorder) : recorder_(recorder) {
  if (recorder_ == nullptr || !recorder_->enabled()) return;
  recorder_->set_flush([this] {
    detail::MutexLock lock(mutex_, spin_);
    record_new();
  });
}

TensorQueue::~TensorQueue() {
  if (recorder_ != nullptr && recorder_->enabled()) recorder_->set_flush({});
}

void TensorQueue::record_new() {
  if (recorder_ == nullptr || new_.empty()) return;
  // See Note [Records made as the queue is drained] in flight_recorder.h.
  recorder_->submitted_all(new_, [](Entry* entry) {
    return FlightRecorder::Accepted{.request = &entry->request,
                                    .sequence = entry->sequence,
                                    .at = entry->submitted,
                                    .record = entry->record < 0 ? &entry->record : nullptr};
  });
}

Status TensorQueue::push(std::shared_ptr<Entry> entry) {
  bool notify = false;
  Request& request = entry->request;
  // The recorder's submission time, read outside the lock (the record is made as the entry is
  // drained).
  if (recorder_ != nullptr && recorder_->enabled() &&
      entry->submitted == std::chrono::steady_clock::time_point{}) {
    entry->submitted = base::coarse_now();
  }
  // Hashed outside the lock, except an automatic name, which is chosen under it.
  if (!request.name.empty())
    entry->name_hash = name_hash(OpKeyView{request.process_set_id, request.name});
  {
    detail::MutexLock lock(mutex_, spin_);
    if (!closed_.ok()) return closed_;
    if (request.name.empty()) {
      // See Note [Automatic names] in automatic_name.h.
      request.name = automatic_name(request.op, unnamed_counts_[request.process_set_id]++);
      entry->name_hash = name_hash(OpKeyView{request.process_set_id, request.name});
    }
    // Moved in, and kept by pointer in new_ (Note [Ops not yet drained]).
    Entry& accepted = *entry;
    const auto [stored, inserted] = in_flight_.insert(accepted.name_hash, std::move(entry));
    if (!inserted) {
      return invalid_argument(detail::str_cat(
          "an op named '", request.name, "' is already in flight (",
          to_string((*stored)->request.op), "); wait for it before reusing the name"));
    }
    // Under the lock: sequence numbers follow the order drain_new() hands ops on in.
    accepted.sequence = next_sequence_[request.process_set_id]++;
    accepted.queued = true;
    new_.push_back(&accepted);
    notify = sleeping_;
  }
  if (notify) cv_.notify_one();
  return Status();
}

std::vector<Entry*> TensorQueue::drain_new() {
  std::vector<Entry*> drained;
  drain_new(&drained);
  return drained;
}

void TensorQueue::drain_new(std::vector<Entry*>* into) {
  detail::MutexLock lock(mutex_, spin_);
  record_new();
  for (Entry* entry : new_) entry->queued = false;
  if (into->empty()) {
    into->swap(new_);
    return;
  }
  into->insert(into->end(), new_.begin(), new_.end());
  new_.clear();
}

void TensorQueue::forget_queued(Entry& entry) {
  if (!entry.queued) return;
  entry.queued = false;
  std::erase(new_, &entry);
}

std::shared_ptr<Entry> TensorQueue::take(int process_set_id, std::string_view name) {
  const OpKeyView key{process_set_id, name};
  const std::uint64_t hash = name_hash(key);  // Outside the lock.
  detail::MutexLock lock(mutex_, spin_);
  std::shared_ptr<Entry> taken = in_flight_.take(key, hash);
  if (taken != nullptr && !new_.empty()) forget_queued(*taken);
  return taken;
}

void TensorQueue::take_all(std::span<Take> takes) {
  // Bounded so that a long list does not keep submitting threads waiting on the lock.
  constexpr std::size_t kPerLock = 256;
  // As Note [Lookup pipeline] in negotiation/request_sender.cc: op j's index slot and op
  // j - kStride's entry (its key, which the take compares) start loading as op j - 2 * kStride
  // is taken.
  constexpr std::size_t kStride = 8;
  for (std::size_t begin = 0; begin < takes.size(); begin += kPerLock) {
    const std::size_t end = std::min(takes.size(), begin + kPerLock);
    detail::MutexLock lock(mutex_, spin_);
    for (std::size_t j = begin; j < end + 2 * kStride; ++j) {
      if (j < end) in_flight_.prefetch(takes[j].hash);
      if (j >= begin + kStride && j - kStride < end) {
        if (const std::shared_ptr<Entry>* entry = in_flight_.peek(takes[j - kStride].hash))
          prefetch_key(**entry);
      }
      if (j < begin + 2 * kStride) continue;
      Take& take = takes[j - 2 * kStride];
      take.entry = in_flight_.take(take.key, take.hash);
      // Only while ops wait to be drained does the taken entry's flag need reading.
      if (take.entry != nullptr && !new_.empty()) forget_queued(*take.entry);
    }
  }
}

void TensorQueue::skip_automatic_name(int process_set_id, std::string_view name) {
  const std::optional<std::uint64_t> n = automatic_number(name);
  if (!n) return;
  detail::MutexLock lock(mutex_, spin_);
  std::uint64_t& count = unnamed_counts_[process_set_id];
  count = std::max(count, *n + 1);
}

std::vector<std::shared_ptr<Entry>> TensorQueue::take_set(int process_set_id) {
  detail::MutexLock lock(mutex_, spin_);
  std::vector<std::shared_ptr<Entry>> taken;
  in_flight_.take_if(
      [&](const std::shared_ptr<Entry>& entry) {
        return entry->request.process_set_id == process_set_id;
      },
      [&](std::shared_ptr<Entry>&& entry) { taken.push_back(std::move(entry)); });
  for (const std::shared_ptr<Entry>& entry : taken) forget_queued(*entry);
  return taken;
}

// Note [Resends in one pass]
// The coordinator asks a rank to resend the cache hits it sent for entries the coordinator has
// since evicted. That is rare while a step's ops fit the cache, and the rule once they do not:
// with 10,000 names a step and the default 1024 entries, a rank's lookups hit entries that
// responses on their way evict, and hundreds of ids come back a cycle. Scanning the ops in
// flight once per id made that quadratic: 48 % of rank 1's time in P3's step at a capacity of
// 9,000 (perf), where allreduce_benchmark's P3 took 35 ms against 9 ms with the cache off. So
// the ids are sorted once (with their positions, to keep the order they came in) and the ops in
// flight scanned once.
std::vector<std::shared_ptr<Entry>> TensorQueue::with_cache_hits(
    std::span<const std::int32_t> ids) const {
  std::vector<std::pair<std::int32_t, std::size_t>> wanted;  // (id, position in `ids`)
  wanted.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) wanted.emplace_back(ids[i], i);
  std::sort(wanted.begin(), wanted.end());
  std::vector<std::pair<std::size_t, std::shared_ptr<Entry>>> found;
  {
    detail::MutexLock lock(mutex_, spin_);
    in_flight_.for_each([&](const std::shared_ptr<Entry>& entry) {
      if (entry->cache_hit < 0) return;
      // The id's first place in `ids`: an id asked for twice is resent once, as when each
      // scan's caller cleared the hit before the next.
      auto at = std::lower_bound(wanted.begin(), wanted.end(),
                                 std::pair<std::int32_t, std::size_t>(entry->cache_hit, 0));
      if (at != wanted.end() && at->first == entry->cache_hit)
        found.emplace_back(at->second, entry);
    });
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::shared_ptr<Entry>> entries;
  entries.reserve(found.size());
  for (auto& [position, entry] : found) entries.push_back(std::move(entry));
  return entries;
}

bool TensorQueue::empty() const {
  detail::MutexLock lock(mutex_, spin_);
  return in_flight_.empty();
}

std::vector<std::shared_ptr<Entry>> TensorQueue::close(const Status& status) {
  std::vector<std::shared_ptr<Entry>> pending;
  {
    detail::MutexLock lock(mutex_, spin_);
    if (closed_.ok()) closed_ = status;
    record_new();  // So that the ring shows how the ops never drained end.
    in_flight_.for_each([&](const std::shared_ptr<Entry>& entry) { pending.push_back(entry); });
    in_flight_.clear();
    new_.clear();
  }
  cv_.notify_all();
  return pending;
}

void TensorQueue::wait_for_work(std::chrono::microseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  detail::MutexLock lock(mutex_, spin_);
  sleeping_ = true;
  while (new_.empty() && !woken_ && cv_.wait_until(mutex_, deadline)) {
  }
  sleeping_ = false;
  woken_ = false;
}

void TensorQueue::wake() {
  {
    detail::MutexLock lock(mutex_, spin_);
    woken_ = true;
  }
  cv_.notify_all();
}

}  // namespace tutti::core

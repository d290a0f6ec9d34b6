// SPDX-License-Identifier: Apache-2.0
#include "src/core/execution/device_path.h"

#include <algorithm>

#include "src/base/strings.h"

namespace tutti::core {
namespace {

// How long the end of a session waits for device work in flight.
constexpr std::chrono::seconds kFinishTimeout{30};

}  // namespace

Status DevicePath::claim(Device device) {
  int expected = -1;
  if (device_index_.compare_exchange_strong(expected, device.index) || expected == device.index)
    return Status();
  return invalid_argument(
      detail::str_cat("this rank's CUDA tensors are on cuda:", expected,
                      ", and a rank uses one device per "
                      "session (call tutti::shutdown() and tutti::init() to move to cuda:",
                      device.index, ")"));
}

Device DevicePath::device_of(std::span<const Work> batch) const {
  for (const Work& work : batch) {
    if (work.entry != nullptr && !work.entry->inputs.empty())
      return work.entry->inputs.front().device();
  }
  const int claimed = device_index_.load();
  if (claimed >= 0) return Device::cuda(claimed);
  const int devices = std::max(1, ops::device_ops().device_count());
  return Device::cuda(topology_.local_rank % devices);
}

Result<DevicePath::Lane> DevicePath::next_lane(int set_id, std::span<const Work> batch) {
  TUTTI_ASSIGN_OR_RETURN(ProcessSetTable::DeviceLane lane,
                         sets_.next_device_lane(set_id, device_of(batch)));
  std::unique_ptr<DeviceMover>& mover = movers_[lane.stream.index];
  if (mover == nullptr) mover = std::make_unique<DeviceMover>(lane.stream);
  return Lane{.backend = lane.backend, .mover = mover.get()};
}

Status DevicePath::wait_for_producers(const Lane& lane, std::span<Work> batch) {
  for (Work& work : batch) {
    if (work.entry == nullptr || work.entry->ready == nullptr) continue;
    TUTTI_RETURN_IF_ERROR(ops::device_ops().wait_event(*work.entry->ready, lane.mover->stream()));
    work.entry->ready.reset();  // The wait is enqueued: the event may be reused.
  }
  return Status();
}

Status DevicePath::complete_later(const Lane& lane, std::span<Work> batch) {
  TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<ops::DeviceEvent> event,
                         ops::device_ops().record_event(lane.mover->stream()));
  std::vector<std::shared_ptr<Entry>> entries;
  for (const Work& work : batch) {
    if (work.entry != nullptr) entries.push_back(work.entry);
  }
  completions_.add(std::move(event), std::move(entries), lane.mover->buffer());
  return Status();
}

Status DevicePath::check() {
  if (!completions_.busy()) return Status();
  TUTTI_RETURN_IF_ERROR(completions_.error());
  const Status status = sets_.device_async_error();
  if (!status.ok()) completions_.fail_all(status);
  return status;
}

void DevicePath::finish(const Status& status) {
  completions_.finish(kFinishTimeout, status);
  movers_.clear();
}

}  // namespace tutti::core

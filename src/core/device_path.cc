// SPDX-License-Identifier: Apache-2.0
#include "src/core/device_path.h"

#include "ops/registry.h"
#include "src/common/logging.h"

namespace tutti::core {
namespace {

// How long the end of a session waits for device work in flight.
constexpr std::chrono::seconds kFinishTimeout{30};

}  // namespace

Result<DevicePath::Lane> DevicePath::next_lane(int set_id, ops::Backend& host_backend,
                                               Device device) {
  const int index = batches_[set_id]++ % num_streams_;
  const ops::DeviceStream stream{.device = device, .index = index};
  std::unique_ptr<ops::Backend>& backend = backends_[{set_id, index}];
  if (backend == nullptr) {
    Result<std::unique_ptr<ops::Backend>> created =
        ops::create_device_backend(host_backend, stream);
    if (!created.ok()) {
      backends_.erase({set_id, index});
      return created.status();
    }
    backend = std::move(created).value();
    TUTTI_LOG_DEBUG("process set ", set_id, " stream ", index, ": ", backend->name());
  }
  std::unique_ptr<DeviceMover>& mover = movers_[index];
  if (mover == nullptr) mover = std::make_unique<DeviceMover>(stream);
  return Lane{.backend = backend.get(), .mover = mover.get()};
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
  for (auto& [key, backend] : backends_) {
    const Status status = backend->async_error();
    if (!status.ok()) {
      completions_.fail_all(status);
      return status;
    }
  }
  return Status();
}

void DevicePath::remove_set(int set_id) {
  for (auto it = backends_.begin(); it != backends_.end();) {
    if (it->first.first != set_id) {
      ++it;
      continue;
    }
    auto mover = movers_.find(it->first.second);
    if (mover != movers_.end())
      static_cast<void>(ops::device_ops().synchronize(mover->second->stream()));
    it = backends_.erase(it);
  }
  batches_.erase(set_id);
}

void DevicePath::finish(const Status& status) {
  completions_.finish(kFinishTimeout, status);
  backends_.clear();
  movers_.clear();
}

}  // namespace tutti::core

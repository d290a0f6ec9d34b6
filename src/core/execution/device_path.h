// SPDX-License-Identifier: Apache-2.0
// A session's device side: which device this rank's CUDA tensors are on, a Mover (fusion
// buffer) per stream, and the completion of device ops. The backends of the lanes belong to
// the ProcessSetTable (Note [Device lanes] in process_set_table.h).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <span>

#include "ops/backend.h"
#include "ops/device_ops.h"
#include "ops/transport.h"
#include "src/core/completer.h"
#include "src/core/execution/device_completions.h"
#include "src/core/execution/device_mover.h"
#include "src/core/execution/executor.h"
#include "src/core/process_set_table.h"

namespace tutti::core {

// Communication thread only, except claim().
class DevicePath {
 public:
  // `sets` and `completer` must outlive the path.
  DevicePath(ProcessSetTable& sets, const Completer& completer, const ops::Topology& topology)
      : sets_(sets), topology_(topology), completions_(completer) {}

  // Any thread. Records that this rank's CUDA tensors are on `device`: InvalidArgument if an
  // earlier op of this session used another device (a rank uses one device per session, so
  // lazily created backends line up on every rank).
  Status claim(Device device);

  // Where a device batch runs: the backend of its set on a stream, and that stream's mover.
  struct Lane {
    ops::Backend* backend = nullptr;
    DeviceMover* mover = nullptr;
  };
  // The lane of the next device batch of `set_id` (Note [Device lanes]); creates its backend
  // if this is its first batch there (collective over the set).
  Result<Lane> next_lane(int set_id, std::span<const Work> batch);
  // Before any device work of `batch` on `lane`: the lane's stream waits, on the device, for
  // what each op's submitting thread had enqueued on its current stream (Note [Stream
  // ordering] in ops/cuda/stream.h). Returns at once.
  Status wait_for_producers(const Lane& lane, std::span<Work> batch);
  // After `batch` was enqueued on `lane` without error: its ops complete (OK) once the device
  // has done the work (Note [Device completion]).
  Status complete_later(const Lane& lane, std::span<Work> batch);
  // An error the device or a device backend reported since (a failed kernel, a lost peer),
  // while ops are in flight; OK otherwise.
  Status check();
  // End of the session: waits a while for device work in flight, fails what is left with
  // `status`, then drops the movers.
  void finish(const Status& status);

 private:
  // The device of a batch on this rank: its tensors', else (a joined member with no tensor of
  // its own) the claimed device, else cuda:(local_rank % devices).
  Device device_of(std::span<const Work> batch) const;

  ProcessSetTable& sets_;
  const ops::Topology& topology_;
  std::atomic<int> device_index_{-1};                   // claim(); -1 until the first CUDA op.
  std::map<int, std::unique_ptr<DeviceMover>> movers_;  // By stream index.
  DeviceCompletions completions_;  // Declared last: stopped first, while the movers live.
};

}  // namespace tutti::core

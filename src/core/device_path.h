// SPDX-License-Identifier: Apache-2.0
// A session's device side: the backends over CUDA buffers per process set and stream, a
// Mover (fusion buffer) per stream, and the completion of device ops.
//
// Note [Device lanes]
// Device batches of a process set take Tutti's streams round-robin (TUTTI_NUM_NCCL_STREAMS),
// counting per set. Every member runs a set's batches in the same order (joined members too),
// so the n-th batch takes the same stream index everywhere, and the backend of (set, stream)
// is created, collectively, at the same batch on every member: the first that uses it.
// A rank's device tensors must all be on one device (Session::claim_device), so the backend's
// device never changes; a member that joined and has no tensor of its own uses that device,
// or cuda:(local_rank % devices) if it never submitted one.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <utility>

#include "ops/backend.h"
#include "ops/device_ops.h"
#include "src/core/device_completions.h"
#include "src/core/device_mover.h"
#include "src/core/executor.h"

namespace tutti::core {

// Communication thread only, except where noted.
class DevicePath {
 public:
  DevicePath(int num_streams, Timeline* timeline)
      : num_streams_(num_streams), completions_(timeline) {}

  // Where a device batch runs: the backend of its set on a stream, and that stream's mover.
  struct Lane {
    ops::Backend* backend = nullptr;
    DeviceMover* mover = nullptr;
  };
  // The lane of the next device batch of `set_id` (Note [Device lanes]); creates its backend
  // over `host_backend`'s set if this is its first batch (collective over the set).
  Result<Lane> next_lane(int set_id, ops::Backend& host_backend, Device device);
  // After `batch` was enqueued on `lane` without error: its ops complete (OK) once the device
  // has done the work (Note [Device completion]).
  Status complete_later(const Lane& lane, std::span<Work> batch);
  // An error the device or a device backend reported since (a failed kernel, a lost peer),
  // while ops are in flight; OK otherwise.
  Status check();
  // The set was removed: waits for its work and drops its backends.
  void remove_set(int set_id);
  // End of the session: waits a while for device work in flight, fails what is left with
  // `status`, then drops the backends (collective: every rank does it at shutdown).
  void finish(const Status& status);

 private:
  int num_streams_;
  std::map<int, int> batches_;  // Device batches run per set, for round-robin.
  std::map<int, std::unique_ptr<DeviceMover>> movers_;                     // By stream index.
  std::map<std::pair<int, int>, std::unique_ptr<ops::Backend>> backends_;  // (set, stream).
  DeviceCompletions completions_;  // Declared last: stopped first, while backends live.
};

}  // namespace tutti::core

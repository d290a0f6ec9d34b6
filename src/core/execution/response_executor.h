// SPDX-License-Identifier: Apache-2.0
// Stage 3 of the cycle, on every rank: runs the coordinator's response lists. For each list:
// cache (hits resolved, inserts filed) -> work (each response with this rank's entry) ->
// fusion plan -> executor (host, or a device lane) -> completion; then the list's cache
// evictions, and its shutdown if it is the bye. See Note [The cycle] in background_loop.h.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "src/common/status.h"
#include "src/core/completer.h"
#include "src/core/execution/device_path.h"
#include "src/core/execution/executor.h"
#include "src/core/execution/mover.h"
#include "src/core/flight_recorder.h"
#include "src/core/process_set_table.h"
#include "src/core/request.h"
#include "src/core/response_cache.h"
#include "src/core/tensor_queue.h"
#include "src/core/timeline.h"

namespace tutti::core {

class P2PEngine;

// Communication thread only.
class ResponseExecutor {
 public:
  // What the executor works with; everything must outlive it.
  struct Parts {
    TensorQueue& queue;          // Where this rank's entries are taken from.
    ProcessSetTable& sets;       // Set changes are applied here; backends come from here.
    DevicePath& device;          // Device batches run on its lanes.
    const Completer& completer;  // Host ops complete here; device ops via `device`.
    Timeline* timeline;          // Null: none.
    FlightRecorder* recorder;    // Null: none. Ops' negotiated and executing phases go here.
    P2PEngine* p2p = nullptr;    // Null: none. A removed set's point-to-point ops fail here.
  };
  ResponseExecutor(Parts parts, std::size_t fusion_threshold_bytes);

  // Runs every response of `list` in list order (Note [Negotiation], step 4), after adopting
  // the list's autotuned fusion threshold and host routes, if it carries them. A Communication
  // error fails the rest of the list and is returned: the session must stop. Errors the coordinator
  // decided fail their ops only.
  Status execute(ResponseList list);

  // The cache of negotiated responses this rank has, which the request sender reads.
  const RankCache& cache() const { return cache_; }
  // Set once a list with `shutdown` (the bye) has run: why the job stops.
  const std::optional<Status>& shutdown() const { return shutdown_; }
  // Whether the bye's reason was an error, not only shutdown() calls.
  bool shutdown_after_error() const { return shutdown_after_error_; }

 private:
  // The responses of `list` that this rank takes part in, with its entries; completes the
  // error responses and files the list's cache inserts.
  std::vector<Work> prepare(const ResponseList& list);
  // Runs one fusion batch. Sets *deferred when its ops complete later, once the device has
  // done the work (Note [Device completion]); otherwise the caller completes them.
  Status run_batch(std::span<Work> batch, bool* deferred);
  // run_batch(), with an exception out of it turned into Internal (Note [A batch that throws]
  // in response_executor.cc).
  Status run_batch_caught(std::span<Work> batch, bool* deferred);
  Status run_collective(std::span<Work> batch, ops::Backend& backend, Mover& mover);
  // Whether this rank is a member of the response's set that joined without submitting it
  // (see Note [Join] in negotiation/coordinator.h).
  bool is_absent_member(const Response& response) const;
  // The set changes, at their place in the response order (collective over all ranks).
  Status add_process_set(const Work& work);
  Status remove_process_set(const Work& work);

  Parts parts_;
  std::size_t fusion_threshold_bytes_;  // Autotune may change it (Note [Autotune]).
  RankCache cache_;
  Executor executor_;
  HostMover host_mover_;
  std::optional<Status> shutdown_;
  bool shutdown_after_error_ = false;
  // prepare()'s buffers, one element per op, kept between lists.
  std::vector<const Response*> responses_;
  std::vector<ResponseFacts> facts_;
  std::vector<TensorQueue::Take> takes_;
  std::vector<std::int32_t> inserts_;  // The cache id to file the op's response under, or -1.
};

}  // namespace tutti::core

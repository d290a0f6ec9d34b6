// SPDX-License-Identifier: Apache-2.0
#include "src/core/execution/response_executor.h"

#include <algorithm>

#include "src/base/strings.h"
#include "src/common/check.h"
#include "src/core/execution/fusion_planner.h"
#include "src/core/execution/p2p_engine.h"
#include "src/core/op_state.h"

namespace tutti::core {
namespace {

// What fusion needs of a response (ResponseFacts), derived once per cached response.
ResponseFacts derive(const Response& response) {
  const std::uint64_t key = fusion_key(response);
  return ResponseFacts{.fusion_key = key,
                       .fusion_bytes = key == 0 ? SIZE_MAX : fusion_bytes(response)};
}

// A work's flight-recorder id; -1 for a joined rank's work, which has no entry.
std::int64_t work_record_id(const Work& work) {
  return work.entry != nullptr ? work.entry->record : -1;
}

}  // namespace

ResponseExecutor::ResponseExecutor(Parts parts, std::size_t fusion_threshold_bytes)
    : parts_(parts),
      fusion_threshold_bytes_(fusion_threshold_bytes),
      host_mover_(fusion_threshold_bytes) {
  executor_.set_timeline(parts_.timeline);
}

std::vector<Work> ResponseExecutor::prepare(const ResponseList& list) {
  constexpr std::int32_t kPrefetchAhead = 8;
  // A run of cache hits is one entry of the list and many ops (Note [Hit fast path]).
  std::size_t ops = 0;
  for (std::size_t i = 0; i < list.responses.size(); ++i) {
    if (list.hit[i] == 0) {
      ++ops;
      continue;
    }
    // Before anything is sized by it: a run ends at an id this rank knows.
    const std::int32_t last = list.cache_ids[i] + list.hit[i] - 1;
    TUTTI_CHECK(cache_.response(last) != nullptr, "cache id ", last, " is unknown here");
    ops += static_cast<std::size_t>(list.hit[i]);
  }
  std::vector<Work> works;
  works.reserve(ops);
  // First each op's response (the cached one for a hit), the id to cache it under, and its key
  // in the queue; then the queue's entries all at once (TensorQueue::take_all()); then the
  // rest op by op.
  responses_.resize(ops);
  facts_.resize(ops);
  takes_.resize(ops);
  inserts_.resize(ops);
  std::size_t op = 0;
  for (std::size_t i = 0; i < list.responses.size(); ++i) {
    if (list.hit[i] == 0) {
      const Response& response = list.responses[i];
      const OpKeyView key{response.process_set_id, response.name};
      responses_[op] = &response;
      facts_[op] = derive(response);
      takes_[op] = TensorQueue::Take{.key = key, .hash = name_hash(key), .entry = nullptr};
      inserts_[op++] = list.cache_ids[i];
      continue;
    }
    for (std::int32_t k = 0; k < list.hit[i]; ++k) {
      const std::int32_t id = list.cache_ids[i] + k;
      // Note [Lookup pipeline] in negotiation/request_sender.cc: a run's ids are consecutive.
      if (k + kPrefetchAhead < list.hit[i]) cache_.prefetch_response(id + kPrefetchAhead);
      std::uint64_t hash = 0;
      const Response* response = cache_.response(id, &hash, &facts_[op]);
      TUTTI_CHECK(response != nullptr, "cache id ", id, " is unknown here");
      responses_[op] = response;
      takes_[op] = TensorQueue::Take{.key = OpKeyView{response->process_set_id, response->name},
                                     .hash = hash,
                                     .entry = nullptr};
      inserts_[op++] = -1;
    }
  }
  parts_.queue.take_all(takes_);
  for (std::size_t i = 0; i < ops; ++i) {
    const Response* response = responses_[i];
    std::shared_ptr<Entry> entry = std::move(takes_[i].entry);
    if (inserts_[i] >= 0) {
      // Every rank stores every cached response, members of its set or not: hits are sent
      // to every rank, and each must resolve them. A non-member never looks its request up.
      Request placeholder;
      placeholder.process_set_id = response->process_set_id;
      placeholder.name = response->name;
      cache_.insert(inserts_[i], entry != nullptr ? entry->request : placeholder, *response,
                    facts_[i]);
    }
    if (entry == nullptr) {
      // Not a member of the set, or a member that joined without submitting the op: it
      // still takes part in the collective (see Note [Join] in negotiation/coordinator.h).
      if (is_absent_member(*response)) {
        parts_.queue.skip_automatic_name(response->process_set_id, response->name);
        if (response->ok) {
          works.push_back(Work{.response = response,
                               .entry = nullptr,
                               .fusion_key = facts_[i].fusion_key,
                               .fusion_bytes = facts_[i].fusion_bytes});
        }
      }
      continue;
    }
    if (!response->ok) {
      parts_.completer.complete(*entry, Status(response->error_code, response->error_message));
      continue;
    }
    if (parts_.timeline != nullptr && parts_.timeline->enabled()) {
      const TensorSpec& spec = response->tensors.empty() ? TensorSpec{} : response->tensors.front();
      parts_.timeline->op_start(response->name, to_string(response->op), to_string(spec.dtype),
                                detail::shape_string(spec.shape));
    }
    works.push_back(Work{.response = response,
                         .entry = std::move(entry),
                         .fusion_key = facts_[i].fusion_key,
                         .fusion_bytes = facts_[i].fusion_bytes});
  }
  takes_.clear();  // Keeps the buffers for the next list.
  responses_.clear();
  facts_.clear();
  inserts_.clear();
  // The works' phases are written as their batches end (Note [Phases written as a batch ends]).
  if (parts_.recorder != nullptr) parts_.recorder->list_negotiated(works, work_record_id);
  return works;
}

Status ResponseExecutor::execute(ResponseList list) {
  if (list.fusion_threshold_bytes >= 0) {
    // Before planning: every rank plans this list with the new threshold (Note [Autotune]).
    fusion_threshold_bytes_ = static_cast<std::size_t>(list.fusion_threshold_bytes);
    host_mover_.set_piece_bytes(fusion_threshold_bytes_);
  }
  // Likewise every rank runs this list's collectives over the new host routes.
  if (list.host_routes >= 0) parts_.sets.route_host(static_cast<ops::HostRoutes>(list.host_routes));
  std::vector<Work> works = prepare(list);
  std::vector<FusionItem> items;
  items.reserve(works.size());
  for (const Work& work : works) {
    items.push_back(FusionItem{
        .key = work.fusion_key, .bytes = work.fusion_bytes, .root = work.response->root_rank});
  }
  Status fault;
  std::vector<Work> gathered;
  for (const std::vector<std::size_t>& indices : plan_fusion(items, fusion_threshold_bytes_)) {
    // A batch of consecutive ops (the usual one: a run of hits, a burst of ops) runs where the
    // works lie; others are gathered first.
    if (indices.empty()) continue;
    std::span<Work> batch;
    if (indices.back() - indices.front() + 1 == indices.size() &&
        std::is_sorted(indices.begin(), indices.end())) {
      batch = std::span<Work>(works).subspan(indices.front(), indices.size());
    } else {
      gathered.clear();
      for (std::size_t i : indices) gathered.push_back(std::move(works[i]));  // Each index once.
      batch = gathered;
    }
    if (parts_.recorder != nullptr) parts_.recorder->batch_begun(indices);
    // After a transport fault the peers are in an unknown state: fail the rest, run nothing.
    bool deferred = false;
    const Status status = fault.ok() ? run_batch_caught(batch, &deferred) : fault;
    if (!deferred) {
      if (parts_.recorder != nullptr) {
        parts_.recorder->batch_finished(status.ok() ? OpPhase::Done : OpPhase::Failed,
                                        status.message());
      }
      for (Work& work : batch) {
        if (work.entry != nullptr) parts_.completer.complete(*work.entry, status, /*record=*/false);
      }
    }
    if (!status.ok() &&
        (status.code() == ErrorCode::Communication || status.code() == ErrorCode::Internal)) {
      fault = status;
    }
  }
  if (parts_.recorder != nullptr) parts_.recorder->list_ended();
  // Evictions last: ids are never reused, a list that inserts more entries than the capacity
  // evicts some of its own (the coordinator did so while building it), and `works` point into
  // the cache until their batches have run.
  for (std::int32_t id : list.evicted) cache_.erase(id);
  if (list.shutdown) {
    shutdown_ = Status(list.shutdown_code, list.shutdown_message);
    shutdown_after_error_ = list.shutdown_after_error;
  }
  return fault;
}

// Note [A batch that throws]
// The works of a batch have left the queue: nothing but this loop completes them. An exception
// out of a batch (input a check let through, a bug) used to end the communication thread with
// the batch's handles never completed, so a wait() on them hung even past shutdown(). It now
// fails the batch with Internal like a transport fault: the list's later batches fail with it,
// and the loop stops the runtime as before, failing every other pending op.
Status ResponseExecutor::run_batch_caught(std::span<Work> batch, bool* deferred) {
  try {
    return run_batch(batch, deferred);
  } catch (const std::exception& e) {
    *deferred = false;
    return Status(ErrorCode::Internal,
                  detail::str_cat("Tutti's communication thread failed: ", e.what()));
  }
}

Status ResponseExecutor::run_batch(std::span<Work> batch, bool* deferred) {
  Work& first = batch.front();
  const Response& response = *first.response;
  switch (response.op) {
    case Collective::Join:
      // Every member has joined: nothing to move, only the answer (see Note [Join]).
      first.entry->state->mutable_results().last_joined_rank = response.last_joined_rank;
      return Status();
    case Collective::AddProcessSet: return add_process_set(first);
    case Collective::RemoveProcessSet: return remove_process_set(first);
    default: break;
  }
  ops::Backend& host = parts_.sets.host_backend(response.process_set_id);
  if (response.device == Device::Kind::CPU) return run_collective(batch, host, host_mover_);
  TUTTI_ASSIGN_OR_RETURN(DevicePath::Lane lane,
                         parts_.device.next_lane(response.process_set_id, batch));
  TUTTI_RETURN_IF_ERROR(parts_.device.wait_for_producers(lane, batch));
  TUTTI_RETURN_IF_ERROR(run_collective(batch, *lane.backend, *lane.mover));
  // Before the device thread may finish them: their records now say executing.
  if (parts_.recorder != nullptr) parts_.recorder->batch_deferred();
  TUTTI_RETURN_IF_ERROR(parts_.device.complete_later(lane, batch));
  *deferred = true;
  return Status();
}

Status ResponseExecutor::run_collective(std::span<Work> batch, ops::Backend& backend,
                                        Mover& mover) {
  if (parts_.recorder != nullptr) parts_.recorder->batch_executing(backend.name());
  Work& first = batch.front();
  const Response& response = *first.response;
  // Reductions mark their own stages (pack, collective, unpack).
  if (response.op != Collective::Allreduce && response.op != Collective::Reduce)
    executor_.mark(batch, to_string(response.op));
  // The root's set rank, for the ops that have one.
  auto root = [&] {
    return parts_.sets.find(response.process_set_id).value().set_rank_of(response.root_rank);
  };
  switch (response.op) {
    case Collective::Allreduce: return executor_.allreduce(batch, backend, mover);
    case Collective::Broadcast: return executor_.broadcast(first, backend, mover, root());
    case Collective::Allgather: return executor_.allgather(batch, backend, mover);
    case Collective::Alltoall: return executor_.alltoall(first, backend, mover);
    case Collective::Reducescatter: return executor_.reducescatter(batch, backend, mover);
    case Collective::Reduce: return executor_.reduce(batch, backend, mover, root());
    case Collective::Gather: return executor_.gather(batch, backend, mover, root());
    case Collective::Scatter: return executor_.scatter(first, backend, mover, root());
    case Collective::Barrier: return backend.barrier();
    case Collective::Join:
    case Collective::AddProcessSet:
    case Collective::RemoveProcessSet: break;  // Handled by run_batch.
  }
  TUTTI_CHECK(false, "unknown collective ", static_cast<int>(response.op));
}

bool ResponseExecutor::is_absent_member(const Response& response) const {
  if (response.joined.empty()) return false;
  Result<SetInfo> set = parts_.sets.find(response.process_set_id);
  if (!set.ok() || !set.value().includes_me()) return false;
  const int me = set.value().set_rank;
  return std::find(response.joined.begin(), response.joined.end(), me) != response.joined.end();
}

// Every rank runs this at the same point of the response order, so the communicator's
// creation (collective over all ranks) lines up everywhere. The coordinator numbered the set.
Status ResponseExecutor::add_process_set(const Work& work) {
  const Response& response = *work.response;
  TUTTI_RETURN_IF_ERROR(parts_.sets.add(response.target_set_id, response.set_ranks));
  if (parts_.recorder != nullptr) parts_.recorder->set_process_sets(parts_.sets.membership());
  if (work.entry != nullptr)
    work.entry->state->mutable_results().created_set_id = response.target_set_id;
  return Status();
}

Status ResponseExecutor::remove_process_set(const Work& work) {
  const int id = work.response->target_set_id;
  // The table forgets the set first, so that new ops on it are refused by their call; the
  // ones in flight are failed (the coordinator dropped them).
  parts_.sets.remove(id);
  if (parts_.recorder != nullptr) parts_.recorder->set_process_sets(parts_.sets.membership());
  const Status removed(ErrorCode::ShutDown, detail::str_cat("process set ", id, " was removed"));
  parts_.completer.complete(parts_.queue.take_set(id), removed);
  if (parts_.p2p != nullptr) parts_.p2p->fail_set(id, removed);
  return Status();
}

}  // namespace tutti::core

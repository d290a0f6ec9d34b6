// SPDX-License-Identifier: Apache-2.0
// Allgather and gather (alone, or a fused batch in one MPI_Allgatherv / MPI_Gatherv), alltoall
// and scatter.
#include <algorithm>

#include "src/common/check.h"
#include "src/core/execution/executor.h"

namespace tutti::core {
namespace {

Shape with_rows(const TensorSpec& spec, std::int64_t rows) {
  Shape shape = spec.shape.to_vector();
  shape.at(0) = rows;
  return shape;
}

// One tensor of a fused allgather batch.
struct GatherItem {
  Work* work = nullptr;
  std::size_t tensor = 0;
  std::size_t row_units = 0;  // Units (elements of the batch's unit dtype) per row.
};

// The collective of gather() (`root` -1: every rank receives).
Status gather_call(ops::Backend& backend, const void* input, void* output,
                   std::span<const std::size_t> counts, DataType dtype, int root) {
  if (root < 0) return backend.allgatherv(input, output, counts, dtype);
  return backend.gatherv(input, output, counts, dtype, root);
}

}  // namespace

// A lone tensor is gathered straight into its output: no packing.
Status Executor::gather_one(Work& work, ops::Backend& backend, Mover& mover, int root) {
  const Response& response = *work.response;
  const auto size = static_cast<std::size_t>(backend.size());
  const TensorSpec& spec = response.tensors.front();
  const std::size_t row = row_count(spec);
  std::vector<std::size_t> counts(size);
  std::int64_t rows = 0;
  for (std::size_t r = 0; r < size; ++r) {
    rows += response.rows[r];
    counts[r] = static_cast<std::size_t>(response.rows[r]) * row;
  }
  // Only a rank that receives has an output: every rank in an allgather (a joined member
  // keeps it only as scratch), the root alone in a gather.
  const bool receives = root < 0 || backend.rank() == root;
  Tensor output;
  if (receives) {
    TUTTI_ASSIGN_OR_RETURN(output, mover.new_tensor(spec.dtype, with_rows(spec, rows)));
  }
  // A joined member sends nothing (its row count is 0).
  const void* input = work.entry != nullptr ? work.entry->inputs[0].data() : nullptr;
  TUTTI_RETURN_IF_ERROR(gather_call(backend, input, output.data(), counts, spec.dtype, root));
  if (work.entry != nullptr && receives) {
    work.entry->state->mutable_results().set_output(output);
  }
  return Status();
}

// A fused batch (several ops, or a grouped op) moves in one allgatherv (gatherv). Each rank
// packs its own rows of every tensor, in batch order, into one block; the gathered buffer is
// then rank after rank, each block tensor after tensor, and unpacking copies every rank's rows
// of each tensor into that tensor's output. Tensors of one dtype travel in it; a batch mixing
// dtypes (a grouped op may) travels as bytes. In a gather only the root receives and unpacks.
Status Executor::gather(std::span<Work> batch, ops::Backend& backend, Mover& mover,
                        int root_set_rank) {
  if (batch.size() == 1 && batch.front().response->tensors.size() == 1) {
    return gather_one(batch.front(), backend, mover, root_set_rank);
  }
  const auto size = static_cast<std::size_t>(backend.size());
  const auto me = static_cast<std::size_t>(backend.rank());
  const bool receives = root_set_rank < 0 || backend.rank() == root_set_rank;
  const DataType first = batch.front().response->tensors.front().dtype;
  bool one_dtype = true;
  for (const Work& work : batch) {
    for (const TensorSpec& spec : work.response->tensors)
      one_dtype = one_dtype && spec.dtype == first;
  }
  const DataType unit = one_dtype ? first : DataType::UInt8;
  const std::size_t unit_bytes = element_size(unit);
  std::vector<GatherItem> items;
  for (Work& work : batch) {
    for (std::size_t t = 0; t < work.response->tensors.size(); ++t) {
      const TensorSpec& spec = work.response->tensors[t];
      items.push_back({.work = &work,
                       .tensor = t,
                       .row_units = row_count(spec) * element_size(spec.dtype) / unit_bytes});
    }
  }
  auto rows_of = [size](const GatherItem& item, std::size_t r) {
    return static_cast<std::size_t>(item.work->response->rows[item.tensor * size + r]);
  };
  std::vector<std::size_t> counts(size, 0);
  for (const GatherItem& item : items) {
    for (std::size_t r = 0; r < size; ++r) counts[r] += rows_of(item, r) * item.row_units;
  }
  std::size_t gathered = 0;
  std::vector<std::size_t> displacement(size);
  for (std::size_t r = 0; r < size; ++r) {
    displacement[r] = gathered;
    gathered += counts[r];
  }
  const std::size_t received = receives ? gathered : 0;
  TUTTI_ASSIGN_OR_RETURN(std::byte * send, mover.scratch((counts[me] + received) * unit_bytes));
  std::byte* receive = send + counts[me] * unit_bytes;
  std::size_t offset = 0;
  for (const GatherItem& item : items) {
    const std::size_t units = rows_of(item, me) * item.row_units;
    // A joined member has no entry, and 0 rows.
    if (units > 0) {
      mover.copy(copy_of(send + offset * unit_bytes, unit,
                         item.work->entry->inputs[item.tensor].data(), unit, units, 1.0));
    }
    offset += units;
  }
  TUTTI_RETURN_IF_ERROR(mover.flush());
  TUTTI_RETURN_IF_ERROR(gather_call(backend, send, receive, counts, unit, root_set_rank));
  if (!receives) return Status();
  std::vector<std::size_t> within(size, 0);  // Units of each rank's block already unpacked.
  for (const GatherItem& item : items) {
    const Response& response = *item.work->response;
    const TensorSpec& spec = response.tensors[item.tensor];
    std::int64_t rows = 0;
    for (std::size_t r = 0; r < size; ++r) rows += static_cast<std::int64_t>(rows_of(item, r));
    Tensor output;
    if (item.work->entry != nullptr) {
      TUTTI_ASSIGN_OR_RETURN(output, mover.new_tensor(spec.dtype, with_rows(spec, rows)));
    }
    auto* out = static_cast<std::byte*>(output.data());
    for (std::size_t r = 0; r < size; ++r) {
      const std::size_t units = rows_of(item, r) * item.row_units;
      if (out != nullptr && units > 0) {
        mover.copy(copy_of(out, unit, receive + (displacement[r] + within[r]) * unit_bytes, unit,
                           units, 1.0));
        out += units * unit_bytes;
      }
      within[r] += units;
    }
    if (item.work->entry != nullptr) {
      detail::OpResults& results = item.work->entry->state->mutable_results();
      if (item.tensor == 0) results.output = output;
      results.outputs.push_back(std::move(output));
    }
  }
  return mover.flush();
}

Status Executor::alltoall(Work& work, ops::Backend& backend, Mover& mover) {
  TUTTI_CHECK(work.entry != nullptr, "ALLTOALL '", work.response->name, "' ran on a joined rank");
  const Response& response = *work.response;
  const auto size = static_cast<std::size_t>(backend.size());
  const auto me = static_cast<std::size_t>(backend.rank());
  const TensorSpec& spec = response.tensors.front();
  const std::size_t row = row_count(spec);
  std::vector<std::size_t> send_counts(size);
  std::vector<std::size_t> receive_counts(size);
  std::vector<std::int64_t> received(size);
  std::int64_t rows = 0;
  for (std::size_t r = 0; r < size; ++r) {
    send_counts[r] = static_cast<std::size_t>(response.splits[me * size + r]) * row;
    received[r] = response.splits[r * size + me];
    receive_counts[r] = static_cast<std::size_t>(received[r]) * row;
    rows += received[r];
  }
  TUTTI_ASSIGN_OR_RETURN(Tensor output, mover.new_tensor(spec.dtype, with_rows(spec, rows)));
  TUTTI_RETURN_IF_ERROR(backend.alltoallv(work.entry->inputs[0].data(), send_counts, output.data(),
                                          receive_counts, spec.dtype));
  detail::OpResults& results = work.entry->state->mutable_results();
  results.set_output(output);
  results.received_splits = std::move(received);
  return Status();
}

// Straight from the root's input into every member's output: response->splits are the root's
// row counts, response->tensors the root's input (a non-root's own view carries no data).
Status Executor::scatter(Work& work, ops::Backend& backend, Mover& mover, int root_set_rank) {
  TUTTI_CHECK(work.entry != nullptr, "SCATTER '", work.response->name, "' ran on a joined rank");
  const Response& response = *work.response;
  const auto size = static_cast<std::size_t>(backend.size());
  const auto me = static_cast<std::size_t>(backend.rank());
  const TensorSpec& spec = response.tensors.front();
  const std::size_t row = row_count(spec);
  std::vector<std::size_t> counts(size);
  for (std::size_t r = 0; r < size; ++r)
    counts[r] = static_cast<std::size_t>(response.splits[r]) * row;
  TUTTI_ASSIGN_OR_RETURN(Tensor output,
                         mover.new_tensor(spec.dtype, with_rows(spec, response.splits[me])));
  const void* input = backend.rank() == root_set_rank ? work.entry->inputs[0].data() : nullptr;
  TUTTI_RETURN_IF_ERROR(backend.scatterv(input, counts, output.data(), spec.dtype, root_set_rank));
  work.entry->state->mutable_results().set_output(output);
  return Status();
}

}  // namespace tutti::core

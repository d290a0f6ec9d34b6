// SPDX-License-Identifier: Apache-2.0
// Allgather (alone, or a fused batch in one MPI_Allgatherv) and alltoall.
#include <algorithm>

#include "src/common/check.h"
#include "src/core/executor.h"

namespace tutti::core {
namespace {

Shape with_rows(const TensorSpec& spec, std::int64_t rows) {
  Shape shape = spec.shape;
  shape.at(0) = rows;
  return shape;
}

// One tensor of a fused allgather batch.
struct GatherItem {
  Work* work = nullptr;
  std::size_t tensor = 0;
  std::size_t row_units = 0;  // Units (elements of the batch's unit dtype) per row.
};

}  // namespace

// A lone tensor is gathered straight into its output: no packing.
Status Executor::allgather_one(Work& work, ops::Backend& backend, Mover& mover) {
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
  TUTTI_ASSIGN_OR_RETURN(Tensor output, mover.new_tensor(spec.dtype, with_rows(spec, rows)));
  // A joined member sends nothing (its row count is 0) and keeps the output only as scratch.
  const void* input = work.entry != nullptr ? work.entry->inputs[0].data() : nullptr;
  TUTTI_RETURN_IF_ERROR(backend.allgatherv(input, output.data(), counts, spec.dtype));
  if (work.entry != nullptr) {
    work.entry->state->results.output = output;
    work.entry->state->results.outputs = {output};
  }
  return Status();
}

// A fused batch (several ops, or a grouped op) moves in one allgatherv. Each rank packs its
// own rows of every tensor, in batch order, into one block; the gathered buffer is then rank
// after rank, each block tensor after tensor, and unpacking copies every rank's rows of each
// tensor into that tensor's output. Tensors of one dtype travel in it; a batch mixing dtypes
// (a grouped op may) travels as bytes.
Status Executor::allgather(std::span<Work> batch, ops::Backend& backend, Mover& mover) {
  if (batch.size() == 1 && batch.front().response->tensors.size() == 1) {
    return allgather_one(batch.front(), backend, mover);
  }
  const auto size = static_cast<std::size_t>(backend.size());
  const auto me = static_cast<std::size_t>(backend.rank());
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
  TUTTI_ASSIGN_OR_RETURN(std::byte * send, mover.scratch((counts[me] + gathered) * unit_bytes));
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
  TUTTI_RETURN_IF_ERROR(backend.allgatherv(send, receive, counts, unit));
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
      detail::OpResults& results = item.work->entry->state->results;
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
  work.entry->state->results.output = output;
  work.entry->state->results.outputs = {output};
  work.entry->state->results.received_splits = std::move(received);
  return Status();
}

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// Reducescatter: alone (straight from the input into the output), or a fused batch in one
// MPI_Reduce_scatter.
#include <algorithm>

#include "src/common/check.h"
#include "src/core/execution/executor.h"

namespace tutti::core {
namespace {

// API.md's split of n rows over `size` ranks: rank r gets rows [r·q + min(r, m), ...) with
// q = n / size, m = n % size, i.e. the first m ranks one extra row.
std::size_t rows_of(std::int64_t n, std::size_t size, std::size_t r) {
  const auto rows = static_cast<std::size_t>(n);
  return rows / size + (r < rows % size ? 1 : 0);
}
std::size_t first_row(std::int64_t n, std::size_t size, std::size_t r) {
  const auto rows = static_cast<std::size_t>(n);
  return r * (rows / size) + std::min(r, rows % size);
}

Shape with_rows(const TensorSpec& spec, std::size_t rows) {
  Shape shape = spec.shape.to_vector();
  shape.at(0) = static_cast<std::int64_t>(rows);
  return shape;
}

// One pass of Note [Mixed wire dtypes] in executor.h over the tensors of `batch` that travel in
// `wire` (all of them where `only` is empty): each rank packs, rank block after rank block, the
// rows every rank is to receive of each of those tensors (converted to `wire`, prescaled), so
// that block r is what MPI_Reduce_scatter reduces into rank r; its own block comes back tensor
// after tensor, into `outputs` (per work, per tensor, allocated by the caller).
Status reducescatter_pass(std::span<Work> batch, DataType wire, std::optional<DataType> only,
                          std::vector<std::vector<Tensor>>& outputs, ops::Backend& backend,
                          Mover& mover) {
  const auto size = static_cast<std::size_t>(backend.size());
  const auto me = static_cast<std::size_t>(backend.rank());
  const ops::WireOp op = wire_op(batch.front().response->reduce_op);
  const std::size_t wire_bytes = element_size(wire);
  std::vector<std::size_t> counts(size, 0);
  std::size_t total = 0;
  for (const Work& work : batch) {
    for (std::size_t t = 0; t < work.response->tensors.size(); ++t) {
      if (!travels_in(*work.response, t, only)) continue;
      const TensorSpec& spec = work.response->tensors[t];
      for (std::size_t r = 0; r < size; ++r)
        counts[r] += rows_of(spec.shape.at(0), size, r) * row_count(spec);
      total += count_of(spec);
    }
  }
  TUTTI_ASSIGN_OR_RETURN(std::byte * send, mover.scratch((total + counts[me]) * wire_bytes));
  std::byte* receive = send + total * wire_bytes;
  std::size_t offset = 0;
  for (std::size_t r = 0; r < size; ++r) {
    for (const Work& work : batch) {
      for (std::size_t t = 0; t < work.response->tensors.size(); ++t) {
        if (!travels_in(*work.response, t, only)) continue;
        const TensorSpec& spec = work.response->tensors[t];
        const TensorView& input = work.entry->inputs[t];
        const std::size_t row = row_count(spec);
        const std::size_t n = rows_of(spec.shape.at(0), size, r) * row;
        const auto* from = static_cast<const std::byte*>(input.data()) +
                           first_row(spec.shape.at(0), size, r) * row * element_size(spec.dtype);
        mover.copy(copy_of(send + offset * wire_bytes, wire, from, spec.dtype, n,
                           work.response->prescale));
        offset += n;
      }
    }
  }
  TUTTI_RETURN_IF_ERROR(mover.flush());
  TUTTI_RETURN_IF_ERROR(backend.reducescatter(send, receive, counts, wire, op));
  offset = 0;
  for (std::size_t w = 0; w < batch.size(); ++w) {
    const Response& response = *batch[w].response;
    const double factor = output_factor(response, backend.size());
    for (std::size_t t = 0; t < response.tensors.size(); ++t) {
      if (!travels_in(response, t, only)) continue;
      const TensorSpec& spec = response.tensors[t];
      Tensor& output = outputs[w][t];
      const std::size_t n = rows_of(spec.shape.at(0), size, me) * row_count(spec);
      mover.copy(
          copy_of(output.data(), spec.dtype, receive + offset * wire_bytes, wire, n, factor));
      offset += n;
    }
  }
  return mover.flush();
}

}  // namespace

// A lone tensor in its own dtype, unscaled, goes straight from the input into the output; else
// the batch is packed by reducescatter_pass(), once per wire dtype (Note [Mixed wire dtypes]).
Status Executor::reducescatter(std::span<Work> batch, ops::Backend& backend, Mover& mover) {
  for (const Work& work : batch) {
    TUTTI_CHECK(work.entry != nullptr, "REDUCESCATTER '", work.response->name,
                "' ran on a joined rank");
  }
  const auto size = static_cast<std::size_t>(backend.size());
  const auto me = static_cast<std::size_t>(backend.rank());
  const Response& first = *batch.front().response;
  const WireBatch wires = wire_batch(batch);
  const TensorSpec& first_spec = first.tensors.front();
  if (batch.size() == 1 && first.tensors.size() == 1 && wires.wire == first_spec.dtype &&
      first.prescale == 1.0) {
    // The input is already rank blocks in order: reduce straight into the output.
    const std::size_t row = row_count(first_spec);
    const std::int64_t n = first_spec.shape.at(0);
    std::vector<std::size_t> counts(size);
    for (std::size_t r = 0; r < size; ++r) counts[r] = rows_of(n, size, r) * row;
    TUTTI_ASSIGN_OR_RETURN(
        Tensor output,
        mover.new_tensor(first_spec.dtype, with_rows(first_spec, rows_of(n, size, me))));
    Work& work = batch.front();
    TUTTI_RETURN_IF_ERROR(backend.reducescatter(work.entry->inputs[0].data(), output.data(), counts,
                                                wires.wire, wire_op(first.reduce_op)));
    const double factor = output_factor(first, backend.size());
    if (factor != 1.0) {
      mover.copy(copy_of(output.data(), wires.wire, output.data(), wires.wire, counts[me], factor));
    }
    work.entry->state->mutable_results().set_output(output);
    return mover.flush();
  }
  std::vector<std::vector<Tensor>> outputs(batch.size());
  for (std::size_t w = 0; w < batch.size(); ++w) {
    for (const TensorSpec& spec : batch[w].response->tensors) {
      TUTTI_ASSIGN_OR_RETURN(
          Tensor output,
          mover.new_tensor(spec.dtype, with_rows(spec, rows_of(spec.shape.at(0), size, me))));
      outputs[w].push_back(std::move(output));
    }
  }
  if (!wires.mixed) {
    TUTTI_RETURN_IF_ERROR(reducescatter_pass(batch, wires.wire, {}, outputs, backend, mover));
  } else {
    for (const DataType wire : wire_dtypes(batch)) {
      TUTTI_RETURN_IF_ERROR(reducescatter_pass(batch, wire, wire, outputs, backend, mover));
    }
  }
  for (std::size_t w = 0; w < batch.size(); ++w) {
    detail::OpResults& results = batch[w].entry->state->mutable_results();
    results.output = outputs[w].front();
    results.outputs = std::move(outputs[w]);
  }
  return Status();
}

}  // namespace tutti::core

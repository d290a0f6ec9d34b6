// SPDX-License-Identifier: Apache-2.0
#include "src/core/executor.h"

#include <algorithm>
#include <cstring>

#include "ops/convert.h"
#include "src/common/check.h"

namespace tutti::core {
namespace {

bool is_integer(DataType dtype) { return !is_floating(dtype) && dtype != DataType::Bool; }

// The factor unpack applies: postscale, and 1/size for Average.
double output_factor(const Response& response, int size) {
  return response.reduce_op == ReduceOp::Average ? response.postscale / size : response.postscale;
}

std::size_t count_of(const TensorSpec& spec) { return static_cast<std::size_t>(num_elements(spec.shape)); }

}  // namespace

DataType wire_dtype(DataType dtype, ReduceOp op, double prescale, double postscale) {
  if (dtype == DataType::Float16 || dtype == DataType::BFloat16) return DataType::Float32;
  const bool scaled = op == ReduceOp::Average || prescale != 1.0 || postscale != 1.0;
  if (is_integer(dtype) && scaled) return DataType::Float64;
  return dtype;
}

ops::WireOp wire_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Average:
    case ReduceOp::Sum: return ops::WireOp::Sum;
    case ReduceOp::Min: return ops::WireOp::Min;
    case ReduceOp::Max: return ops::WireOp::Max;
    case ReduceOp::Product: return ops::WireOp::Product;
    case ReduceOp::Adasum: break;  // Has its own algorithm; never a wire op.
  }
  TUTTI_CHECK(false, "ReduceOp ", static_cast<int>(op), " has no wire op");
}

// A lone tensor that needs no conversion is reduced where it lies, in pieces of chunk_bytes_,
// each scaled right after its reduction while it is still in cache: packing 100 MB would cost
// two extra passes over memory, a separate scaling pass one.
Status Executor::allreduce_in_place(Work& work, ops::Backend& backend) {
  const Response& response = *work.response;
  const TensorView& input = work.entry->inputs[0];
  const TensorView& output = work.entry->outputs[0];
  const DataType dtype = input.dtype();
  const std::size_t count = static_cast<std::size_t>(input.num_elements());
  if (output.data() != input.data() || response.prescale != 1.0) {
    ops::cpu::convert_scale(output.data(), dtype, input.data(), dtype, count, response.prescale);
  }
  const double factor = output_factor(response, backend.size());
  const std::size_t element = element_size(dtype);
  const std::size_t piece = chunk_bytes_ == 0 ? count : std::max<std::size_t>(1, chunk_bytes_ / element);
  auto* data = static_cast<std::byte*>(output.data());
  for (std::size_t done = 0; done < count; done += piece) {
    const std::size_t n = std::min(piece, count - done);
    std::byte* at = data + done * element;
    TUTTI_RETURN_IF_ERROR(backend.allreduce(at, n, dtype, wire_op(response.reduce_op)));
    if (factor != 1.0) ops::cpu::convert_scale(at, dtype, at, dtype, n, factor);
  }
  return Status();
}

Status Executor::allreduce(std::span<Work> batch, ops::Backend& backend) {
  const Response& first = *batch.front().response;
  const DataType wire = wire_dtype(first.tensors.front().dtype, first.reduce_op, first.prescale,
                                   first.postscale);
  if (batch.size() == 1 && first.tensors.size() == 1 && wire == first.tensors.front().dtype) {
    return allreduce_in_place(batch.front(), backend);
  }
  const std::size_t wire_bytes = element_size(wire);
  std::size_t total = 0;
  for (const Work& work : batch) {
    for (const TensorSpec& spec : work.response->tensors) total += count_of(spec);
  }
  std::byte* buffer = buffer_.get(total * wire_bytes);
  std::size_t offset = 0;
  for (const Work& work : batch) {
    for (const TensorView& input : work.entry->inputs) {
      const auto n = static_cast<std::size_t>(input.num_elements());
      ops::cpu::convert_scale(buffer + offset * wire_bytes, wire, input.data(), input.dtype(), n,
                              work.response->prescale);
      offset += n;
    }
  }
  TUTTI_RETURN_IF_ERROR(backend.allreduce(buffer, total, wire, wire_op(first.reduce_op)));
  offset = 0;
  for (const Work& work : batch) {
    const double factor = output_factor(*work.response, backend.size());
    for (const TensorView& output : work.entry->outputs) {
      const auto n = static_cast<std::size_t>(output.num_elements());
      ops::cpu::convert_scale(output.data(), output.dtype(), buffer + offset * wire_bytes, wire, n, factor);
      offset += n;
    }
  }
  return Status();
}

Status Executor::broadcast(Work& work, ops::Backend& backend, int root_set_rank) {
  for (const TensorView& tensor : work.entry->inputs) {
    TUTTI_RETURN_IF_ERROR(backend.broadcast(tensor.data(), static_cast<std::size_t>(tensor.num_elements()),
                                            tensor.dtype(), root_set_rank));
  }
  return Status();
}

Status Executor::allgather(Work& work, ops::Backend& backend) {
  const Response& response = *work.response;
  const auto size = static_cast<std::size_t>(backend.size());
  std::vector<Tensor> outputs;
  for (std::size_t t = 0; t < response.tensors.size(); ++t) {
    const TensorView& input = work.entry->inputs[t];
    const std::int64_t row = input.dim() == 0 ? 1 : num_elements(input.shape()) / std::max<std::int64_t>(1, input.shape()[0]);
    Shape shape = input.shape();
    std::int64_t rows = 0;
    std::vector<std::size_t> counts(size);
    for (std::size_t r = 0; r < size; ++r) {
      const std::int64_t n = response.rows[t * size + r];
      rows += n;
      counts[r] = static_cast<std::size_t>(n * row);
    }
    shape[0] = rows;
    Tensor output(input.dtype(), shape);
    // Rows may be zero on some ranks: element counts come from dims after the first.
    const std::int64_t row_elements = [&] {
      std::int64_t e = 1;
      for (std::size_t d = 1; d < input.shape().size(); ++d) e *= input.shape()[d];
      return e;
    }();
    for (std::size_t r = 0; r < size; ++r) counts[r] = static_cast<std::size_t>(response.rows[t * size + r] * row_elements);
    TUTTI_RETURN_IF_ERROR(backend.allgatherv(input.data(), output.data(), counts, input.dtype()));
    outputs.push_back(std::move(output));
  }
  work.entry->state->output = outputs.front();
  work.entry->state->outputs = std::move(outputs);
  return Status();
}

Status Executor::alltoall(Work&, ops::Backend&) {
  return Status(ErrorCode::Internal, "ALLTOALL is not implemented yet");
}

Status Executor::reducescatter(Work&, ops::Backend&) {
  return Status(ErrorCode::Internal, "REDUCESCATTER is not implemented yet");
}

}  // namespace tutti::core

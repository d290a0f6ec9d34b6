// SPDX-License-Identifier: Apache-2.0
// Fusion keys, allreduce (fused, in place, Adasum), reduce and broadcast.
#include "src/core/execution/executor.h"

#include <algorithm>

#include "src/base/dtype.h"
#include "src/common/check.h"

namespace tutti::core {
namespace {

// The reduction part of a fusion key: a wire op, or Adasum (which must not fuse with Sum).
std::uint64_t reduction_code(ReduceOp op) {
  return op == ReduceOp::Adasum ? 15 : static_cast<std::uint64_t>(wire_op(op));
}

// Packs every tensor of `batch` (of those that travel in `only`, if given) into `buffer` as
// `wire` (prescaled; zeros for a joined rank), tensor after tensor, and returns the element
// counts.
Result<std::vector<std::size_t>> pack(std::span<Work> batch, DataType wire, std::byte* buffer,
                                      Mover& mover, std::optional<DataType> only = {}) {
  const std::size_t wire_bytes = tutti::detail::element_bytes(wire);
  std::vector<std::size_t> counts;
  std::size_t offset = 0;
  for (const Work& work : batch) {
    for (std::size_t t = 0; t < work.response->tensors.size(); ++t) {
      if (!travels_in(*work.response, t, only)) continue;
      const std::size_t n = count_of(work.response->tensors[t]);
      std::byte* at = buffer + offset * wire_bytes;
      if (work.entry == nullptr) {
        TUTTI_RETURN_IF_ERROR(mover.zero(at, n * wire_bytes));  // A joined rank adds zeros.
      } else {
        const TensorView& input = work.entry->inputs[t];
        mover.copy(copy_of(at, wire, input.data(), input.dtype(), n, work.response->prescale));
      }
      counts.push_back(n);
      offset += n;
    }
  }
  TUTTI_RETURN_IF_ERROR(mover.flush());
  return counts;
}

// The inverse of pack: every output (that travels in `only`) from `buffer`, times
// `factor(response)`.
template <class Factor>
Status unpack(std::span<Work> batch, DataType wire, const std::byte* buffer, Mover& mover,
              Factor factor, std::optional<DataType> only = {}) {
  const std::size_t wire_bytes = tutti::detail::element_bytes(wire);
  std::size_t offset = 0;
  for (const Work& work : batch) {
    const double f = factor(*work.response);
    for (std::size_t t = 0; t < work.response->tensors.size(); ++t) {
      if (!travels_in(*work.response, t, only)) continue;
      const std::size_t n = count_of(work.response->tensors[t]);
      if (work.entry != nullptr) {
        const TensorView& output = work.entry->output(t);
        mover.copy(
            copy_of(output.data(), output.dtype(), buffer + offset * wire_bytes, wire, n, f));
      }
      offset += n;
    }
  }
  return mover.flush();
}

}  // namespace

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

std::uint64_t fusion_key(const Response& response) {
  if (response.tensors.empty()) return 0;
  const DataType first = response.tensors.front().dtype;
  std::uint64_t dtype = 0;
  std::uint64_t reduction = 0;
  switch (response.op) {
    case Collective::Allreduce:
    case Collective::Reducescatter:
    case Collective::Reduce:  // The root is the planner's part of the key (FusionItem::root).
      dtype = static_cast<std::uint64_t>(
          wire_dtype(first, response.reduce_op, response.prescale, response.postscale));
      reduction = reduction_code(response.reduce_op);
      break;
    case Collective::Allgather:
    case Collective::Gather: dtype = static_cast<std::uint64_t>(first); break;
    // One collective each: broadcast, alltoall and scatter carry per-op roots and splits, the
    // rest move no tensor data.
    case Collective::Broadcast:
    case Collective::Alltoall:
    case Collective::Scatter:
    case Collective::Barrier:
    case Collective::Join:
    case Collective::AddProcessSet:
    case Collective::RemoveProcessSet: return 0;
  }
  return 1 + (static_cast<std::uint64_t>(response.process_set_id) << 32) +
         (static_cast<std::uint64_t>(response.op) << 24) + (dtype << 16) + (reduction << 8) +
         static_cast<std::uint64_t>(response.device);
}

std::size_t fusion_bytes(const Response& response) {
  std::size_t bytes = 0;
  if (response.op == Collective::Allgather || response.op == Collective::Gather) {
    // The gathered output: every rank's rows.
    const std::size_t size =
        response.rows.size() / std::max<std::size_t>(1, response.tensors.size());
    for (std::size_t t = 0; t < response.tensors.size(); ++t) {
      const TensorSpec& spec = response.tensors[t];
      for (std::size_t r = 0; r < size; ++r) {
        bytes += static_cast<std::size_t>(response.rows[t * size + r]) * row_count(spec) *
                 tutti::detail::element_bytes(spec.dtype);
      }
    }
    return bytes;
  }
  for (const TensorSpec& spec : response.tensors) {
    bytes += count_of(spec) *
             tutti::detail::element_bytes(
                 wire_dtype(spec.dtype, response.reduce_op, response.prescale, response.postscale));
  }
  return bytes;
}

WireBatch wire_batch(std::span<const Work> batch) {
  const Response& first = *batch.front().response;
  WireBatch result{
      .wire =
          wire_dtype(first.tensors.front().dtype, first.reduce_op, first.prescale, first.postscale),
  };
  for (const Work& work : batch) {
    const Response& r = *work.response;
    for (const TensorSpec& spec : r.tensors) {
      if (wire_dtype(spec.dtype, r.reduce_op, r.prescale, r.postscale) == result.wire) {
        result.count += count_of(spec);
      } else {
        result.mixed = true;
      }
    }
  }
  return result;
}

std::vector<DataType> wire_dtypes(std::span<const Work> batch) {
  std::vector<DataType> wires;
  for (const Work& work : batch) {
    const Response& r = *work.response;
    for (const TensorSpec& spec : r.tensors) {
      const DataType wire = wire_dtype(spec.dtype, r.reduce_op, r.prescale, r.postscale);
      if (std::find(wires.begin(), wires.end(), wire) == wires.end()) wires.push_back(wire);
    }
  }
  return wires;
}

std::size_t wire_count(std::span<const Work> batch, DataType wire) {
  std::size_t count = 0;
  for (const Work& work : batch) {
    for (std::size_t t = 0; t < work.response->tensors.size(); ++t) {
      if (travels_in(*work.response, t, wire)) count += count_of(work.response->tensors[t]);
    }
  }
  return count;
}

double output_factor(const Response& response, int size) {
  return response.reduce_op == ReduceOp::Average ? response.postscale / size : response.postscale;
}

namespace {

// One tensor of this rank's (not a joined rank's zeros) that travels in its own dtype: it can be
// reduced in its output, with no fusion buffer.
bool lone_in_wire_dtype(std::span<const Work> batch, DataType wire) {
  const Response& first = *batch.front().response;
  return batch.size() == 1 && first.tensors.size() == 1 && wire == first.tensors.front().dtype &&
         batch.front().entry != nullptr;
}

// Queues the copy of a lone tensor's input into its output, prescaled (none where they are the
// same memory and unscaled); returns its element count.
std::size_t prescaled_into_output(const Work& work, Mover& mover) {
  const TensorView& input = work.entry->inputs[0];
  const TensorView& output = work.entry->output(0);
  const std::size_t count = static_cast<std::size_t>(input.num_elements());
  const double prescale = work.response->prescale;
  if (output.data() != input.data() || prescale != 1.0) {
    mover.copy(copy_of(output.data(), input.dtype(), input.data(), input.dtype(), count, prescale));
  }
  return count;
}

}  // namespace

// A lone tensor that needs no conversion is reduced where it lies. On the host in pieces of
// piece_bytes(), each scaled right after its reduction while it is still in cache: packing
// 100 MB would cost two extra passes over memory, a separate scaling pass one.
Status Executor::allreduce_in_place(Work& work, ops::Backend& backend, Mover& mover) {
  const Response& response = *work.response;
  const TensorView& output = work.entry->output(0);
  const DataType dtype = output.dtype();
  const std::size_t count = prescaled_into_output(work, mover);
  const double factor = output_factor(response, backend.size());
  const std::size_t element = tutti::detail::element_bytes(dtype);
  const std::size_t piece =
      mover.piece_bytes() == 0 ? count : std::max<std::size_t>(1, mover.piece_bytes() / element);
  auto* data = static_cast<std::byte*>(output.data());
  for (std::size_t done = 0; done < count; done += piece) {
    const std::size_t n = std::min(piece, count - done);
    std::byte* at = data + done * element;
    TUTTI_RETURN_IF_ERROR(mover.flush());
    TUTTI_RETURN_IF_ERROR(backend.allreduce(at, n, dtype, wire_op(response.reduce_op)));
    if (factor != 1.0) mover.copy(copy_of(at, dtype, at, dtype, n, factor));
  }
  return mover.flush();
}

void Executor::mark(std::span<Work> batch, std::string_view activity) const {
  if (timeline_ == nullptr || !timeline_->enabled()) return;
  for (const Work& work : batch) {
    if (work.entry != nullptr) timeline_->activity_start(work.response->name, activity);
  }
}

Status Executor::allreduce(std::span<Work> batch, ops::Backend& backend, Mover& mover) {
  const Response& first = *batch.front().response;
  if (first.reduce_op == ReduceOp::Adasum) return adasum(batch, backend, mover);
  const WireBatch wires = wire_batch(batch);
  if (!wires.mixed) return allreduce_pass(batch, wires.wire, wires.count, {}, backend, mover);
  for (const DataType wire : wire_dtypes(batch)) {  // Note [Mixed wire dtypes].
    TUTTI_RETURN_IF_ERROR(
        allreduce_pass(batch, wire, wire_count(batch, wire), wire, backend, mover));
  }
  return Status();
}

Status Executor::allreduce_pass(std::span<Work> batch, DataType wire, std::size_t total,
                                std::optional<DataType> only, ops::Backend& backend, Mover& mover) {
  if (backend.reduces_tensors(total * tutti::detail::element_bytes(wire))) {
    mark(batch, "ALLREDUCE");
    return allreduce_tensors(batch, wire, only, backend);
  }
  if (lone_in_wire_dtype(batch, wire)) {
    mark(batch, "ALLREDUCE");
    return allreduce_in_place(batch.front(), backend, mover);
  }
  mark(batch, "FUSION_PACK");
  TUTTI_ASSIGN_OR_RETURN(std::byte * buffer,
                         mover.scratch(total * tutti::detail::element_bytes(wire)));
  TUTTI_RETURN_IF_ERROR(pack(batch, wire, buffer, mover, only).status());
  mark(batch, "ALLREDUCE");
  TUTTI_RETURN_IF_ERROR(
      backend.allreduce(buffer, total, wire, wire_op(batch.front().response->reduce_op)));
  mark(batch, "FUSION_UNPACK");
  const int size = backend.size();
  return unpack(
      batch, wire, buffer, mover,
      [size](const Response& response) { return output_factor(response, size); }, only);
}

// Straight from the inputs into the outputs, the backend converting and scaling on the way (no
// fusion buffer): each tensor's prescale on the way in, its output factor on the way out.
Status Executor::allreduce_tensors(std::span<Work> batch, DataType wire,
                                   std::optional<DataType> only, ops::Backend& backend) {
  std::vector<ops::FusedTensor> tensors;
  tensors.reserve(batch.size());
  for (const Work& work : batch) {
    const Response& response = *work.response;
    const double factor = output_factor(response, backend.size());
    for (std::size_t t = 0; t < response.tensors.size(); ++t) {
      if (!travels_in(response, t, only)) continue;
      ops::FusedTensor tensor{.count = count_of(response.tensors[t])};
      if (work.entry != nullptr) {  // A joined rank adds zeros and keeps nothing.
        const TensorView& input = work.entry->inputs[t];
        const TensorView& output = work.entry->output(t);
        tensor.input = input.data();
        tensor.input_type = input.dtype();
        tensor.prescale = response.prescale;
        tensor.output = output.data();
        tensor.output_type = output.dtype();
        tensor.factor = factor;
      }
      tensors.push_back(tensor);
    }
  }
  return backend.allreduce_tensors(tensors, wire, wire_op(batch.front().response->reduce_op));
}

// Adasum works on the packed batch: its coefficients are per tensor, so the backend gets the
// tensor boundaries. Scale factors apply around it as for Sum.
Status Executor::adasum(std::span<Work> batch, ops::Backend& backend, Mover& mover) {
  const WireBatch wires = wire_batch(batch);
  // One pass for a mix too (its coefficients are over the whole batch): float64 holds every
  // floating dtype, Adasum's only ones.
  const DataType wire = wires.mixed ? DataType::Float64 : wires.wire;
  std::size_t total = wires.count;
  if (wires.mixed) {
    total = 0;
    for (const Work& work : batch)
      for (const TensorSpec& spec : work.response->tensors) total += count_of(spec);
  }
  if (lone_in_wire_dtype(batch, wire)) {
    return adasum_in_place(batch.front(), backend, mover);
  }
  TUTTI_ASSIGN_OR_RETURN(std::byte * buffer,
                         mover.scratch(total * tutti::detail::element_bytes(wire)));
  TUTTI_ASSIGN_OR_RETURN(std::vector<std::size_t> counts, pack(batch, wire, buffer, mover));
  TUTTI_RETURN_IF_ERROR(backend.adasum(buffer, counts, wire));
  return unpack(batch, wire, buffer, mover,
                [](const Response& response) { return response.postscale; });
}

// A lone tensor that needs no conversion is combined in its output: no fusion buffer of its
// size (a 2^31-element float32 Adasum then needs the tensor's 8 GiB per rank and little more).
Status Executor::adasum_in_place(Work& work, ops::Backend& backend, Mover& mover) {
  const Response& response = *work.response;
  const TensorView& output = work.entry->output(0);
  const DataType dtype = output.dtype();
  const std::size_t count = prescaled_into_output(work, mover);
  TUTTI_RETURN_IF_ERROR(mover.flush());
  mark(std::span(&work, 1), "ALLREDUCE");
  TUTTI_RETURN_IF_ERROR(backend.adasum(output.data(), std::span(&count, 1), dtype));
  if (response.postscale != 1.0) {
    mover.copy(copy_of(output.data(), dtype, output.data(), dtype, count, response.postscale));
  }
  return mover.flush();
}

// As allreduce, but only the root receives: the others' tensors are sent and left unchanged,
// so none of their data is ever written (a prescale goes through scratch memory).
Status Executor::reduce(std::span<Work> batch, ops::Backend& backend, Mover& mover,
                        int root_set_rank) {
  const WireBatch wires = wire_batch(batch);
  if (!wires.mixed) {
    return reduce_pass(batch, wires.wire, wires.count, {}, backend, mover, root_set_rank);
  }
  for (const DataType wire : wire_dtypes(batch)) {  // Note [Mixed wire dtypes].
    TUTTI_RETURN_IF_ERROR(
        reduce_pass(batch, wire, wire_count(batch, wire), wire, backend, mover, root_set_rank));
  }
  return Status();
}

Status Executor::reduce_pass(std::span<Work> batch, DataType wire, std::size_t total,
                             std::optional<DataType> only, ops::Backend& backend, Mover& mover,
                             int root_set_rank) {
  const Response& first = *batch.front().response;
  const bool is_root = backend.rank() == root_set_rank;
  const ops::WireOp op = wire_op(first.reduce_op);
  if (backend.reduces_tensors(total * tutti::detail::element_bytes(wire))) {
    std::vector<ops::FusedTensor> tensors;
    for (const Work& work : batch) {
      const Response& response = *work.response;
      for (std::size_t t = 0; t < response.tensors.size(); ++t) {
        if (!travels_in(response, t, only)) continue;
        ops::FusedTensor tensor{.count = count_of(response.tensors[t])};
        if (work.entry != nullptr) {  // A joined rank adds zeros; it is never the root.
          const TensorView& input = work.entry->inputs[t];
          tensor.input = input.data();
          tensor.input_type = input.dtype();
          tensor.prescale = response.prescale;
          if (is_root) {
            tensor.output = work.entry->output(t).data();
            tensor.output_type = work.entry->output(t).dtype();
            tensor.factor = output_factor(response, backend.size());
          }
        }
        tensors.push_back(tensor);
      }
    }
    mark(batch, "REDUCE");
    return backend.reduce_tensors(tensors, wire, op, root_set_rank);
  }
  if (lone_in_wire_dtype(batch, wire)) {
    mark(batch, "REDUCE");
    return reduce_in_place(batch.front(), backend, mover, root_set_rank);
  }
  mark(batch, "FUSION_PACK");
  TUTTI_ASSIGN_OR_RETURN(std::byte * buffer,
                         mover.scratch(total * tutti::detail::element_bytes(wire)));
  TUTTI_RETURN_IF_ERROR(pack(batch, wire, buffer, mover, only).status());
  mark(batch, "REDUCE");
  TUTTI_RETURN_IF_ERROR(backend.reduce(buffer, buffer, total, wire, op, root_set_rank));
  if (!is_root) return Status();
  mark(batch, "FUSION_UNPACK");
  const int size = backend.size();
  return unpack(
      batch, wire, buffer, mover,
      [size](const Response& response) { return output_factor(response, size); }, only);
}

// A lone tensor that needs no conversion: the root reduces into it where it lies, scaling each
// piece while it is in cache (as allreduce_in_place); the others send it as it is, or, to
// prescale it, piece by piece through scratch memory. Every rank cuts the same pieces, so the
// backend's calls match.
Status Executor::reduce_in_place(Work& work, ops::Backend& backend, Mover& mover, int root) {
  const Response& response = *work.response;
  const TensorView& tensor = work.entry->inputs[0];
  const DataType dtype = tensor.dtype();
  const std::size_t count = static_cast<std::size_t>(tensor.num_elements());
  const std::size_t element = tutti::detail::element_bytes(dtype);
  const std::size_t piece =
      mover.piece_bytes() == 0 ? count : std::max<std::size_t>(1, mover.piece_bytes() / element);
  const ops::WireOp op = wire_op(response.reduce_op);
  auto* data = static_cast<std::byte*>(tensor.data());
  if (backend.rank() == root) {
    if (response.prescale != 1.0)
      mover.copy(copy_of(data, dtype, data, dtype, count, response.prescale));
    const double factor = output_factor(response, backend.size());
    for (std::size_t done = 0; done < count; done += piece) {
      const std::size_t n = std::min(piece, count - done);
      std::byte* at = data + done * element;
      TUTTI_RETURN_IF_ERROR(mover.flush());
      TUTTI_RETURN_IF_ERROR(backend.reduce(at, at, n, dtype, op, root));
      if (factor != 1.0) mover.copy(copy_of(at, dtype, at, dtype, n, factor));
    }
    return mover.flush();
  }
  std::byte* scaled = nullptr;
  if (response.prescale != 1.0) {
    TUTTI_ASSIGN_OR_RETURN(scaled, mover.scratch(std::min(piece, count) * element));
  }
  for (std::size_t done = 0; done < count; done += piece) {
    const std::size_t n = std::min(piece, count - done);
    const std::byte* at = data + done * element;
    if (scaled != nullptr) {
      mover.copy(copy_of(scaled, dtype, at, dtype, n, response.prescale));
      at = scaled;
    }
    TUTTI_RETURN_IF_ERROR(mover.flush());
    TUTTI_RETURN_IF_ERROR(backend.reduce(at, nullptr, n, dtype, op, root));
  }
  return mover.flush();
}

Status Executor::broadcast(Work& work, ops::Backend& backend, Mover& mover, int root_set_rank) {
  const Response& response = *work.response;
  for (std::size_t t = 0; t < response.tensors.size(); ++t) {
    const TensorSpec& spec = response.tensors[t];
    const std::size_t count = count_of(spec);
    // A joined member (never the root: the coordinator refuses that) receives into scratch.
    void* data = work.entry != nullptr ? work.entry->inputs[t].data() : nullptr;
    if (data == nullptr) {
      TUTTI_ASSIGN_OR_RETURN(data, mover.scratch(count * tutti::detail::element_bytes(spec.dtype)));
    }
    TUTTI_RETURN_IF_ERROR(backend.broadcast(data, count, spec.dtype, root_set_rank));
  }
  return Status();
}

}  // namespace tutti::core

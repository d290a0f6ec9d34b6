// SPDX-License-Identifier: Apache-2.0
// API.md's collectives: argument checks on the caller's thread (InvalidArgument before
// anything is queued), then an Entry on the session's queue and a Handle.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <numeric>
#include <optional>
#include <span>

#include "ops/device_ops.h"
#include "ops/registry.h"
#include "src/common/strings.h"
#include "src/common/throw.h"
#include "src/core/op_state.h"
#include "src/core/own_ops.h"
#include "src/core/runtime.h"
#include "tutti/collectives.h"
#include "tutti/serialize.h"

namespace tutti {
namespace {

using core::Collective;
using detail::str_cat;

constexpr std::string_view kReservedPrefix = "tutti.";

[[noreturn]] void invalid(const std::string& message) { detail::throw_invalid_argument(message); }

// The op being built: session, set and entry, with the checks every op shares.
struct Submission {
  std::shared_ptr<core::Session> session;
  core::SetInfo set;
  std::shared_ptr<core::Entry> entry = core::make_entry();  // One allocation with its OpState.

  // `own` is true only for Tutti's own ops, which may use the reserved "tutti." names.
  Submission(Collective op, std::string name, int process_set_id, bool own = false) {
    session = core::Runtime::get().session_for_op().value_or_throw();
    set = session->process_set(process_set_id).value_or_throw();
    if (!set.includes_me()) {
      invalid(str_cat(to_string(op), " on process set ", process_set_id,
                      " which does not include rank ", session->topology().rank));
    }
    // Names of Tutti's own ops (join, process-set changes) must not be taken for a user's:
    // a user op named "tutti.join" would complete another rank's join.
    if (!own && name.starts_with(kReservedPrefix)) {
      invalid(str_cat(to_string(op), " '", name, "': names starting with \"", kReservedPrefix,
                      "\" are reserved for Tutti's own ops"));
    }
    entry->request.op = op;
    entry->request.name = std::move(name);
    entry->request.process_set_id = process_set_id;
  }

  // By value: a caller done with its views moves them in (a view's shape is a heap vector).
  void add(TensorView input, TensorView output) {
    core::Request& request = entry->request;
    if (!entry->inputs.empty() && input.device().kind != request.device) {
      invalid(str_cat(to_string(request.op), " '", request.name, "' mixes CPU and CUDA tensors"));
    }
    if (input.device().kind == Device::Kind::CUDA) check_device(input.device());
    request.device = input.device().kind;
    request.tensors.push_back(core::TensorSpec{.dtype = input.dtype(), .shape = input.shape()});
    entry->inputs.push_back(std::move(input));
    entry->outputs.push_back(std::move(output));
  }
  void reserve(std::size_t tensors) {
    entry->request.tensors.reserve(tensors);
    entry->inputs.reserve(tensors);
    entry->outputs.reserve(tensors);
  }

  // A CUDA device this process sees, and the one this rank's other ops use.
  void check_device(Device device) {
    const core::Request& request = entry->request;
    const int devices = ops::device_ops().device_count();
    if (devices == 0) {
      invalid(str_cat(to_string(request.op), " '", request.name, "': a cuda:", device.index,
                      " tensor, but ",
                      ops::built_with_cuda() ? "no CUDA device is visible"
                                             : "this Tutti was built without CUDA "
                                               "(meson setup -Dcuda=enabled)"));
    }
    if (device.index < 0 || device.index >= devices) {
      invalid(str_cat(to_string(request.op), " '", request.name, "': a cuda:", device.index,
                      " tensor, but this process sees ", devices, " CUDA device(s)"));
    }
    const Status claimed = session->claim_device(device);
    if (!claimed.ok()) {
      invalid(str_cat(to_string(request.op), " '", request.name, "': ", claimed.message()));
    }
  }

  Handle submit() { return detail::HandleAccess::make(submit_state()); }

  // As submit(), for callers that read the state's other results (join's rank).
  std::shared_ptr<detail::OpState> submit_state() {
    detail::OpResults& results = entry->state->results;
    results.scratch = std::move(scratch);
    results.drop_output = drop_output;
    results.output_row_dims = std::move(row_dims);
    entry->submitted = std::chrono::steady_clock::now();
    std::shared_ptr<detail::OpState> state = core::handle_state(entry);
    session->submit(std::move(entry)).throw_if_error();
    return state;
  }

  const std::string& name() const { return entry->request.name; }
  int set_size() const { return set.size(); }

  // Rooted ops on a rank other than the root: reduce's scratch output, kept alive with the op,
  // and gather's "output() stays empty" (see Note [Completion]).
  Tensor scratch;
  bool drop_output = false;
  std::optional<Shape> row_dims;  // scatter: see OpResults::output_row_dims.
};

void check_reduce(const std::string& name, const TensorView& tensor, const ReduceOptions& options,
                  Collective op) {
  const DataType dtype = tensor.dtype();
  if (dtype == DataType::Bool && options.op != ReduceOp::Min && options.op != ReduceOp::Max) {
    invalid(str_cat(to_string(op), " '", name, "': bool tensors reduce only with MIN or MAX, not ",
                    to_string(options.op)));
  }
  if (options.op == ReduceOp::Adasum && !is_floating(dtype)) {
    invalid(str_cat(to_string(op), " '", name, "': ADASUM needs a floating-point tensor, not ",
                    to_string(dtype)));
  }
  if (!std::isfinite(options.prescale_factor) || !std::isfinite(options.postscale_factor)) {
    invalid(str_cat(to_string(op), " '", name, "': scale factors must be finite"));
  }
}

// `root`: -1 for an allreduce; reduce()'s global root rank otherwise (negotiated, so that
// ranks disagreeing on it get Mismatch). `scratch` is kept alive with the op. `outputs` empty:
// in place. The views are moved into the op.
Handle allreduce_impl(std::span<TensorView> inputs, std::span<TensorView> outputs, std::string name,
                      const ReduceOptions& options, bool grouped, int root = -1,
                      Tensor scratch = {}) {
  Submission submission(Collective::Allreduce, std::move(name), options.process_set.id());
  if (grouped && inputs.empty()) invalid("grouped_allreduce_async needs at least one tensor");
  submission.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    TensorView& input = inputs[i];
    check_reduce(submission.entry->request.name, input, options, Collective::Allreduce);
    if (outputs.empty()) {
      TensorView output = input;
      submission.add(std::move(input), std::move(output));
      continue;
    }
    TensorView& output = outputs[i];
    if (output.dtype() != input.dtype() || output.num_elements() != input.num_elements() ||
        output.device() != input.device()) {
      invalid(str_cat("ALLREDUCE '", submission.entry->request.name, "': output ",
                      to_string(output.dtype()), detail::shape_string(output.shape()),
                      " does not match input ", to_string(input.dtype()),
                      detail::shape_string(input.shape())));
    }
    submission.add(std::move(input), std::move(output));
  }
  if (options.op == ReduceOp::Adasum && submission.entry->request.device == Device::Kind::CUDA) {
    invalid(str_cat("ALLREDUCE '", submission.name(),
                    "': ADASUM of CUDA tensors is not supported (NCCL has no such reduction); "
                    "reduce a CPU copy"));
  }
  if (options.op == ReduceOp::Adasum) {
    // The CPU algorithm halves the vector log2(size) times (ops/mpi/adasum.h).
    const int size = submission.set_size();
    if ((size & (size - 1)) != 0) {
      invalid(str_cat("ALLREDUCE '", submission.name(),
                      "': ADASUM on CPU needs a power-of-two set size; process set ",
                      options.process_set.id(), " has ", size, " ranks"));
    }
  }
  core::Request& request = submission.entry->request;
  request.reduce_op = options.op;
  request.prescale = options.prescale_factor;
  request.postscale = options.postscale_factor;
  request.root_rank = root;
  submission.scratch = std::move(scratch);
  return submission.submit();
}

Handle reducescatter_impl(const std::vector<TensorView>& inputs, std::string name,
                          const ReduceOptions& options, bool grouped) {
  Submission submission(Collective::Reducescatter, std::move(name), options.process_set.id());
  if (grouped && inputs.empty()) invalid("grouped_reducescatter_async needs at least one tensor");
  if (options.op != ReduceOp::Sum && options.op != ReduceOp::Average) {
    invalid(str_cat("REDUCESCATTER '", submission.name(), "': op must be SUM or AVERAGE, not ",
                    to_string(options.op)));
  }
  for (const TensorView& input : inputs) {
    check_reduce(submission.name(), input, options, Collective::Reducescatter);
    if (input.dim() == 0)
      invalid(str_cat("REDUCESCATTER '", submission.name(), "' of a 0-d tensor"));
    submission.add(input, input);
  }
  core::Request& request = submission.entry->request;
  request.reduce_op = options.op;
  request.prescale = options.prescale_factor;
  request.postscale = options.postscale_factor;
  return submission.submit();
}

}  // namespace

Handle::Handle(std::shared_ptr<detail::OpState> state) : state_(std::move(state)) {}

bool Handle::poll() const { return state_ == nullptr || state_->done(); }

void Handle::await() const {
  if (state_ == nullptr) invalid("this Handle refers to no op (it was default-constructed)");
  state_->wait().throw_if_error();
}

void Handle::wait() { await(); }

const Tensor& Handle::output() const {
  await();
  return state_->results.output;
}

int Handle::source() const {
  await();
  return state_->results.source;
}

const std::vector<Tensor>& Handle::outputs() const {
  await();
  return state_->results.outputs;
}

const std::vector<std::int64_t>& Handle::received_splits() const {
  await();
  return state_->results.received_splits;
}

bool poll(const Handle& h) { return h.poll(); }
void synchronize(Handle& h) { h.wait(); }

void wait_all(std::vector<Handle>& handles) {
  std::exception_ptr first_error;
  for (Handle& handle : handles) {
    try {
      handle.wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Average: return "AVERAGE";
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::Product: return "PRODUCT";
    case ReduceOp::Adasum: return "ADASUM";
  }
  return "UNKNOWN";
}

Handle allreduce_async(TensorView tensor, std::string name, ReduceOptions options) {
  return allreduce_impl({&tensor, 1}, {}, std::move(name), options, false);
}

Handle allreduce_async(TensorView input, TensorView output, std::string name,
                       ReduceOptions options) {
  return allreduce_impl({&input, 1}, {&output, 1}, std::move(name), options, false);
}

Handle grouped_allreduce_async(std::vector<TensorView> tensors, std::string name,
                               ReduceOptions options) {
  return allreduce_impl(tensors, {}, std::move(name), options, true);
}

Handle allgather_async(TensorView input, std::string name, ProcessSet set) {
  return grouped_allgather_async({input}, std::move(name), set);
}

Handle grouped_allgather_async(std::vector<TensorView> inputs, std::string name, ProcessSet set) {
  Submission submission(Collective::Allgather, std::move(name), set.id());
  if (inputs.empty()) invalid("grouped_allgather_async needs at least one tensor");
  for (const TensorView& input : inputs) {
    if (input.dim() == 0)
      invalid(str_cat("ALLGATHER '", submission.entry->request.name, "' of a 0-d tensor"));
    submission.add(input, input);
  }
  return submission.submit();
}

Handle broadcast_impl(TensorView tensor, int root_rank, std::string name, ProcessSet set,
                      bool own) {
  Submission submission(Collective::Broadcast, std::move(name), set.id(), own);
  const std::vector<int>& ranks = *submission.set.ranks;
  if (submission.set.set_rank_of(root_rank) < 0) {
    invalid(str_cat("BROADCAST '", submission.entry->request.name, "': root rank ", root_rank,
                    " is not in process set ", set.id(), " (ranks ", detail::join_list(ranks),
                    ")"));
  }
  submission.entry->request.root_rank = root_rank;
  submission.add(tensor, tensor);
  return submission.submit();
}

Handle broadcast_async(TensorView tensor, int root_rank, std::string name, ProcessSet set) {
  return broadcast_impl(tensor, root_rank, std::move(name), set, false);
}

Handle alltoall_async(TensorView input, std::vector<std::int64_t> splits, std::string name,
                      ProcessSet set) {
  Submission submission(Collective::Alltoall, std::move(name), set.id());
  const std::string& op_name = submission.name();
  if (input.dim() == 0) invalid(str_cat("ALLTOALL '", op_name, "' of a 0-d tensor"));
  const std::int64_t rows = input.shape()[0];
  const int size = submission.set_size();
  if (splits.empty()) {
    if (rows % size != 0) {
      invalid(str_cat("ALLTOALL '", op_name, "': dim 0 (", rows,
                      ") is not divisible by the set size (", size, ") for equal splits"));
    }
    splits.assign(static_cast<std::size_t>(size), rows / size);
  }
  if (splits.size() != static_cast<std::size_t>(size)) {
    invalid(str_cat("ALLTOALL '", op_name, "': ", splits.size(), " splits for a set of ", size,
                    " ranks"));
  }
  std::int64_t sum = 0;
  for (std::int64_t split : splits) {
    if (split < 0)
      invalid(str_cat("ALLTOALL '", op_name, "': negative split ", split, " in ",
                      detail::shape_string(splits)));
    sum += split;
  }
  if (sum > rows) {
    invalid(str_cat("ALLTOALL '", op_name, "': splits ", detail::shape_string(splits),
                    " add up to ", sum, " rows, more than dim 0 (", rows, ")"));
  }
  submission.entry->request.splits = std::move(splits);
  submission.add(input, input);
  return submission.submit();
}

Handle reducescatter_async(TensorView input, std::string name, ReduceOptions options) {
  return reducescatter_impl({input}, std::move(name), options, false);
}

Handle grouped_reducescatter_async(std::vector<TensorView> inputs, std::string name,
                                   ReduceOptions options) {
  return reducescatter_impl(inputs, std::move(name), options, true);
}

void allreduce(TensorView tensor, std::string name, ReduceOptions options) {
  allreduce_async(tensor, std::move(name), options).wait();
}

void grouped_allreduce(std::vector<TensorView> tensors, std::string name, ReduceOptions options) {
  grouped_allreduce_async(std::move(tensors), std::move(name), options).wait();
}

Tensor allgather(TensorView input, std::string name, ProcessSet set) {
  Handle h = allgather_async(input, std::move(name), set);
  h.wait();
  return h.output();
}

void broadcast(TensorView tensor, int root_rank, std::string name, ProcessSet set) {
  broadcast_async(tensor, root_rank, std::move(name), set).wait();
}

AlltoallResult alltoall(TensorView input, std::vector<std::int64_t> splits, std::string name,
                        ProcessSet set) {
  Handle h = alltoall_async(input, std::move(splits), std::move(name), set);
  h.wait();
  return AlltoallResult{.output = h.output(), .received_splits = h.received_splits()};
}

Tensor reducescatter(TensorView input, std::string name, ReduceOptions options) {
  Handle h = reducescatter_async(input, std::move(name), options);
  h.wait();
  return h.output();
}

void barrier(ProcessSet set) {
  Submission submission(Collective::Barrier, {}, set.id());
  submission.submit().wait();
}

int join(ProcessSet set) {
  // One fixed name: a rank has at most one join in flight per set, and the coordinator finds
  // the joins of all members under it (see Note [Join] in src/core/controller.h).
  Submission submission(Collective::Join, std::string(core::kJoinName), set.id(), true);
  std::shared_ptr<detail::OpState> state = submission.submit_state();
  state->wait().throw_if_error();
  return state->results.last_joined_rank;
}

namespace {

std::string broadcast_bytes(std::string_view bytes, int root_rank, const std::string& name,
                            ProcessSet set, bool own) {
  std::int64_t length = static_cast<std::int64_t>(bytes.size());
  broadcast_impl(TensorView(&length, {1}), root_rank, name + ".size", set, own).wait();
  std::string result(bytes);
  result.resize(static_cast<std::size_t>(length));
  broadcast_impl(TensorView(result.data(), DataType::UInt8, {length}), root_rank, name + ".bytes",
                 set, own)
      .wait();
  return result;
}

}  // namespace

std::string broadcast_object(std::string_view bytes, int root_rank, std::string name,
                             ProcessSet set) {
  if (name.empty()) name = "broadcast_object.noname";
  return broadcast_bytes(bytes, root_rank, name, set, false);
}

namespace core {

std::string broadcast_own(std::string_view bytes, int root_rank, const std::string& name,
                          ProcessSet set) {
  return broadcast_bytes(bytes, root_rank, name, set, true);
}

}  // namespace core

namespace {

std::vector<std::string> allgather_bytes(std::string_view bytes, const std::string& name,
                                         ProcessSet set, bool own) {
  auto gather = [&](TensorView input, const std::string& part) {
    Submission submission(Collective::Allgather, name + part, set.id(), own);
    submission.add(input, input);
    Handle handle = submission.submit();
    handle.wait();
    return handle.output();
  };
  std::int64_t length = static_cast<std::int64_t>(bytes.size());
  const Tensor lengths = gather(TensorView(&length, {1}), ".sizes");
  std::string copy(bytes);
  const Tensor all = gather(TensorView(copy.data(), DataType::UInt8, {length}), ".bytes");
  std::vector<std::string> result;
  const char* at = static_cast<const char*>(all.data());
  for (std::int64_t n : lengths.span<std::int64_t>()) {
    result.emplace_back(at, static_cast<std::size_t>(n));
    at += n;
  }
  return result;
}

}  // namespace

std::vector<std::string> allgather_object(std::string_view bytes, std::string name,
                                          ProcessSet set) {
  if (name.empty()) name = "allgather_object.noname";
  return allgather_bytes(bytes, name, set, false);
}

namespace core {

std::vector<std::string> allgather_own(std::string_view bytes, const std::string& name) {
  return allgather_bytes(bytes, name, ProcessSet::global(), true);
}

}  // namespace core

// Rooted collectives (API.md "Rooted collectives"), built on the negotiated allreduce, allgather
// and alltoall: they inherit validation, Mismatch, the cache, fusion, join rules, process sets,
// the timeline and the device paths. The root is negotiated (Request::root_rank), so ranks that
// disagree on it get Mismatch. The cost is that of the underlying op: reduce moves an
// allreduce's bytes and gather an allgather's, not the (n-1)/n less a true rooted algorithm
// would.
namespace {

void check_root(const char* op, const std::string& name, int root_rank, const ProcessSet& set) {
  const std::vector<int>& ranks = set.ranks();
  if (std::find(ranks.begin(), ranks.end(), root_rank) == ranks.end()) {
    invalid(str_cat(op, " '", name, "': root rank ", root_rank, " is not in process set ", set.id(),
                    " (ranks ", detail::join_list(ranks), ")"));
  }
}

// Names of unnamed scatters, which need one before their metadata travels.
std::atomic<std::int64_t> g_unnamed_scatters{0};

}  // namespace

Handle reduce_async(TensorView tensor, int root_rank, std::string name, ReduceOptions options) {
  check_root("REDUCE", name, root_rank, options.process_set);
  if (options.op == ReduceOp::Adasum) {
    invalid(str_cat("REDUCE '", name, "': ADASUM has no rooted form; use allreduce"));
  }
  const int global_rank = core::Runtime::get().session_for_op().value_or_throw()->topology().rank;
  if (global_rank == root_rank) {
    return allreduce_impl({&tensor, 1}, {}, std::move(name), options, false, root_rank);
  }
  // Elsewhere the result goes to scratch memory, so the caller's tensor stays unchanged.
  Tensor scratch(tensor.dtype(), tensor.shape(), tensor.device());
  TensorView out = scratch.view();
  return allreduce_impl({&tensor, 1}, {&out, 1}, std::move(name), options, false, root_rank,
                        std::move(scratch));
}

Handle gather_async(TensorView input, int root_rank, std::string name, ProcessSet set) {
  check_root("GATHER", name, root_rank, set);
  Submission submission(Collective::Allgather, std::move(name), set.id());
  if (input.dim() == 0) invalid(str_cat("GATHER '", submission.name(), "' of a 0-d tensor"));
  submission.entry->request.root_rank = root_rank;
  submission.drop_output = submission.session->topology().rank != root_rank;
  submission.add(input, input);
  return submission.submit();
}

Handle scatter_async(TensorView input, int root_rank, std::vector<std::int64_t> splits,
                     std::string name, ProcessSet set) {
  check_root("SCATTER", name, root_rank, set);
  if (name.empty()) name = str_cat("scatter.noname.", g_unnamed_scatters.fetch_add(1));
  const bool is_root =
      core::Runtime::get().session_for_op().value_or_throw()->topology().rank == root_rank;
  const int size = static_cast<int>(set.ranks().size());
  // Only the root knows the shape and splits: they travel first (a blocking broadcast), as
  // does an error in them, so that no rank waits for an alltoall the root will not submit.
  std::string metadata;
  if (is_root) {
    std::string error;
    if (input.dim() == 0) error = str_cat("SCATTER '", name, "' of a 0-d tensor");
    const std::int64_t rows = input.dim() == 0 ? 0 : input.shape()[0];
    if (error.empty() && splits.empty()) {
      if (rows % size != 0) {
        error = str_cat("SCATTER '", name, "': dim 0 (", rows,
                        ") is not divisible by the set size (", size, ") for equal splits");
      }
      splits.assign(static_cast<std::size_t>(size), rows / size);
    }
    std::int64_t sum = 0;
    bool negative = false;
    for (std::int64_t split : splits) {
      negative = negative || split < 0;
      sum += split;
    }
    if (error.empty() &&
        (splits.size() != static_cast<std::size_t>(size) || negative || sum > rows)) {
      error = str_cat("SCATTER '", name, "': splits ", detail::shape_string(splits), " are not ",
                      size, " non-negative row counts adding up to at most ", rows);
    }
    ByteWriter w;
    w.put<std::uint8_t>(error.empty() ? 1 : 0);
    if (!error.empty()) {
      w.put_string(error);
    } else {
      w.put_vector(Shape(input.shape().begin() + 1, input.shape().end()));
      w.put_vector(splits);
    }
    metadata = w.take();
  }
  metadata = core::broadcast_own(metadata, root_rank, "tutti.scatter." + name, set);
  ByteReader r(metadata);
  std::uint8_t ok = 0;
  Shape row_dims;
  std::vector<std::int64_t> root_splits;
  std::string error;
  if (!r.get(&ok)) invalid(str_cat("SCATTER '", name, "': no metadata from the root"));
  if (ok == 0) {
    r.get_string(&error);
    invalid(error);
  }
  r.get_vector(&row_dims);
  r.get_vector(&root_splits);
  const std::int64_t row = num_elements(row_dims);
  // The rows travel as a 1-d alltoall of elements: the root sends, the others send nothing;
  // each rank's dtype goes into the negotiation, so a disagreement is Mismatch everywhere.
  Submission submission(Collective::Alltoall, std::move(name), set.id());
  std::vector<std::int64_t> element_splits(static_cast<std::size_t>(size), 0);
  TensorView flat(nullptr, input.dtype(), {0}, input.device());
  if (is_root) {
    for (std::size_t i = 0; i < element_splits.size(); ++i)
      element_splits[i] = root_splits[i] * row;
    flat = TensorView(input.data(), input.dtype(), {input.num_elements()}, input.device());
  }
  submission.entry->request.splits = std::move(element_splits);
  submission.add(flat, flat);
  submission.row_dims = std::move(row_dims);
  return submission.submit();
}

void reduce(TensorView tensor, int root_rank, std::string name, ReduceOptions options) {
  reduce_async(tensor, root_rank, std::move(name), options).wait();
}

Tensor gather(TensorView input, int root_rank, std::string name, ProcessSet set) {
  Handle h = gather_async(input, root_rank, std::move(name), set);
  h.wait();
  return h.output();
}

Tensor scatter(TensorView input, int root_rank, std::vector<std::int64_t> splits, std::string name,
               ProcessSet set) {
  Handle h = scatter_async(input, root_rank, std::move(splits), std::move(name), set);
  h.wait();
  return h.output();
}

}  // namespace tutti

// SPDX-License-Identifier: Apache-2.0
// API.md's collectives: argument checks on the caller's thread (InvalidArgument before
// anything is queued), then an Entry on the session's queue and a Handle.
#include "tutti/collectives.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <span>
#include <string_view>
#include <vector>

#include "ops/device_ops.h"
#include "ops/registry.h"
#include "src/base/strings.h"
#include "src/common/check.h"
#include "src/common/throw.h"
#include "src/core/op_state.h"
#include "src/core/own_ops.h"
#include "src/core/runtime.h"

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

  // `own` is true only for Tutti's own ops, which may use the reserved "tutti." names. `name`
  // is taken by reference, here and by the *_impl functions: a short name lives inside the
  // string, so each move into a by-value parameter would copy it once more (three copies an op).
  Submission(Collective op, std::string&& name, int process_set_id, bool own = false) {
    session = core::Runtime::get().session_for_op().value_or_throw();
    set = process_set_id == 0 ? session->global_set()
                              : session->process_set(process_set_id).value_or_throw();
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
    // Copied in place up to 31 characters (Note [Names in place] in src/base/inline_string.h);
    // a longer name is copied to the heap once more here, the price of the in-place copies
    // after this one.
    entry->request.name = name;
    entry->request.process_set_id = process_set_id;
  }

  // The add*() functions take the views by reference and move them into the entry: a caller
  // done with its views moves them in (a view's shape is a heap vector), and the view is moved
  // once, not once for each call on the way.
  void add(TensorView&& input, TensorView&& output) {
    TUTTI_CHECK(!entry->in_place, "an op mixes in-place and separate outputs");
    add_input(std::move(input));
    detail::TensorViewAccess::drop_shape(output);  // Note [Views kept without their shapes].
    entry->outputs.push_back(std::move(output));
  }
  // A tensor the op writes its result into (Entry::in_place): no copy of the view, whose shape
  // would be one more allocation per op.
  void add_in_place(TensorView&& tensor) {
    TUTTI_CHECK(entry->outputs.empty(), "an op mixes in-place and separate outputs");
    entry->in_place = true;
    add_input(std::move(tensor));
  }
  // A tensor the op reads, whose results core allocates (allgather, alltoall, gather,
  // reducescatter, scatter): no output view.
  void add_input(TensorView&& input) {
    core::Request& request = entry->request;
    if (!entry->inputs.empty() && input.device().kind != request.device) {
      invalid(str_cat(to_string(request.op), " '", request.name, "' mixes CPU and CUDA tensors"));
    }
    if (input.device().kind == Device::Kind::CUDA) check_device(input.device());
    request.device = input.device().kind;
    // Filled in place: a TensorSpec built aside would be moved in, and its dims with it.
    core::TensorSpec& spec = request.tensors.emplace_back();
    spec.dtype = input.dtype();
    spec.shape.assign(input.shape());
    // See Note [Views kept without their shapes] in src/core/tensor_queue.h.
    detail::TensorViewAccess::drop_shape(input);
    entry->inputs.push_back(std::move(input));
  }
  // `outputs`: the op has output views of its own (not in place).
  void reserve(std::size_t tensors, bool outputs) {
    entry->request.tensors.reserve(tensors);
    entry->inputs.reserve(tensors);
    if (outputs) entry->outputs.reserve(tensors);
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
  // No clock read: Entry::submitted stays unset and the flight recorder, the one reader of a
  // collective's, reads the coarse clock (Note [Coarse clock] in src/base/coarse_clock.h).
  std::shared_ptr<detail::OpState> submit_state() {
    std::shared_ptr<detail::OpState> state = core::handle_state(entry);
    session->submit(std::move(entry)).throw_if_error();
    return state;
  }

  std::string_view name() const { return entry->request.name; }
  int set_size() const { return set.size(); }
};

void check_reduce(std::string_view name, const TensorView& tensor, const ReduceOptions& options,
                  Collective op) {
  // An enum class holds any value of its underlying type: an unknown one would reach the
  // coordinator, which takes the request for a corrupt message and stops the job.
  if (options.op > ReduceOp::Adasum) {
    invalid(
        str_cat(to_string(op), " '", name, "': unknown ReduceOp ", static_cast<int>(options.op)));
  }
  const DataType dtype = tensor.dtype();
  // Reducescatter takes only SUM and AVERAGE, which bool does not: no op of it reduces bool,
  // and the advice to use MIN or MAX would only lead to the other refusal.
  if (dtype == DataType::Bool && op == Collective::Reducescatter) {
    invalid(str_cat(to_string(op), " '", name,
                    "': bool tensors cannot be reduce-scattered (REDUCESCATTER takes SUM or "
                    "AVERAGE, bool reduces only with MIN or MAX); convert to an integer type"));
  }
  if (dtype == DataType::Bool && options.op != ReduceOp::Min && options.op != ReduceOp::Max) {
    invalid(str_cat(to_string(op), " '", name, "': bool tensors reduce only with MIN or MAX, not ",
                    to_string(options.op)));
  }
  // A bool scaled would be x * factor != 0: true unless the factor is 0, not the truncation
  // integers get (API.md). No use either way: refused.
  if (dtype == DataType::Bool &&
      (options.prescale_factor != 1.0 || options.postscale_factor != 1.0)) {
    invalid(str_cat(to_string(op), " '", name, "': bool tensors take no scale factors (prescale ",
                    options.prescale_factor, ", postscale ", options.postscale_factor, ")"));
  }
  if (options.op == ReduceOp::Adasum && !is_floating(dtype)) {
    invalid(str_cat(to_string(op), " '", name, "': ADASUM needs a floating-point tensor, not ",
                    to_string(dtype)));
  }
  if (!std::isfinite(options.prescale_factor) || !std::isfinite(options.postscale_factor)) {
    invalid(str_cat(to_string(op), " '", name, "': scale factors must be finite"));
  }
}

// A grouped in-place allreduce writes each of `tensors`: two that share memory (one tensor
// listed twice, overlapping views) would make the result depend on how fusion copies in and out
// (Sum of ones at 2 ranks, one tensor twice: 2 for 4 elements, 4 for 1,000,000). Refused with
// InvalidArgument naming both. Sorted by address: groups of thousands of gradients are common.
void check_group_disjoint(std::string_view name, std::span<const TensorView> tensors) {
  struct Range {
    std::uintptr_t begin;
    std::uintptr_t end;
    std::size_t index;
  };
  // Kept per thread: a training loop groups the same thousands of gradients every step.
  thread_local std::vector<Range> ranges;
  ranges.clear();
  ranges.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].byte_size() == 0) continue;
    // Compared as integers: pointers into different objects have no order in C++.
    const auto begin = reinterpret_cast<std::uintptr_t>(tensors[i].data());
    ranges.push_back({begin, begin + tensors[i].byte_size(), i});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::size_t reach = 0;  // The range reaching furthest among those before.
  for (std::size_t k = 1; k < ranges.size(); ++k) {
    if (ranges[k].begin < ranges[reach].end) {
      const std::size_t a = std::min(ranges[k].index, ranges[reach].index);
      const std::size_t b = std::max(ranges[k].index, ranges[reach].index);
      invalid(str_cat("ALLREDUCE '", name, "': tensors ", name, "[", a, "] and ", name, "[", b,
                      "] overlap (one tensor listed twice, or overlapping views); a grouped "
                      "allreduce writes every tensor, so each needs memory of its own"));
    }
    if (ranges[k].end > ranges[reach].end) reach = k;
  }
}

// `outputs` empty: in place. The views are moved into the op.
Handle allreduce_impl(std::span<TensorView> inputs, std::span<TensorView> outputs,
                      std::string&& name, const ReduceOptions& options, bool grouped) {
  Submission submission(Collective::Allreduce, std::move(name), options.process_set.id());
  if (grouped && inputs.empty()) invalid("grouped_allreduce_async needs at least one tensor");
  if (inputs.size() > 1 && outputs.empty()) {
    check_group_disjoint(submission.entry->request.name, inputs);
  }
  submission.reserve(inputs.size(), /*outputs=*/!outputs.empty());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    TensorView& input = inputs[i];
    check_reduce(submission.entry->request.name, input, options, Collective::Allreduce);
    if (outputs.empty()) {
      submission.add_in_place(std::move(input));
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
    // Overlapping at another address, the result would be computed from inputs it already
    // overwrote (fusion copies in and out in pieces); the same memory is in place, as allowed.
    // Compared as integers: pointers into different objects have no order in C++.
    const auto in_begin = reinterpret_cast<std::uintptr_t>(input.data());
    const auto out_begin = reinterpret_cast<std::uintptr_t>(output.data());
    if (in_begin != out_begin && input.byte_size() > 0 &&
        in_begin < out_begin + output.byte_size() && out_begin < in_begin + input.byte_size()) {
      invalid(str_cat("ALLREDUCE '", submission.entry->request.name,
                      "': output overlaps input at another address; give separate memory, or the "
                      "same tensor for an in-place reduction"));
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
  return submission.submit();
}

// The splits of an alltoall, or of a scatter's root: a 1-d or larger input and `splits`
// (filled in when empty: equal parts) of one non-negative row count per member, adding up to at
// most dim 0.
void check_splits(Collective op, std::string_view name, const TensorView& input,
                  std::vector<std::int64_t>& splits, int size) {
  if (input.dim() == 0) invalid(str_cat(to_string(op), " '", name, "' of a 0-d tensor"));
  const std::int64_t rows = input.shape()[0];
  if (splits.empty()) {
    if (rows % size != 0) {
      invalid(str_cat(to_string(op), " '", name, "': dim 0 (", rows,
                      ") is not divisible by the set size (", size, ") for equal splits"));
    }
    splits.assign(static_cast<std::size_t>(size), rows / size);
  }
  if (splits.size() != static_cast<std::size_t>(size)) {
    invalid(str_cat(to_string(op), " '", name, "': ", splits.size(), " splits for a set of ", size,
                    " ranks"));
  }
  std::int64_t sum = 0;
  for (std::int64_t split : splits) {
    if (split < 0) {
      invalid(str_cat(to_string(op), " '", name, "': negative split ", split, " in ",
                      detail::shape_string(splits)));
    }
    // The sum may pass int64 (two splits of 2^62 and more): that is more rows than any tensor.
    if (__builtin_add_overflow(sum, split, &sum)) {
      invalid(str_cat(to_string(op), " '", name, "': splits ", detail::shape_string(splits),
                      " add up to more than an int64 of rows, more than dim 0 (", rows, ")"));
    }
  }
  if (sum > rows) {
    invalid(str_cat(to_string(op), " '", name, "': splits ", detail::shape_string(splits),
                    " add up to ", sum, " rows, more than dim 0 (", rows, ")"));
  }
}

Handle reducescatter_impl(const std::vector<TensorView>& inputs, std::string&& name,
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
    submission.add_input(TensorView(input));
  }
  core::Request& request = submission.entry->request;
  request.reduce_op = options.op;
  request.prescale = options.prescale_factor;
  request.postscale = options.postscale_factor;
  return submission.submit();
}

}  // namespace

Handle::Handle(std::shared_ptr<detail::OpState> state) : state_(std::move(state)) {}

bool Handle::poll() const { return state_ == nullptr || state_->poll(); }

void Handle::await() const {
  if (state_ == nullptr) invalid("this Handle refers to no op (it was default-constructed)");
  state_->wait().throw_if_error();
}

void Handle::wait() { await(); }

const Tensor& Handle::output() const {
  await();
  return state_->results().output;
}

int Handle::source() const {
  await();
  return state_->results().source;
}

const std::vector<Tensor>& Handle::outputs() const {
  await();
  return state_->results().outputs;
}

const std::vector<std::int64_t>& Handle::received_splits() const {
  await();
  return state_->results().received_splits;
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
  for (TensorView& input : inputs) {
    if (input.dim() == 0)
      invalid(str_cat("ALLGATHER '", submission.entry->request.name, "' of a 0-d tensor"));
    submission.add_input(std::move(input));
  }
  return submission.submit();
}

Handle broadcast_impl(TensorView tensor, int root_rank, std::string&& name, ProcessSet set,
                      bool own) {
  Submission submission(Collective::Broadcast, std::move(name), set.id(), own);
  const std::vector<int>& ranks = *submission.set.ranks;
  if (submission.set.set_rank_of(root_rank) < 0) {
    invalid(str_cat("BROADCAST '", submission.entry->request.name, "': root rank ", root_rank,
                    " is not in process set ", set.id(), " (ranks ", detail::join_list(ranks),
                    ")"));
  }
  submission.entry->request.root_rank = root_rank;
  submission.add_in_place(std::move(tensor));
  return submission.submit();
}

Handle broadcast_async(TensorView tensor, int root_rank, std::string name, ProcessSet set) {
  return broadcast_impl(tensor, root_rank, std::move(name), set, false);
}

Handle alltoall_async(TensorView input, std::vector<std::int64_t> splits, std::string name,
                      ProcessSet set) {
  Submission submission(Collective::Alltoall, std::move(name), set.id());
  check_splits(Collective::Alltoall, submission.name(), input, splits, submission.set_size());
  submission.entry->request.splits = std::move(splits);
  submission.add_input(std::move(input));
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
  // the joins of all members under it (see Note [Join] in src/core/negotiation/coordinator.h).
  Submission submission(Collective::Join, std::string(core::kJoinName), set.id(), true);
  std::shared_ptr<detail::OpState> state = submission.submit_state();
  state->wait().throw_if_error();
  return state->results().last_joined_rank;
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
    submission.add_input(std::move(input));
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

// Rooted collectives (API.md "Rooted collectives" and its third revision's Clarifications):
// ordinary negotiated ops that return at once. Each rank checks its own arguments here (the
// root its shape and splits); the coordinator compares roots, dtypes and shapes (Mismatch on
// every rank, from wait()) and refuses a joined root; the executor runs rooted algorithms, in
// which only the root receives a reduction or gathered rows and only the root sends.
namespace {

void check_root(const Submission& submission, int root_rank, int process_set_id) {
  if (submission.set.set_rank_of(root_rank) < 0) {
    invalid(str_cat(to_string(submission.entry->request.op), " '", submission.name(),
                    "': root rank ", root_rank, " is not in process set ", process_set_id,
                    " (ranks ", detail::join_list(*submission.set.ranks), ")"));
  }
}

}  // namespace

Handle reduce_async(TensorView tensor, int root_rank, std::string name, ReduceOptions options) {
  Submission submission(Collective::Reduce, std::move(name), options.process_set.id());
  check_root(submission, root_rank, options.process_set.id());
  if (options.op == ReduceOp::Adasum) {
    invalid(str_cat("REDUCE '", submission.name(), "': ADASUM has no rooted form; use allreduce"));
  }
  check_reduce(submission.name(), tensor, options, Collective::Reduce);
  core::Request& request = submission.entry->request;
  request.reduce_op = options.op;
  request.prescale = options.prescale_factor;
  request.postscale = options.postscale_factor;
  request.root_rank = root_rank;
  submission.add_in_place(std::move(tensor));  // In place on the root; only read elsewhere.
  return submission.submit();
}

Handle gather_async(TensorView input, int root_rank, std::string name, ProcessSet set) {
  Submission submission(Collective::Gather, std::move(name), set.id());
  check_root(submission, root_rank, set.id());
  if (input.dim() == 0) invalid(str_cat("GATHER '", submission.name(), "' of a 0-d tensor"));
  submission.entry->request.root_rank = root_rank;
  submission.add_input(std::move(input));
  return submission.submit();
}

Handle scatter_async(TensorView input, int root_rank, std::vector<std::int64_t> splits,
                     std::string name, ProcessSet set) {
  Submission submission(Collective::Scatter, std::move(name), set.id());
  check_root(submission, root_rank, set.id());
  submission.entry->request.root_rank = root_rank;
  if (submission.session->topology().rank != root_rank) {
    // API.md: a non-root's data, shape and splits are ignored; its dtype and device are
    // negotiated (an empty view of them stands for it, so its request does not vary).
    submission.add(TensorView(nullptr, input.dtype(), {0}, input.device()), TensorView());
    return submission.submit();
  }
  check_splits(Collective::Scatter, submission.name(), input, splits, submission.set_size());
  submission.entry->request.splits = std::move(splits);
  submission.add_input(std::move(input));
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

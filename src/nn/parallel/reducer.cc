// SPDX-License-Identifier: Apache-2.0
// detail::Reducer: DistributedDataParallel's buckets and the reduction pass of
// Note [DDP reduction passes].
#include "src/nn/parallel/reducer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/base/strings.h"
#include "src/nn/parallel/bucket_assignment.h"
#include "src/nn/parallel/float_convert.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn::detail {
namespace {

DataType wire_type(Compression compression) {
  switch (compression) {
    case Compression::FP16: return DataType::Float16;
    case Compression::BF16: return DataType::BFloat16;
    case Compression::None: break;
  }
  return DataType::Float32;
}

void copy_floats(const Tensor& from, const Tensor& to) {
  if (from.num_elements() > 0) std::memcpy(to.data(), from.data(), to.byte_size());
}

void zero_floats(const Tensor& to) {
  if (to.num_elements() > 0) std::memset(to.data(), 0, to.byte_size());  // 0.0f is all zero bits.
}

}  // namespace

Reducer::Reducer(std::vector<Parameter> parameters, Config config)
    : parameters_(std::move(parameters)), config_(std::move(config)) {
  const std::size_t n = parameters_.size();
  for (std::size_t i = 0; i < n; ++i) {
    bytes_.push_back(parameters_[i].variable.value().num_elements() *
                     static_cast<std::int64_t>(sizeof(float)));
    index_of_.emplace(VariableAccess::impl(parameters_[i].variable).get(), i);
  }
  ready_.assign(n, false);
  reached_.assign(n, false);
  // Reverse registration order: roughly the order backward() finishes the gradients.
  std::vector<std::size_t> order(n);
  std::iota(order.rbegin(), order.rend(), std::size_t{0});
  build_buckets(assign_buckets(order, bytes_, config_.first_cap_bytes, config_.cap_bytes));
}

Reducer::~Reducer() {
  const tutti::detail::MutexLock lock(mutex_);
  // The runtime may still read and write the buckets. Destructors never fail: errors dropped.
  static_cast<void>(wait_all(/*write_results=*/false));
}

void Reducer::register_hooks() {
  const std::weak_ptr<Reducer> weak = weak_from_this();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    parameters_[i].variable.register_grad_hook([weak, i](Variable&) {
      if (const std::shared_ptr<Reducer> reducer = weak.lock()) reducer->on_gradient(i);
    });
  }
}

Tensor Reducer::slice_of(std::size_t index) const {
  const Bucket& bucket = buckets_[bucket_of_[index]];
  return bucket.contents.slice(bucket.offsets[member_of_[index]],
                               parameters_[index].variable.value().shape());
}

// New buckets for `assignment`. With as_view, the gradients' current values move into them and
// grad() becomes their view; the old buckets (no longer in flight) are then dropped.
void Reducer::build_buckets(const std::vector<std::vector<std::size_t>>& assignment) {
  std::vector<Bucket> buckets(assignment.size());
  bucket_of_.assign(parameters_.size(), 0);
  member_of_.assign(parameters_.size(), 0);
  for (std::size_t b = 0; b < assignment.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.members = assignment[b];
    std::int64_t count = 0;
    for (std::size_t m = 0; m < bucket.members.size(); ++m) {
      bucket_of_[bucket.members[m]] = b;
      member_of_[bucket.members[m]] = m;
      bucket.offsets.push_back(count);
      count += bytes_[bucket.members[m]] / static_cast<std::int64_t>(sizeof(float));
    }
    bucket.contents = zeros({count + (b == 0 ? 1 : 0)});  // Bucket 0's join slot.
    bucket.in_place.resize(bucket.members.size());
    if (config_.compression != Compression::None) {
      bucket.wire = Tensor(wire_type(config_.compression), bucket.contents.shape());
    }
  }
  buckets_ = std::move(buckets);
  if (!config_.as_view) return;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    Tensor view = slice_of(i);
    copy_floats(parameters_[i].variable.grad(), view);
    parameters_[i].variable.grad() = std::move(view);
  }
}

bool Reducer::fits_bucket(std::size_t index) const {
  const Tensor& grad = parameters_[index].variable.grad();
  return grad.dtype() == DataType::Float32 && grad.num_elements() > 0 &&
         grad.num_elements() * static_cast<std::int64_t>(sizeof(float)) == bytes_[index];
}

bool Reducer::reduces_in_place() const {
  return hook_.empty() && !config_.as_view && config_.compression == Compression::None;
}

void Reducer::before_forward() {
  const tutti::detail::MutexLock lock(mutex_);
  forwarded_ = true;
  if (pass_active_) abandon_pass();
  if (!broken_.empty()) throw_invalid_argument(broken_);
  replaced_.clear();
  if (!config_.as_view) return;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& grad = parameters_[i].variable.grad();
    Tensor view = slice_of(i);
    if (grad.data() == view.data() && grad.shape() == view.shape()) continue;
    // Replaced by the user (e.g. grad() = some tensor): keep its values, alias the bucket again.
    if (grad.dtype() == DataType::Float32 && grad.num_elements() == view.num_elements()) {
      copy_floats(grad, view);
    } else if (grad.num_elements() > 0 && replaced_.empty()) {
      // Not thrown here: the other members would wait for this rank's buckets. finish_pass()
      // throws it after the reductions, as it does a bad gradient without views.
      replaced_ = tutti::detail::str_cat(
          "DistributedDataParallel: the gradient of ", parameters_[i].name, " was replaced by a ",
          to_string(grad.dtype()), tutti::detail::shape_string(grad.shape()),
          " tensor, not float32 of ", view.num_elements(),
          " elements like the parameter; with gradient_as_bucket_view its values were dropped "
          "and the bucket's used");
    }
    grad = std::move(view);
  }
}

void Reducer::note_reached(const Variable& output) {
  const std::vector<std::shared_ptr<VariableImpl>> leaves = reachable_leaves(output);
  const tutti::detail::MutexLock lock(mutex_);
  for (const std::shared_ptr<VariableImpl>& leaf : leaves) {
    const auto it = index_of_.find(leaf.get());
    if (it != index_of_.end()) reached_[it->second] = true;
  }
}

Variable Reducer::attach(const Variable& output) {
  const std::weak_ptr<Reducer> weak = weak_from_this();
  Variable result = make_result(output.value(), {output}, [weak](const Tensor& grad_output) {
    if (const std::shared_ptr<Reducer> reducer = weak.lock()) reducer->start_pass();
    return Gradients{grad_output};
  });
  // A backward() that throws before reaching this output still makes its pass: see the Note.
  VariableAccess::impl(result)->failed_pass_hooks.emplace_back([weak](Variable&) {
    if (const std::shared_ptr<Reducer> reducer = weak.lock()) reducer->start_pass();
  });
  return result;
}

void Reducer::set_comm_hook(CommHook hook) {
  const tutti::detail::MutexLock lock(mutex_);
  const char* who = "DistributedDataParallel::register_comm_hook";
  if (hook.empty()) throw_invalid_argument(who, ": the hook is empty");
  if (!hook_.empty()) {
    throw_invalid_argument(who, ": a hook ('", hook_.name(),
                           "') is already registered; register one hook, once");
  }
  if (forwarded_) {
    throw_invalid_argument(who, ": register the hook before the first forward()");
  }
  if (config_.compression != Compression::None) {
    throw_invalid_argument(
        who,
        ": DistributedDataParallelOptions::compression is set; a hook replaces DDP's own "
        "reduction, compression included: use hooks::fp16_compress() or bf16_compress() "
        "with compression None");
  }
  hook_ = std::move(hook);
}

bool Reducer::any_joined() const {
  const tutti::detail::MutexLock lock(mutex_);
  return any_joined_;
}

std::vector<std::vector<std::string>> Reducer::bucket_names() const {
  const tutti::detail::MutexLock lock(mutex_);
  std::vector<std::vector<std::string>> names;
  for (const Bucket& bucket : buckets_) {
    names.emplace_back();
    for (std::size_t i : bucket.members) names.back().push_back(parameters_[i].name);
  }
  return names;
}

int Reducer::buckets_started() const {
  const tutti::detail::MutexLock lock(mutex_);
  return started_;
}

// Step 1 of Note [DDP reduction passes].
void Reducer::start_pass() {
  const tutti::detail::MutexLock lock(mutex_);
  if (pass_active_) return;  // A second DDP output in the same backward pass.
  const std::weak_ptr<Reducer> weak = weak_from_this();
  const bool queued = queue_backward_callback([weak] {
    if (const std::shared_ptr<Reducer> reducer = weak.lock()) reducer->finish_pass();
  });
  // Not inside backward() (a leaf_gradients() walk, e.g. under DataParallel): stay local.
  if (!queued) return;
  pass_active_ = true;
  pass_error_ = nullptr;
  started_ = 0;
  ready_order_.clear();
  std::fill(ready_.begin(), ready_.end(), false);
  for (Bucket& bucket : buckets_) {
    bucket.pending = bucket.members.size();
    bucket.started = false;
  }
  // Before any bucket can be launched (find_unused launches some below).
  if (!hook_.empty()) start_pass_count();
  if (config_.find_unused) {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (!reached_[i]) mark_ready(i);
    }
  }
  std::fill(reached_.begin(), reached_.end(), false);
}

// Step 2 of Note [DDP reduction passes]: the hook of parameter `index`.
void Reducer::on_gradient(std::size_t index) {
  const tutti::detail::MutexLock lock(mutex_);
  if (!pass_active_ || ready_[index]) return;
  mark_ready(index);
}

void Reducer::mark_ready(std::size_t index) {
  ready_[index] = true;
  ready_order_.push_back(index);
  Bucket& bucket = buckets_[bucket_of_[index]];
  if (!config_.as_view) {
    const Tensor& grad = parameters_[index].variable.grad();
    Tensor& in_place = bucket.in_place[member_of_[index]];
    in_place = Tensor();
    // Note [Gradients reduced in place]: a float32 gradient of its parameter's size is reduced
    // where it is; anything else goes through the bucket.
    if (fits_bucket(index)) {
      if (reduces_in_place())
        in_place = grad;
      else
        copy_floats(grad, slice_of(index));
    } else {
      // No gradient contributes zeros, not the slice's last average. One of another dtype or
      // size is an error for finish_pass() to throw; it contributes zeros too, so that the
      // bucket still goes out and no member waits for it.
      zero_floats(slice_of(index));
      if (grad.num_elements() > 0 && !pass_error_) {
        try {
          throw_invalid_argument("DistributedDataParallel: the gradient of ",
                                 parameters_[index].name, " is ", to_string(grad.dtype()),
                                 tutti::detail::shape_string(grad.shape()), ", not float32 of ",
                                 bytes_[index] / static_cast<std::int64_t>(sizeof(float)),
                                 " elements like the parameter; it was averaged as zeros");
        } catch (...) {
          pass_error_ = std::current_exception();
        }
      }
    }
  }
  if (--bucket.pending == 0) launch(bucket_of_[index]);
}

void Reducer::launch(std::size_t b) {
  Bucket& bucket = buckets_[b];
  bucket.started = true;
  ++started_;
  if (b == 0) {  // The join slot; see Note [DDP reduction passes].
    float_data(bucket.contents)[bucket.contents.num_elements() - 1] = 1.0f;
  }
  if (!hook_.empty()) return launch_hook(b);
  try {
    const ReduceOptions options{.op = ReduceOp::Average, .process_set = config_.process_set};
    const std::string name = config_.op_prefix + ".bucket." + std::to_string(b);
    if (reduces_in_place()) {
      std::vector<TensorView> group;
      group.reserve(bucket.members.size() + 1);
      for (std::size_t m = 0; m < bucket.members.size(); ++m) {
        const Tensor& in_place = bucket.in_place[m];
        group.push_back(in_place.num_elements() > 0 ? in_place : slice_of(bucket.members[m]));
      }
      if (b == 0) group.push_back(bucket.contents.slice(bucket.contents.num_elements() - 1, {1}));
      bucket.handle = grouped_allreduce_async(std::move(group), name, options);
      bucket.in_flight = true;
      return;
    }
    TensorView what = bucket.contents;
    if (config_.compression != Compression::None) {
      convert_floats(bucket.contents, bucket.wire, "DistributedDataParallel");
      what = bucket.wire;
    }
    bucket.handle = allreduce_async(what, name, options);
    bucket.in_flight = true;
  } catch (...) {
    // Hooks must not throw mid-backward: finish_pass() reports it.
    if (!pass_error_) pass_error_ = std::current_exception();
    break_off(b, "its allreduce could not be started", std::current_exception());
  }
}

// Note [DDP reduction passes], step 2 with a hook: the bucket (without bucket 0's join slot)
// goes to the hook; the join slot is averaged on its own.
void Reducer::launch_hook(std::size_t b) {
  Bucket& bucket = buckets_[b];
  for (Bucket& other : buckets_) {
    if (other.in_flight) static_cast<void>(other.future.poll());  // Errors: see finish_hook().
  }
  const std::int64_t count = bucket.contents.num_elements() - (b == 0 ? 1 : 0);
  GradBucket grad_bucket;  // pass_index and resumed below, once the pass count is there.
  grad_bucket.index = static_cast<int>(b);
  grad_bucket.buffer = bucket.contents.slice(0, {count});
  grad_bucket.is_last = started_ == static_cast<int>(buckets_.size());
  grad_bucket.process_set = config_.process_set;
  grad_bucket.op_name = config_.op_prefix + ".bucket." + std::to_string(b);
  for (std::size_t i : bucket.members) {
    grad_bucket.names.push_back(parameters_[i].name);
    grad_bucket.gradients.push_back(slice_of(i));
  }
  try {
    take_pass_count();  // Waits in the first bucket of the pass only.
    grad_bucket.pass_index = pass_index_;
    grad_bucket.resumed = resumed_;
    if (b == 0) {
      bucket.join_handle =
          allreduce_async(bucket.contents.slice(count, {1}), config_.op_prefix + ".join",
                          {.op = ReduceOp::Average, .process_set = config_.process_set});
      bucket.join_in_flight = true;
    }
    CommFuture future = hook_(grad_bucket);
    if (!future.valid()) {
      throw_invalid_argument("DistributedDataParallel: the comm hook '", hook_.name(),
                             "' returned an empty CommFuture for bucket ", b);
    }
    bucket.future = std::move(future);
    bucket.in_flight = true;
  } catch (...) {
    if (!pass_error_) pass_error_ = std::current_exception();  // As launch(): reported later.
    break_off(b, "the comm hook threw", std::current_exception());
  }
}

void Reducer::start_pass_count() {
  const ProcessSet& set = config_.process_set;
  if (set.size() == 1) {  // Nobody to agree with, nobody to miss a pass.
    pass_index_ = passes_++;
    resumed_ = false;
    return;
  }
  pass_slots_ = Tensor(DataType::Int64, {set.size()});  // Zeros: every other member's slot.
  pass_slots_.span<std::int64_t>()[static_cast<std::size_t>(set.rank())] = passes_ + 1;
  try {
    pass_handle_ = allreduce_async(pass_slots_, config_.op_prefix + ".pass",
                                   {.op = ReduceOp::Sum, .process_set = set});
    pass_count_in_flight_ = true;
  } catch (...) {
    if (!pass_error_) pass_error_ = std::current_exception();  // As launch(): reported later.
    break_off(0, "its pass count could not be started", std::current_exception());
  }
}

void Reducer::take_pass_count() {
  if (!pass_count_in_flight_) return;
  pass_count_in_flight_ = false;
  pass_handle_.wait();
  std::int64_t most = 0;
  std::int64_t least = std::numeric_limits<std::int64_t>::max();
  for (const std::int64_t slot : pass_slots_.span<std::int64_t>()) {
    most = std::max(most, slot);
    if (slot > 0) least = std::min(least, slot);  // Zero: a member that has joined.
  }
  pass_index_ = most - 1;  // most >= 1: this rank's own slot.
  resumed_ = least < most;
  passes_ = pass_index_ + 1;
}

// The hook's result for bucket `b` into its contents (throws what the future throws, or
// InvalidArgument for a result of another dtype or size).
void Reducer::finish_hook(std::size_t b) {
  Bucket& bucket = buckets_[b];
  const CommFuture future = std::move(bucket.future);
  bucket.future = CommFuture();
  Tensor result;
  try {
    result = future.wait();
  } catch (...) {
    // A continuation that threw never started the chain's later collectives.
    break_off(b, "the comm hook's future failed", std::current_exception());
    throw;
  }
  const std::int64_t count = bucket.contents.num_elements() - (b == 0 ? 1 : 0);
  if (result.dtype() != DataType::Float32 || result.num_elements() != count) {
    throw_invalid_argument("DistributedDataParallel: the comm hook '", hook_.name(),
                           "' returned a ", to_string(result.dtype()), " tensor of ",
                           result.num_elements(), " elements for bucket ", b, " of ", count,
                           " float32 elements");
  }
  if (result.data() != bucket.contents.data())
    copy_floats(result, bucket.contents.slice(0, {count}));
}

// Waits for every bucket in flight and, with `write_results`, writes the averages of those that
// succeeded into the gradients. Returns the first error, after waiting for all (the runtime
// uses their memory until then).
std::exception_ptr Reducer::wait_all(bool write_results) {
  std::exception_ptr first_error;
  if (pass_count_in_flight_) {  // No bucket went to the hook (none, or an abandoned pass).
    try {
      take_pass_count();
    } catch (...) {
      first_error = std::current_exception();
    }
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bool join_ok = true;
    if (bucket.join_in_flight) {
      bucket.join_in_flight = false;
      try {
        bucket.join_handle.wait();
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
        join_ok = false;
      }
    }
    if (!bucket.in_flight) continue;
    bucket.in_flight = false;
    try {
      if (hook_.empty()) {
        bucket.handle.wait();
      } else {
        finish_hook(b);  // Runs the rest of the hook's chain even without write_results.
      }
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
      continue;  // Those that went through the bucket keep their local values.
    }
    if (!write_results || !join_ok) continue;
    if (config_.compression != Compression::None) {
      convert_floats(bucket.wire, bucket.contents, "DistributedDataParallel");
    }
    if (!config_.as_view) {
      for (std::size_t m = 0; m < bucket.members.size(); ++m) {
        // Reduced in place, grad() holds the average already; one that does not fit the bucket
        // (none, or another dtype or size) is left as it is.
        const std::size_t i = bucket.members[m];
        if (bucket.in_place[m].num_elements() > 0 || !fits_bucket(i)) continue;
        copy_floats(slice_of(i), parameters_[i].variable.grad());
      }
    }
    if (b == 0) {
      // The fraction of members that reduced it; fp16 keeps (size - 1) / size well apart from 1
      // for any realistic set size.
      const float active = float_data(bucket.contents)[bucket.contents.num_elements() - 1];
      any_joined_ = active < 1.0f - 0.5f / static_cast<float>(config_.process_set.size());
    }
  }
  // The pass is over: no reference to a gradient outlives it.
  for (Bucket& bucket : buckets_)
    std::fill(bucket.in_place.begin(), bucket.in_place.end(), Tensor());
  return first_error;
}

// Step 3 of Note [DDP reduction passes].
void Reducer::finish_pass() {
  const tutti::detail::MutexLock lock(mutex_);
  if (!pass_active_) return;
  std::vector<std::string> missing;
  for (const Bucket& bucket : buckets_) {
    for (std::size_t i : bucket.members) {
      if (!ready_[i]) missing.push_back(parameters_[i].name);
    }
  }
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (!ready_[i]) mark_ready(i);  // Submit every bucket, so that no member waits forever.
  }
  std::exception_ptr error = pass_error_;
  const std::exception_ptr wait_error = wait_all(/*write_results=*/true);
  if (!error) error = wait_error;
  pass_active_ = false;
  // Whether to rebuild must not depend on what this rank saw (unused parameters, errors): a
  // member that skipped the broadcast would leave the others waiting in it.
  if (!rebuilt_ && !config_.find_unused) {
    try {
      rebuild();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  if (!replaced_.empty()) {
    const std::string replaced = std::move(replaced_);
    replaced_.clear();
    throw_invalid_argument(replaced);
  }
  if (!missing.empty() && !config_.find_unused) {
    std::string names;
    for (const std::string& name : missing) names += (names.empty() ? "" : ", ") + name;
    throw_invalid_argument(
        "DistributedDataParallel: backward() produced no gradient for ", names,
        " (the forward pass did not use them, or they were frozen with set_requires_grad(false) "
        "after the DDP was built); their buckets were reduced with this rank's current grad(). "
        "Set DistributedDataParallelOptions::find_unused_parameters = true if the model leaves "
        "parameters unused, or use every parameter in forward(); freeze parameters before "
        "building the DDP");
  }
}

void Reducer::abandon_pass() {
  static_cast<void>(wait_all(/*write_results=*/false));  // Dropped: that backward() threw.
  pass_active_ = false;
}

void Reducer::break_off(std::size_t b, const char* what, const std::exception_ptr& error) {
  if (!broken_.empty()) return;
  std::string why = "unknown exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
  }
  broken_ = tutti::detail::str_cat(
      "DistributedDataParallel: in an earlier backward() on this rank, bucket ", b, ": ", what,
      " (", why,
      "), so collectives the other members wait in may never have been started here "
      "(the stall inspector fails them); this DDP cannot synchronize again. Fix the cause and "
      "start again");
}

// Rebuilds the buckets in the root's ready order of the first synchronized pass that every
// member ran (hooks' order, then the parameters finish_pass() marked). Collective: every
// member finishing that pass gets here, and the root's order decides on all.
void Reducer::rebuild() {
  // A member that has joined cannot take part in the broadcast: the rebuild waits for a pass
  // without one. A member that joined before its first pass (no batch at all this epoch) thus
  // rebuilds with the others in its own first pass, where they rebuild too; counting the
  // rebuild done here would leave it broadcasting alone then. Every member of a pass sees the
  // same any_joined_ (bucket 0's reduced join flag).
  if (any_joined_) return;
  rebuilt_ = true;
  const std::size_t n = parameters_.size();
  Tensor order(DataType::Int64, {static_cast<std::int64_t>(n)});
  std::span<std::int64_t> values = order.span<std::int64_t>();
  for (std::size_t k = 0; k < n; ++k) values[k] = static_cast<std::int64_t>(ready_order_[k]);
  try {
    broadcast(order, config_.root_rank, config_.op_prefix + ".rebuild_order", config_.process_set);
  } catch (const Error& e) {
    // The root joined since: every member that got here fails alike, and none rebuilds.
    if (e.code() == ErrorCode::InvalidArgument) return;
    throw;
  }
  std::vector<std::size_t> root_order(n);
  std::vector<bool> seen(n, false);
  for (std::size_t k = 0; k < n; ++k) {
    const std::int64_t i = values[k];
    // The root's order is a permutation of the same parameters unless the models differ, which
    // the broadcast's shape check would have caught; keep the buckets rather than trust it.
    if (i < 0 || static_cast<std::size_t>(i) >= n || seen[static_cast<std::size_t>(i)]) return;
    seen[static_cast<std::size_t>(i)] = true;
    root_order[k] = static_cast<std::size_t>(i);
  }
  std::vector<std::vector<std::size_t>> assignment =
      assign_buckets(root_order, bytes_, config_.first_cap_bytes, config_.cap_bytes);
  bool same = assignment.size() == buckets_.size();
  for (std::size_t b = 0; same && b < assignment.size(); ++b) {
    same = assignment[b] == buckets_[b].members;
  }
  if (!same) build_buckets(assignment);
}

}  // namespace tutti::nn::detail

// SPDX-License-Identifier: Apache-2.0
// CommFuture and CommHook (tutti/nn/comm_hooks.h), and the built-in hooks that do not compress
// by rank: allreduce, fp16_compress and bf16_compress. PowerSGD is in powersgd.cc.
#include "tutti/nn/comm_hooks.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "src/nn/parallel/float_convert.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

// Note [Future chains]
// A future is resolved by exactly one source: a collective (handle + the tensor it fills), an
// upstream future plus a continuation, or nothing (ready). Resolving a continuation yields the
// future it returned (`forward`), which is then resolved in turn; its result or error becomes
// this one's. advance() walks this as far as it can, blocking on handles only when asked, so
// poll() and wait() share it. Every step keeps the tensors alive that collectives still write.
struct CommFuture::State {
  Handle handle;
  bool has_handle = false;
  std::shared_ptr<State> upstream;
  std::function<CommFuture(const Tensor&)> next;
  std::shared_ptr<State> forward;
  bool done = false;
  Tensor result;
  std::exception_ptr error;
};

// See Note [Future chains]. True once `s` is done. Catches everything: poll() never throws.
bool CommFuture::advance(State& s, bool block) {
  const auto finish = [](State& state, std::exception_ptr error) {
    state.error = std::move(error);
    state.done = true;
  };
  if (s.done) return true;
  if (s.has_handle) {
    if (!block && !s.handle.poll()) return false;
    s.has_handle = false;
    try {
      s.handle.wait();
    } catch (...) {
      finish(s, std::current_exception());
      return true;
    }
    s.handle = Handle();
    finish(s, nullptr);
    return true;
  }
  if (s.upstream) {
    if (!advance(*s.upstream, block)) return false;
    const std::shared_ptr<State> up = std::move(s.upstream);
    std::function<CommFuture(const Tensor&)> next = std::move(s.next);
    s.next = nullptr;
    if (up->error) {
      finish(s, up->error);
      return true;
    }
    try {
      CommFuture future = next(up->result);
      if (!future.valid()) {
        detail::throw_invalid_argument(
            "CommFuture::then: the continuation returned an empty "
            "CommFuture");
      }
      s.forward = future.state_;
    } catch (...) {
      finish(s, std::current_exception());
      return true;
    }
  }
  if (s.forward) {
    if (!advance(*s.forward, block)) return false;
    s.result = s.forward->result;
    const std::exception_ptr error = s.forward->error;
    s.forward.reset();
    finish(s, error);
    return true;
  }
  finish(s, nullptr);
  return true;
}

CommFuture CommFuture::ready(Tensor result) {
  CommFuture future;
  future.state_ = std::make_shared<State>();
  future.state_->result = std::move(result);
  future.state_->done = true;
  return future;
}

CommFuture::CommFuture(Handle handle, Tensor result) : state_(std::make_shared<State>()) {
  state_->handle = std::move(handle);
  state_->has_handle = true;
  state_->result = std::move(result);
}

CommFuture CommFuture::then_future(std::function<CommFuture(const Tensor&)> next) const {
  if (!valid()) detail::throw_invalid_argument("CommFuture::then: the future is empty");
  CommFuture future;
  future.state_ = std::make_shared<State>();
  future.state_->upstream = state_;
  future.state_->next = std::move(next);
  return future;
}

bool CommFuture::poll() const { return !valid() || advance(*state_, /*block=*/false); }

Tensor CommFuture::wait() const {
  if (!valid()) detail::throw_invalid_argument("CommFuture::wait: the future is empty");
  advance(*state_, /*block=*/true);
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->result;
}

CommHook::CommHook(Function function, std::string name)
    : function_(function ? std::make_shared<const Function>(std::move(function)) : nullptr),
      name_(std::move(name)) {
  if (!function_) detail::throw_invalid_argument("CommHook: the function is empty");
}

CommFuture CommHook::operator()(GradBucket& bucket) const {
  if (!function_) detail::throw_invalid_argument("CommHook: calling an empty hook");
  return (*function_)(bucket);
}

namespace hooks {
namespace {

// The averaging every built-in ends with: in place, under the bucket's own name.
CommFuture average(GradBucket& bucket, const ProcessSet& set) {
  Handle handle =
      allreduce_async(bucket.buffer, bucket.op_name, {.op = ReduceOp::Average, .process_set = set});
  return CommFuture(std::move(handle), bucket.buffer);
}

// `bucket` with its buffer converted to `dtype` and the gradient views re-pointed into it.
GradBucket converted(const GradBucket& bucket, DataType dtype, const char* who) {
  GradBucket result = bucket;
  result.buffer = Tensor::empty(dtype, {bucket.buffer.num_elements()});  // Converted into whole.
  detail::convert_floats(bucket.buffer, result.buffer, who);
  const auto* base = static_cast<const float*>(bucket.buffer.data());
  for (std::size_t i = 0; i < bucket.gradients.size(); ++i) {
    const Tensor& view = bucket.gradients[i];
    const auto offset = static_cast<std::int64_t>(static_cast<const float*>(view.data()) - base);
    result.gradients[i] = result.buffer.slice(offset, view.shape());
  }
  return result;
}

CommHook compress(DataType dtype, CommHook inner, const char* who) {
  if (inner.empty()) inner = allreduce();
  return CommHook(
      [dtype, inner, who](GradBucket& bucket) {
        if (bucket.buffer.dtype() != DataType::Float32) {
          detail::throw_invalid_argument(who, ": the bucket is ", to_string(bucket.buffer.dtype()),
                                         ", not float32 (compressed twice?)");
        }
        GradBucket narrow = converted(bucket, dtype, who);
        const Tensor original = bucket.buffer;
        return inner(narrow).then([original, dtype, who](const Tensor& reduced) {
          if (reduced.dtype() != dtype) {
            detail::throw_invalid_argument(who, ": the inner hook returned a ",
                                           to_string(reduced.dtype()), " tensor, not ",
                                           to_string(dtype));
          }
          detail::convert_floats(reduced, original, who);
          return original;
        });
      },
      std::string(who) + "(" + inner.name() + ")");
}

}  // namespace

CommHook allreduce(ProcessSet process_set) {
  // The global set stands for the DDP's own set (see the header).
  const bool own_set = process_set.id() == 0;
  return CommHook(
      [process_set, own_set](GradBucket& bucket) {
        return average(bucket, own_set ? bucket.process_set : process_set);
      },
      "allreduce");
}

CommHook fp16_compress(CommHook inner) {
  return compress(DataType::Float16, std::move(inner), "fp16_compress");
}

CommHook bf16_compress(CommHook inner) {
  return compress(DataType::BFloat16, std::move(inner), "bf16_compress");
}

}  // namespace hooks
}  // namespace tutti::nn

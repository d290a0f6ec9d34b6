// SPDX-License-Identifier: Apache-2.0
// SyncBatchNorm and convert_sync_batchnorm(): batch normalization whose statistics are summed
// over a process set (the arithmetic is detail::batch_norm's, src/nn/batch_norm.cc).
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/common/mutex.h"
#include "src/nn/autograd.h"
#include "src/nn/batch_norm_op.h"
#include "src/nn/parallel/sync_batch_norm_op.h"
#include "src/nn/tensor_math.h"
#include "tutti/collectives.h"
#include "tutti/nn/batch_norm.h"
#include "tutti/nn/parallel.h"

namespace tutti::nn {

namespace detail {

namespace {

// The number of the next layer of process set `set_id` to train (Note [SyncBatchNorm names]).
std::uint64_t next_layer_number(int set_id) {
  struct Numbers {
    tutti::detail::Mutex mutex;
    std::map<int, std::uint64_t> next TUTTI_GUARDED_BY(mutex);  // By process set id.
  };
  // Never destroyed: a thread may still train a layer while the process exits.
  static Numbers* const numbers = new Numbers();
  tutti::detail::MutexLock lock(numbers->mutex);
  return numbers->next[set_id]++;
}

}  // namespace

const std::string& BatchNormSync::name() const {
  std::call_once(numbered_, [this] {
    name_ = "SyncBatchNorm." + std::to_string(next_layer_number(process_set_.id()));
  });
  return name_;
}

StatisticsReducer sync_reducer(const BatchNormSync& sync) {
  // Sum, not Average: a member that has joined contributes zeros, which leave the sums of the
  // others exact (its statistics are not gathered at all).
  const ReduceOptions options{.op = ReduceOp::Sum, .process_set = sync.process_set()};
  const std::string& name = sync.name();
  return {
      // A name of its own: an allgather, where the backward's are allreduces.
      .gather =
          [set = sync.process_set(),
           statistics = name + ".statistics"](std::span<const double> row) {
            const auto size = static_cast<std::int64_t>(row.size());
            // allgather() only reads its input.
            return allgather(TensorView(const_cast<double*>(row.data()), Shape{1, size}),
                             statistics, set);
          },
      .sum =
          [options, name](std::span<double> values) {
            allreduce(TensorView(values.data(), Shape{static_cast<std::int64_t>(values.size())}),
                      name, options);
          },
      // Started at once, not from a callback: the other ranks' backward waits in it, and their
      // DDP buckets behind it, which a callback queued earlier (DDP's) may be waiting for.
      .sum_zeros =
          [options, name](std::int64_t count) {
            auto zeros = std::make_shared<std::vector<double>>(static_cast<std::size_t>(count));
            Handle handle = allreduce_async(TensorView(zeros->data(), Shape{count}), name, options);
            // The buffer lives until the reduction is over; its error is the other ranks' to
            // report, since this backward() throws its own.
            queue_backward_callback([handle, zeros]() mutable { handle.wait(); });
          },
  };
}

}  // namespace detail

SyncBatchNorm::SyncBatchNorm(std::int64_t features, ProcessSet process_set)
    : features_(features),
      sync_(std::make_shared<const detail::BatchNormSync>(std::move(process_set))) {
  if (features <= 0) {
    detail::throw_invalid_argument("SyncBatchNorm(", features, "): needs a positive feature count");
  }
  weight_ = register_parameter("weight", Variable(detail::zeros({features})));
  detail::as_array(weight_.value()).setOnes();
  bias_ = register_parameter("bias", Variable(detail::zeros({features})));
  running_mean_ = register_buffer("running_mean", Variable(detail::zeros({features})));
  running_var_ = register_buffer("running_var", Variable(detail::zeros({features})));
  detail::as_array(running_var_.value()).setOnes();
}

Variable SyncBatchNorm::forward(const Variable& input) {
  const Shape& shape = input.value().shape();
  if (shape.size() < 2 || shape.size() > 4 || shape[1] != features_) {
    detail::throw_invalid_argument("SyncBatchNorm(", features_, ") expects input [n, ", features_,
                                   "], [n, ", features_, ", l] or [n, ", features_, ", h, w], got ",
                                   detail::shape_string(shape));
  }
  std::int64_t inner = 1;
  for (std::size_t d = 2; d < shape.size(); ++d) inner *= shape[d];
  return detail::batch_norm(
      input, weight_, bias_, running_mean_.value(), running_var_.value(), is_training(), shape[0],
      features_, inner, is_training() ? detail::sync_reducer(*sync_) : detail::StatisticsReducer{});
}

namespace {

// Converts `module` if it is a BatchNorm, then its registered children, depth first. The layers
// are numbered later, by their first training forward (Note [SyncBatchNorm names]).
void convert(Module& module, const ProcessSet& process_set) {
  if (auto* bn = dynamic_cast<BatchNorm1d*>(&module)) {
    detail::BatchNormAccess::set_sync(*bn,
                                      std::make_shared<const detail::BatchNormSync>(process_set));
  } else if (auto* bn2 = dynamic_cast<BatchNorm2d*>(&module)) {
    detail::BatchNormAccess::set_sync(*bn2,
                                      std::make_shared<const detail::BatchNormSync>(process_set));
  }
  for (const auto& [name, child] : module.named_children()) convert(*child, process_set);
}

}  // namespace

std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               ProcessSet process_set) {
  if (!module) detail::throw_invalid_argument("convert_sync_batchnorm: the module is null");
  convert(*module, process_set);
  return module;
}

}  // namespace tutti::nn

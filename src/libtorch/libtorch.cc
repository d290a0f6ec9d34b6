// SPDX-License-Identifier: Apache-2.0
// The LibTorch adapter: tensor views, the broadcast helpers and DistributedOptimizer, whose
// post-accumulate hooks on the gradient accumulators start each gradient's allreduce.
// First, so that the header is compiled alone here (test/headers leaves it to this file).
#include "tutti/libtorch.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#if TUTTI_LIBTORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <exception>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "optimizers/reduction_rounds.h"
#include "src/common/throw.h"
#include "src/libtorch/dtypes.h"
#include "src/libtorch/state_bytes.h"
#include "tutti/cuda.h"
#include "tutti/runtime.h"

namespace tutti::libtorch {

using internal::torch_type;
using internal::tutti_type;

namespace {

// LibTorch's current stream of `tensor`'s device for a CUDA tensor (API.md: the adapter
// submits every CUDA tensor with it, so that Tutti waits on the GPU for the kernels that wrote
// it), else nullptr. In a backward hook it is the stream of the op that made the gradient.
void* torch_stream(const torch::Tensor& tensor) {
#if TUTTI_LIBTORCH_CUDA
  if (tensor.is_cuda()) return c10::cuda::getCurrentCUDAStream(tensor.get_device()).stream();
#endif
  // A LibTorch without CUDA has no CUDA tensors.
  static_cast<void>(tensor);
  return nullptr;
}

}  // namespace

TensorView view(const torch::Tensor& tensor) {
  if (!tensor.defined()) detail::throw_invalid_argument("tutti::libtorch::view: undefined tensor");
  const std::optional<DataType> dtype = tutti_type(tensor.scalar_type());
  if (!dtype) {
    detail::throw_invalid_argument("tutti::libtorch::view: dtype ",
                                   c10::toString(tensor.scalar_type()), " has no Tutti DataType");
  }
  if (!tensor.is_contiguous()) {
    detail::throw_invalid_argument("tutti::libtorch::view: the tensor is non-contiguous (sizes ",
                                   tensor.sizes(), ", strides ", tensor.strides(),
                                   "); call .contiguous()");
  }
  Device device;
  if (tensor.is_cuda()) {
    device = Device::cuda(tensor.get_device());
  } else if (!tensor.is_cpu()) {
    detail::throw_invalid_argument("tutti::libtorch::view: device ", tensor.device().str(),
                                   " is neither CPU nor CUDA");
  }
  const torch::IntArrayRef sizes = tensor.sizes();
  return TensorView(tensor.data_ptr(), *dtype, Shape(sizes.begin(), sizes.end()), device);
}

torch::Tensor to_torch(const Tensor& tensor) {
  const std::optional<c10::ScalarType> type = torch_type(tensor.dtype());
  if (!type) {
    detail::throw_invalid_argument("tutti::libtorch::to_torch: dtype ", to_string(tensor.dtype()),
                                   " has no LibTorch counterpart");
  }
  torch::TensorOptions options = torch::TensorOptions().dtype(*type);
  if (tensor.device().kind == Device::Kind::CUDA) {
    options = options.device(torch::kCUDA, static_cast<c10::DeviceIndex>(tensor.device().index));
  }
  const std::vector<std::int64_t> sizes(tensor.shape().begin(), tensor.shape().end());
  if (tensor.data() == nullptr) return torch::empty(sizes, options);
  // The deleter owns a copy of `tensor`, which shares (and keeps alive) its storage.
  return torch::from_blob(
      tensor.data(), sizes, [keep = tensor](void*) mutable { keep = Tensor(); }, options);
}

void broadcast_parameters(const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                          int root_rank, ProcessSet process_set) {
  // One grouped broadcast per dtype keeps every member's list in the same (name) order.
  std::map<DataType, std::vector<TensorView>> by_type;
  std::map<DataType, std::vector<std::string>> names;
  std::map<DataType, std::vector<torch::Tensor>> tensors;
  for (const auto& item : parameters) {
    TensorView v;
    try {
      v = view(item.value());
    } catch (const Error& e) {
      detail::throw_invalid_argument("broadcast_parameters: '", item.key(), "': ", e.what());
    }
    by_type[v.dtype()].push_back(v);
    names[v.dtype()].push_back(item.key());
    tensors[v.dtype()].push_back(item.value());
  }
  torch::NoGradGuard no_grad;
  for (auto& [dtype, views] : by_type) {
    std::vector<Handle> handles;
    for (std::size_t i = 0; i < views.size(); ++i) {
      const cuda::StreamGuard current(torch_stream(tensors[dtype][i]));
      handles.push_back(broadcast_async(
          views[i], root_rank, "libtorch.broadcast_parameters." + names[dtype][i], process_set));
    }
    wait_all(handles);
  }
}

void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root_rank,
                               ProcessSet process_set) {
  if (!process_set.included()) return;
  // `root_rank` is a global rank (API.md), like tutti::rank(); the set rank differs from it in
  // a set such as {1, 3}.
  const bool is_root = tutti::rank() == root_rank;
  std::string bytes;
  if (is_root) bytes = internal::save_optimizer(optimizer);
  bytes = broadcast_object(bytes, root_rank, "libtorch.broadcast_optimizer_state", process_set);
  if (is_root) return;
  try {
    internal::load_optimizer(optimizer, bytes);  // The root's state replaces this rank's.
  } catch (const Error& e) {
    detail::throw_invalid_argument("broadcast_optimizer_state: ", e.what());
  }
}

// Note [LibTorch gradient buffers]
// The rounds are optim::DistributedOptimizer's (the engine of optimizers/reduction_rounds.h,
// Note [Reduction rounds]); the hook here is a post hook of the parameter's AccumulateGrad node,
// so it runs once the gradient of this pass has been accumulated into grad(). A gradient that
// can travel as it is (contiguous, no compression for its dtype) is reduced in place; another
// goes through a contiguous copy of the wire type, which finish() copies back. A parameter
// without a gradient gets a zero-filled one first.
namespace {

class TorchBuffers final : public optim::internal::GradientBuffers {
 public:
  TorchBuffers(std::vector<torch::Tensor> params, Compression compression)
      : params_(std::move(params)), compression_(compression) {}

  Handle start(const optim::internal::ReductionUnit& unit, const ReduceOptions& options) override {
    torch::NoGradGuard no_grad;
    if (buffers_.size() <= unit.index) buffers_.resize(unit.index + 1);
    std::vector<torch::Tensor> buffers(unit.members.size());
    std::vector<TensorView> views;
    for (std::size_t m = 0; m < unit.members.size(); ++m) {
      torch::Tensor& param = params_[unit.members[m]];
      if (!param.grad().defined()) param.mutable_grad() = torch::zeros_like(param);
      const torch::Tensor& grad = param.grad();
      buffers[m] = grad.scalar_type() == wire_type(grad) && grad.is_contiguous()
                       ? grad
                       : grad.to(wire_type(grad)).contiguous();
      views.push_back(view(buffers[m]));
    }
    // A unit's gradients are on one device; the hook runs under the stream that made them.
    const cuda::StreamGuard current(torch_stream(buffers.front()));
    Handle handle = unit.grouped ? grouped_allreduce_async(std::move(views), unit.name, options)
                                 : allreduce_async(views.front(), unit.name, options);
    buffers_[unit.index] = std::move(buffers);
    return handle;
  }

  std::exception_ptr finish(const optim::internal::ReductionUnit& unit,
                            bool write_results) override {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor>& buffers = buffers_[unit.index];
    for (std::size_t m = 0; write_results && m < unit.members.size(); ++m) {
      torch::Tensor grad = params_[unit.members[m]].grad();
      if (!buffers[m].is_same(grad)) grad.copy_(buffers[m]);
    }
    buffers.clear();
    return nullptr;
  }

 private:
  c10::ScalarType wire_type(const torch::Tensor& grad) const {
    const bool wide =
        grad.scalar_type() == torch::kFloat32 || grad.scalar_type() == torch::kFloat64;
    if (wide && compression_ == Compression::FP16) return torch::kFloat16;
    if (wide && compression_ == Compression::BF16) return torch::kBFloat16;
    return grad.scalar_type();
  }

  std::vector<torch::Tensor> params_;  // Trainable, distinct parameters of the inner optimizer.
  const Compression compression_;
  std::vector<std::vector<torch::Tensor>> buffers_;  // Per unit in flight: what travels.
};

}  // namespace

struct DistributedOptimizer::State {
  State(std::vector<torch::Tensor> params, std::vector<std::string> names,
        optim::DistributedOptions options)
      : buffers(std::move(params), options.compression),
        rounds(std::move(options), std::move(names), buffers, "DistributedOptimizer") {}

  TorchBuffers buffers;
  optim::internal::ReductionRounds rounds;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // Keeps the hooks' nodes.
};

DistributedOptimizer::DistributedOptimizer(
    torch::optim::Optimizer& inner,
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    optim::DistributedOptions options)
    : inner_(inner) {
  optim::internal::check_options(options, "DistributedOptimizer");
  // The inner optimizer's trainable parameters, each once (tied weights share a TensorImpl).
  std::vector<torch::Tensor> params;
  std::map<const c10::TensorImpl*, std::size_t> index_of;
  for (const torch::optim::OptimizerParamGroup& group : inner.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (!p.requires_grad()) continue;
      if (!p.is_leaf()) {
        detail::throw_invalid_argument(
            "DistributedOptimizer: a parameter of the optimizer is not a leaf tensor");
      }
      if (index_of.emplace(p.unsafeGetTensorImpl(), params.size()).second) params.push_back(p);
    }
  }
  const std::size_t n = params.size();
  std::vector<std::string> names(n);
  if (named_parameters.is_empty()) {
    for (std::size_t i = 0; i < n; ++i) names[i] = "noname." + std::to_string(i);
  } else {
    for (const auto& item : named_parameters) {
      const auto it = index_of.find(item.value().unsafeGetTensorImpl());
      if (it != index_of.end() && names[it->second].empty()) names[it->second] = item.key();
    }
  }
  std::set<std::string> frozen;
  for (const auto& item : named_parameters) {
    if (!item.value().requires_grad()) frozen.insert(item.key());
  }
  optim::internal::refuse_frozen_in_groups(options, frozen, "DistributedOptimizer");
  for (std::size_t i = 0; i < n; ++i) {
    if (names[i].empty()) {
      detail::throw_invalid_argument("DistributedOptimizer: parameter ", i,
                                     " of the optimizer (sizes ", params[i].sizes(),
                                     ") has no name in named_parameters");
    }
  }
  state_ = std::make_shared<State>(params, std::move(names), std::move(options));

  const std::weak_ptr<State> weak = state_;
  for (std::size_t i = 0; i < n; ++i) {
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(params[i]);
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [weak, i](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list& /*inputs*/) {
          if (const std::shared_ptr<State> state = weak.lock()) state->rounds.on_gradient(i);
          return outputs;
        }));
    state_->accumulators.push_back(std::move(accumulator));
  }
}

DistributedOptimizer::~DistributedOptimizer() { state_->rounds.stop(); }

void DistributedOptimizer::synchronize() { state_->rounds.synchronize(); }

void DistributedOptimizer::step() {
  state_->rounds.step(skip_depth_ > 0, [this] { inner_.step(); });
}

int DistributedOptimizer::reductions_started() const { return state_->rounds.units_started(); }

void DistributedOptimizer::backward_failed() { state_->rounds.on_failed_pass(); }

void DistributedOptimizer::zero_grad() {
  state_->rounds.check_none_in_flight("DistributedOptimizer::zero_grad()");
  inner_.zero_grad();
  state_->rounds.clear_failure();  // Fresh gradients: a failed round no longer blocks.
}

}  // namespace tutti::libtorch

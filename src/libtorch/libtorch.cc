// SPDX-License-Identifier: Apache-2.0
// The LibTorch adapter: tensor views, the broadcast helpers and DistributedOptimizer, whose
// post-accumulate hooks on the gradient accumulators start each gradient's allreduce.
#include "tutti/libtorch.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <unistd.h>
#if TUTTI_LIBTORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <cmath>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "src/common/mutex.h"
#include "src/common/throw.h"
#include "tutti/cuda.h"
#include "tutti/runtime.h"

namespace tutti::libtorch {

namespace {

std::optional<DataType> tutti_type(c10::ScalarType type) {
  switch (type) {
    case torch::kUInt8: return DataType::UInt8;
    case torch::kInt8: return DataType::Int8;
    case torch::kInt16: return DataType::Int16;
    case torch::kInt32: return DataType::Int32;
    case torch::kInt64: return DataType::Int64;
    case torch::kFloat16: return DataType::Float16;
    case torch::kBFloat16: return DataType::BFloat16;
    case torch::kFloat32: return DataType::Float32;
    case torch::kFloat64: return DataType::Float64;
    case torch::kBool: return DataType::Bool;
    default: return std::nullopt;
  }
}

std::optional<c10::ScalarType> torch_type(DataType type) {
  switch (type) {
    case DataType::UInt8: return torch::kUInt8;
    case DataType::Int8: return torch::kInt8;
    case DataType::Int16: return torch::kInt16;
    case DataType::Int32: return torch::kInt32;
    case DataType::Int64: return torch::kInt64;
    case DataType::Float16: return torch::kFloat16;
    case DataType::BFloat16: return torch::kBFloat16;
    case DataType::Float32: return torch::kFloat32;
    case DataType::Float64: return torch::kFloat64;
    case DataType::Bool: return torch::kBool;
    case DataType::UInt16: break;  // LibTorch 1.13 has no uint16.
  }
  return std::nullopt;
}

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

// Writes one whole line to stderr with a single write(2), so ranks' lines do not interleave.
void warn_line(const std::string& message) {
  std::string line = "[tutti";
  if (is_initialized()) line += " rank " + std::to_string(rank());
  line += "] WARNING: " + message + "\n";
  static_cast<void>(::write(STDERR_FILENO, line.data(), line.size()));
}

// The checks of optim::DistributedOptimizer's options (tutti/optim/distributed_optimizer.h).
void check_options(const optim::DistributedOptions& o) {
  if (o.op != ReduceOp::Average && o.op != ReduceOp::Sum && o.op != ReduceOp::Adasum) {
    detail::throw_invalid_argument("DistributedOptimizer: op must be Average, Sum or Adasum, got ",
                                   to_string(o.op));
  }
  if (o.compression != Compression::None && o.compression != Compression::FP16 &&
      o.compression != Compression::BF16) {
    detail::throw_invalid_argument("DistributedOptimizer: unknown compression ",
                                   static_cast<int>(o.compression));
  }
  if (o.backward_passes_per_step < 1) {
    detail::throw_invalid_argument(
        "DistributedOptimizer: backward_passes_per_step must be at least 1, got ",
        o.backward_passes_per_step);
  }
  if (!(o.gradient_predivide_factor > 0) || !std::isfinite(o.gradient_predivide_factor)) {
    detail::throw_invalid_argument(
        "DistributedOptimizer: gradient_predivide_factor must be a positive number, got ",
        o.gradient_predivide_factor);
  }
  if (o.gradient_predivide_factor != 1.0 && o.op != ReduceOp::Average) {
    detail::throw_invalid_argument("DistributedOptimizer: gradient_predivide_factor ",
                                   o.gradient_predivide_factor, " needs op Average");
  }
  if (o.num_groups < 0) {
    detail::throw_invalid_argument("DistributedOptimizer: num_groups must be >= 0, got ",
                                   o.num_groups);
  }
  if (o.num_groups > 0 && !o.groups.empty()) {
    detail::throw_invalid_argument("DistributedOptimizer: give num_groups or groups, not both");
  }
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
  // LibTorch's optimizer archive carries the state but its load() does not restore the
  // groups' options, so each group's options travel in an archive of their own.
  std::string bytes;
  if (is_root) {
    torch::serialize::OutputArchive archive;
    torch::serialize::OutputArchive state;
    optimizer.save(state);
    archive.write("state", state);
    for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
      torch::serialize::OutputArchive group;
      optimizer.param_groups()[g].options().serialize(group);
      archive.write("group/" + std::to_string(g), group);
    }
    archive.write("groups",
                  torch::tensor(static_cast<std::int64_t>(optimizer.param_groups().size())));
    std::ostringstream out;
    archive.save_to(out);
    bytes = out.str();
  }
  bytes = broadcast_object(bytes, root_rank, "libtorch.broadcast_optimizer_state", process_set);
  if (is_root) return;
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  torch::Tensor groups;
  archive.read("groups", groups);
  if (groups.item<std::int64_t>() != static_cast<std::int64_t>(optimizer.param_groups().size())) {
    detail::throw_invalid_argument("broadcast_optimizer_state: the root has ",
                                   groups.item<std::int64_t>(), " parameter groups, this rank ",
                                   optimizer.param_groups().size());
  }
  torch::serialize::InputArchive state;
  archive.read("state", state);
  optimizer.state().clear();  // The root's state replaces this rank's, entries it lacks too.
  optimizer.load(state);
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    torch::serialize::InputArchive group;
    archive.read("group/" + std::to_string(g), group);
    optimizer.param_groups()[g].options().serialize(group);
  }
}

// Note [LibTorch reduction rounds]
// The same rounds as optim::DistributedOptimizer (see Note [Reduction rounds] in
// optimizers/distributed_optimizer.cc): each unit (a parameter or a group) goes Idle ->
// InFlight -> Done once per step(); the hook of the k-th backward pass starts a unit once all
// its members are ready; synchronize() starts the rest and waits; step() starts a new round.
// The hook here is a post hook of the parameter's AccumulateGrad node, so it runs once the
// gradient of this pass has been accumulated into grad().
struct DistributedOptimizer::State {
  enum class Phase { Idle, InFlight, Done };

  struct Unit {
    std::string name;
    std::vector<std::size_t> members;  // Indices into params.
    bool grouped = false;
    std::size_t ready = 0;
    Phase phase = Phase::Idle;
    Handle handle;
    std::vector<torch::Tensor> buffers;  // Per member: what travels; grad() itself if possible.
  };

  detail::Mutex mutex;
  bool alive TUTTI_GUARDED_BY(mutex) = true;
  optim::DistributedOptions options;
  std::vector<torch::Tensor> params;  // Trainable, distinct parameters of the inner optimizer.
  std::vector<std::string> names;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // Keeps the hooks' nodes.
  std::vector<int> passes TUTTI_GUARDED_BY(mutex);
  std::vector<std::size_t> unit_of;
  std::vector<Unit> units TUTTI_GUARDED_BY(mutex);
  std::optional<bool> included TUTTI_GUARDED_BY(mutex);

  bool is_member() TUTTI_REQUIRES(mutex) {
    if (!included) included = options.process_set.included();
    return *included;
  }

  ReduceOptions reduce_options() const {
    ReduceOptions ro{.op = options.op, .process_set = options.process_set};
    if (options.op == ReduceOp::Average && options.gradient_predivide_factor != 1.0) {
      ro.prescale_factor = 1.0 / options.gradient_predivide_factor;
      ro.postscale_factor = options.gradient_predivide_factor;
    }
    return ro;
  }

  c10::ScalarType wire_type(const torch::Tensor& grad) const {
    const bool wide =
        grad.scalar_type() == torch::kFloat32 || grad.scalar_type() == torch::kFloat64;
    if (wide && options.compression == Compression::FP16) return torch::kFloat16;
    if (wide && options.compression == Compression::BF16) return torch::kBFloat16;
    return grad.scalar_type();
  }

  void start(Unit& unit) TUTTI_REQUIRES(mutex) {
    torch::NoGradGuard no_grad;
    unit.buffers.assign(unit.members.size(), torch::Tensor());
    std::vector<TensorView> views;
    for (std::size_t m = 0; m < unit.members.size(); ++m) {
      torch::Tensor& param = params[unit.members[m]];
      if (!param.grad().defined()) param.mutable_grad() = torch::zeros_like(param);
      const torch::Tensor& grad = param.grad();
      // No copy when grad() can travel as it is: it is reduced in place.
      unit.buffers[m] = grad.scalar_type() == wire_type(grad) && grad.is_contiguous()
                            ? grad
                            : grad.to(wire_type(grad)).contiguous();
      views.push_back(view(unit.buffers[m]));
    }
    // A unit's gradients are on one device; the hook runs under the stream that made them.
    const cuda::StreamGuard current(torch_stream(unit.buffers.front()));
    if (unit.grouped) {
      unit.handle = grouped_allreduce_async(std::move(views), unit.name, reduce_options());
    } else {
      unit.handle = allreduce_async(views.front(), unit.name, reduce_options());
    }
    unit.phase = Phase::InFlight;
  }

  void finish(Unit& unit) TUTTI_REQUIRES(mutex) {
    torch::NoGradGuard no_grad;
    for (std::size_t m = 0; m < unit.members.size(); ++m) {
      torch::Tensor grad = params[unit.members[m]].grad();
      if (!unit.buffers[m].is_same(grad)) grad.copy_(unit.buffers[m]);
    }
    unit.buffers.clear();
    unit.phase = Phase::Done;
  }

  std::exception_ptr wait_all(bool write_results) TUTTI_REQUIRES(mutex) {
    std::vector<Handle> handles;
    std::vector<Unit*> in_flight;
    for (Unit& unit : units) {
      if (unit.phase != Phase::InFlight) continue;
      handles.push_back(unit.handle);
      in_flight.push_back(&unit);
      unit.phase = Phase::Done;
    }
    try {
      tutti::wait_all(handles);
    } catch (...) {
      for (Unit* unit : in_flight) unit->buffers.clear();
      return std::current_exception();
    }
    for (Unit* unit : in_flight) {
      if (write_results) {
        finish(*unit);
      } else {
        unit->buffers.clear();
      }
    }
    return nullptr;
  }

  void add_unit(std::string name, std::vector<std::size_t> members, bool grouped)
      TUTTI_REQUIRES(mutex) {
    for (std::size_t m : members) unit_of[m] = units.size();
    Unit unit;
    unit.name = std::move(name);
    unit.members = std::move(members);
    unit.grouped = grouped;
    units.push_back(std::move(unit));
  }

  bool any_in_flight() const TUTTI_REQUIRES(mutex) {
    for (const Unit& unit : units) {
      if (unit.phase == Phase::InFlight) return true;
    }
    return false;
  }

  void new_round() TUTTI_REQUIRES(mutex) {
    std::fill(passes.begin(), passes.end(), 0);
    for (Unit& unit : units) {
      unit.ready = 0;
      unit.phase = Phase::Idle;
    }
  }

  // The post hook of parameter `index`'s gradient accumulator.
  void on_gradient(std::size_t index) TUTTI_EXCLUDES(mutex) {
    detail::MutexLock lock(mutex);
    if (!alive || !is_member()) return;
    Unit& unit = units[unit_of[index]];
    const int k = options.backward_passes_per_step;
    if (passes[index] >= k) {
      detail::throw_invalid_argument("DistributedOptimizer: backward() ran ", passes[index] + 1,
                                     " times before step() (gradient of '", names[index],
                                     "'), but backward_passes_per_step is ", k,
                                     "; call step() after every ", k,
                                     " backward passes or raise backward_passes_per_step");
    }
    if (unit.phase != Phase::Idle) {
      detail::throw_invalid_argument(
          "DistributedOptimizer: backward() after synchronize() and before step() (gradient of '",
          names[index], "'); the gradients of this step are already reduced");
    }
    if (++passes[index] < k) return;
    if (++unit.ready == unit.members.size()) start(unit);
  }

  void synchronize() TUTTI_EXCLUDES(mutex) {
    detail::MutexLock lock(mutex);
    if (units.empty() || !is_member()) return;
    std::exception_ptr first_error;
    for (Unit& unit : units) {
      if (unit.phase != Phase::Idle) continue;
      try {
        start(unit);
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    std::exception_ptr wait_error = wait_all(/*write_results=*/true);
    if (!first_error) first_error = wait_error;
    if (first_error) std::rethrow_exception(first_error);
  }
};

DistributedOptimizer::DistributedOptimizer(
    torch::optim::Optimizer& inner,
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    optim::DistributedOptions options)
    : inner_(inner), state_(std::make_shared<State>()) {
  check_options(options);
  State& s = *state_;
  s.options = std::move(options);

  // The inner optimizer's trainable parameters, each once (tied weights share a TensorImpl).
  std::map<const c10::TensorImpl*, std::size_t> index_of;
  for (const torch::optim::OptimizerParamGroup& group : inner.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (!p.requires_grad()) continue;
      if (!p.is_leaf()) {
        detail::throw_invalid_argument(
            "DistributedOptimizer: a parameter of the optimizer is not a leaf tensor");
      }
      if (index_of.emplace(p.unsafeGetTensorImpl(), s.params.size()).second) s.params.push_back(p);
    }
  }
  const std::size_t n = s.params.size();
  s.names.assign(n, {});
  if (named_parameters.is_empty()) {
    for (std::size_t i = 0; i < n; ++i) s.names[i] = "noname." + std::to_string(i);
  } else {
    for (const auto& item : named_parameters) {
      const auto it = index_of.find(item.value().unsafeGetTensorImpl());
      if (it != index_of.end() && s.names[it->second].empty()) s.names[it->second] = item.key();
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (s.names[i].empty()) {
      detail::throw_invalid_argument("DistributedOptimizer: parameter ", i,
                                     " of the optimizer (sizes ", s.params[i].sizes(),
                                     ") has no name in named_parameters");
    }
  }

  detail::MutexLock lock(s.mutex);
  s.unit_of.assign(n, 0);
  const std::string group_prefix = "DistributedOptimizer.grouped_allreduce.";
  std::vector<bool> grouped(n, false);
  if (s.options.num_groups > 0 && n > 0) {
    const std::size_t count =
        std::min<std::size_t>(static_cast<std::size_t>(s.options.num_groups), n);
    const std::size_t base = n / count;
    const std::size_t extra = n % count;
    std::size_t next = 0;
    for (std::size_t g = 0; g < count; ++g) {
      const std::size_t size = base + (g < extra ? 1 : 0);
      std::vector<std::size_t> members;
      for (std::size_t i = next; i < next + size; ++i) {
        members.push_back(i);
        grouped[i] = true;
      }
      next += size;
      s.add_unit(group_prefix + std::to_string(g), std::move(members), true);
    }
  } else if (!s.options.groups.empty()) {
    std::map<std::string, std::size_t> by_name;
    for (std::size_t i = 0; i < n; ++i) by_name.emplace(s.names[i], i);
    for (std::size_t g = 0; g < s.options.groups.size(); ++g) {
      const std::vector<std::string>& group = s.options.groups[g];
      if (group.empty())
        detail::throw_invalid_argument("DistributedOptimizer: group ", g, " is empty");
      std::vector<std::size_t> members;
      for (const std::string& name : group) {
        const auto it = by_name.find(name);
        if (it == by_name.end()) {
          detail::throw_invalid_argument("DistributedOptimizer: group ", g, " names '", name,
                                         "', which is not a parameter of the optimizer");
        }
        if (grouped[it->second]) {
          detail::throw_invalid_argument("DistributedOptimizer: duplicate name: parameter '", name,
                                         "' appears more than once in groups");
        }
        grouped[it->second] = true;
        members.push_back(it->second);
      }
      s.add_unit(group_prefix + std::to_string(g), std::move(members), true);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!grouped[i]) s.add_unit("DistributedOptimizer.allreduce." + s.names[i], {i}, false);
  }
  s.passes.assign(n, 0);

  const std::weak_ptr<State> weak = state_;
  for (std::size_t i = 0; i < n; ++i) {
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(s.params[i]);
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [weak, i](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list& /*inputs*/) {
          if (const std::shared_ptr<State> state = weak.lock()) state->on_gradient(i);
          return outputs;
        }));
    s.accumulators.push_back(std::move(accumulator));
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  detail::MutexLock lock(state_->mutex);
  state_->alive = false;
  static_cast<void>(state_->wait_all(/*write_results=*/false));
}

void DistributedOptimizer::synchronize() {
  synchronized_explicitly_ = true;
  state_->synchronize();
}

void DistributedOptimizer::step() {
  if (skip_depth_ == 0) {
    if (synchronized_explicitly_ && !warned_) {
      warned_ = true;
      warn_line(
          "DistributedOptimizer: step() called without skip_synchronize() after an explicit "
          "synchronize(); the gradients are not reduced twice, but wrap step() in "
          "`auto guard = optimizer.skip_synchronize();` (warned once per optimizer)");
    }
    state_->synchronize();
  } else {
    detail::MutexLock lock(state_->mutex);
    if (std::exception_ptr error = state_->wait_all(/*write_results=*/false)) {
      std::rethrow_exception(error);
    }
  }
  inner_.step();
  {
    detail::MutexLock lock(state_->mutex);
    state_->new_round();
  }
  synchronized_explicitly_ = false;
}

int DistributedOptimizer::reductions_started() const {
  detail::MutexLock lock(state_->mutex);
  int started = 0;
  for (const State::Unit& unit : state_->units) {
    if (unit.phase != State::Phase::Idle) ++started;
  }
  return started;
}

void DistributedOptimizer::zero_grad() {
  {
    detail::MutexLock lock(state_->mutex);
    if (state_->any_in_flight()) {
      detail::throw_invalid_argument(
          "DistributedOptimizer::zero_grad() while gradient allreduces are in flight (after "
          "backward(), before step() or synchronize()); their results would overwrite the zeros");
    }
  }
  inner_.zero_grad();
}

}  // namespace tutti::libtorch

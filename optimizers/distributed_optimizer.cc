// SPDX-License-Identifier: Apache-2.0
// DistributedOptimizer: per-parameter grad hooks wired to the reduction engine
// (optimizers/reduction_rounds.h), and the gradient buffers of Eigen-backed Variables.
#include "tutti/optim/distributed_optimizer.h"

#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "optimizers/optim_util.h"
#include "optimizers/reduction_rounds.h"
#include "src/base/strings.h"
#include "src/common/throw.h"
#include "tutti/half.h"
#include "tutti/runtime.h"

namespace tutti::optim {
// Named, not anonymous: State below holds one (a unity build would otherwise see a member of
// a named class whose type has internal linkage).
namespace internal {

// Note [Gradient buffers]
// Without compression a gradient is reduced where it lies, with no copy: start() swaps the
// gradient tensor out of its parameter for the unit's spare tensor of the same shape (a
// handle swap; tensors share storage), the runtime averages the gradient's storage in place,
// and finish() swaps it back, so after synchronize() grad() is the same storage as before,
// now reduced. Meanwhile the parameter holds the spare: a refused extra backward() pass adds
// into it, and nothing reads it. With FP16/BF16 compression the gradient is converted into
// the unit's buffer, which is reduced and converted back. A grad() that cannot travel (the user
// replaced it by an empty tensor, or one of another dtype or shape) travels as zeros of the
// parameter's shape through the buffer, so that this rank still takes part in the reduction the
// other ranks wait in; finish() leaves that grad() as it is and returns an InvalidArgument
// naming it, which synchronize() throws.
class VariableBuffers final : public internal::GradientBuffers {
 public:
  VariableBuffers(std::vector<nn::Variable> params, std::vector<std::string> names,
                  Compression compression)
      : params_(std::move(params)), names_(std::move(names)), compression_(compression) {}

  Handle start(const internal::ReductionUnit& unit, const ReduceOptions& options) override {
    if (buffers_.size() <= unit.index) {
      buffers_.resize(unit.index + 1);
      as_zeros_.resize(unit.index + 1);
    }
    std::vector<Tensor>& buffers = buffers_[unit.index];
    std::vector<bool>& as_zeros = as_zeros_[unit.index];
    buffers.resize(unit.members.size());
    as_zeros.assign(unit.members.size(), false);
    std::vector<TensorView> views;
    for (std::size_t m = 0; m < unit.members.size(); ++m) {
      const nn::Variable& param = params_[unit.members[m]];
      const Tensor& grad = param.grad();
      Tensor& buffer = buffers[m];
      const Shape& shape = param.value().shape();
      if (buffer.dtype() != wire_type() || buffer.shape() != shape || buffer.data() == nullptr) {
        buffer = Tensor(wire_type(), shape);
      }
      as_zeros[m] = !internal::usable_gradient(param);  // Not what the optimizers step on.
      if (as_zeros[m]) {
        if (buffer.byte_size() > 0) std::memset(buffer.data(), 0, buffer.byte_size());
      } else if (compressed()) {
        pack(grad, buffer);
      }
      views.push_back(compressed() || as_zeros[m] ? buffer.view() : grad.view());
    }
    Handle handle = unit.grouped ? grouped_allreduce_async(std::move(views), unit.name, options)
                                 : allreduce_async(views.front(), unit.name, options);
    if (!compressed()) swap_gradients(unit);  // Only once submitted: a throw changes nothing.
    return handle;
  }

  std::exception_ptr finish(const internal::ReductionUnit& unit, bool write_results) override {
    if (!compressed()) {
      swap_gradients(unit);
    } else if (write_results) {
      for (std::size_t m = 0; m < unit.members.size(); ++m) {
        if (!as_zeros_[unit.index][m])
          unpack(buffers_[unit.index][m], params_[unit.members[m]].grad());
      }
    }
    for (std::size_t m = 0; m < unit.members.size(); ++m) {
      if (as_zeros_[unit.index][m]) return cannot_travel(unit.members[m]);
    }
    return nullptr;
  }

 private:
  std::exception_ptr cannot_travel(std::size_t index) const {
    const Tensor& grad = params_[index].grad();
    const std::string what =
        grad.data() == nullptr
            ? std::string(
                  "an empty tensor (frozen with set_requires_grad(false) after the "
                  "optimizer was built?)")
            : detail::str_cat("a ", to_string(grad.dtype()), " tensor of shape ",
                              detail::shape_string(grad.shape()));
    return std::make_exception_ptr(
        Error(ErrorCode::InvalidArgument,
              detail::str_cat("DistributedOptimizer: the grad() of '", names_[index], "' is ", what,
                              ", not a float32 tensor of its parameter's shape ",
                              detail::shape_string(params_[index].value().shape()),
                              "; it was reduced as zeros and left as it is")));
  }

  DataType wire_type() const {
    switch (compression_) {
      case Compression::FP16: return DataType::Float16;
      case Compression::BF16: return DataType::BFloat16;
      case Compression::None: break;
    }
    return DataType::Float32;
  }

  bool compressed() const { return compression_ != Compression::None; }

  // Exchanges the members' gradients with the unit's spares: out of the parameters at the
  // start of a reduction, back in at its end. Not those travelling as zeros.
  void swap_gradients(const internal::ReductionUnit& unit) {
    for (std::size_t m = 0; m < unit.members.size(); ++m) {
      if (!as_zeros_[unit.index][m])
        std::swap(params_[unit.members[m]].grad(), buffers_[unit.index][m]);
    }
  }

  static void pack(const Tensor& grad, Tensor& buffer) {
    const std::span<const float> from = grad.span<float>();
    switch (buffer.dtype()) {
      case DataType::Float16: return convert(from, buffer.span<float16>());
      case DataType::BFloat16: return convert(from, buffer.span<bfloat16>());
      default:
        if (!from.empty()) std::memcpy(buffer.data(), from.data(), from.size_bytes());
        return;
    }
  }

  static void unpack(const Tensor& buffer, Tensor& grad) {
    const std::span<float> to = grad.span<float>();
    switch (buffer.dtype()) {
      case DataType::Float16: return convert(buffer.span<const float16>(), to);
      case DataType::BFloat16: return convert(buffer.span<const bfloat16>(), to);
      default:
        if (!to.empty()) std::memcpy(to.data(), buffer.data(), to.size_bytes());
        return;
    }
  }

  std::vector<nn::Variable> params_;  // The inner optimizer's.
  std::vector<std::string> names_;    // Per parameter, for messages.
  const Compression compression_;
  // Per unit, per member, what travels (Note [Gradient buffers]): while in flight, the
  // gradient itself (uncompressed) or its compressed copy; otherwise the spare or the buffer.
  std::vector<std::vector<Tensor>> buffers_;
  // Per unit, per member: its grad() could not travel and zeros did (set by start()).
  std::vector<std::vector<bool>> as_zeros_;
};

}  // namespace internal

namespace {

// Each parameter's op name: from `named_parameters`, or "noname.<index>" when it is empty; an
// empty name for parameters without a gradient (never reduced), whose given names go to
// `frozen`. Throws InvalidArgument for a repeated name, an empty Variable, or a trainable
// parameter without a name. (`params` holds each parameter once: Optimizer refuses repeats.)
std::vector<std::string> parameter_names(const std::vector<nn::Variable>& params,
                                         const nn::NamedParameters& named_parameters,
                                         std::set<std::string>& frozen) {
  const std::size_t n = params.size();
  // Parameters are identified by the address of their value tensor, which lives in the shared
  // Variable state: copies of a Variable agree, distinct Variables differ.
  std::map<const Tensor*, std::size_t> index_of;
  for (std::size_t i = 0; i < n; ++i) index_of.emplace(&params[i].value(), i);
  std::vector<std::string> names(n);
  if (named_parameters.empty()) {
    for (std::size_t i = 0; i < n; ++i) names[i] = "noname." + std::to_string(i);
  } else {
    std::set<std::string> seen;
    for (const auto& [name, variable] : named_parameters) {
      if (!seen.insert(name).second) {
        detail::throw_invalid_argument("DistributedOptimizer: parameter name '", name,
                                       "' appears more than once in named_parameters");
      }
      if (!variable.defined()) {
        detail::throw_invalid_argument("DistributedOptimizer: parameter '", name,
                                       "' is an empty nn::Variable");
      }
      const auto it = index_of.find(&variable.value());
      if (it != index_of.end() && names[it->second].empty()) names[it->second] = name;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!internal::trainable(params[i])) {
      if (!names[i].empty()) frozen.insert(names[i]);
      names[i].clear();  // Never reduced: see the header.
    } else if (names[i].empty()) {
      detail::throw_invalid_argument(
          "DistributedOptimizer: parameter ", i, " of the optimizer (shape ",
          detail::shape_string(params[i].value().shape()),
          ") has no name in named_parameters; the names must cover every parameter");
    }
  }
  return names;
}

}  // namespace

struct DistributedOptimizer::State {
  State(std::vector<nn::Variable> params, std::vector<std::string> names,
        DistributedOptions options)
      : buffers(std::move(params), names, options.compression),
        rounds(std::move(options), std::move(names), buffers, "DistributedOptimizer") {}

  internal::VariableBuffers buffers;
  internal::ReductionRounds rounds;
};

// `named_parameters` is taken by value as API.md declares it.
DistributedOptimizer::DistributedOptimizer(
    Optimizer& inner,
    nn::NamedParameters named_parameters,  // NOLINT(performance-unnecessary-value-param)
    DistributedOptions options)
    : Optimizer(inner.parameters()), inner_(inner) {
  internal::check_options(options, "DistributedOptimizer");
  // Adasum on the CPU (these are Eigen tensors) pairs ranks up recursively: refused here, not
  // from the first backward()'s hook, where an uncaught error ends the program.
  if (options.op == ReduceOp::Adasum && tutti::is_initialized()) {
    const int members = options.process_set.size();
    if ((members & (members - 1)) != 0) {
      detail::throw_invalid_argument(
          "DistributedOptimizer: op Adasum needs a process set of a "
          "power-of-two size on the CPU, got ",
          members, " ranks");
    }
  }
  std::vector<nn::Variable> params = parameters();
  std::set<std::string> frozen;
  std::vector<std::string> names = parameter_names(params, named_parameters, frozen);
  internal::refuse_frozen_in_groups(options, frozen, "DistributedOptimizer");
  state_ = std::make_shared<State>(params, names, std::move(options));
  // The hooks hold the state weakly: after the optimizer is gone they find nothing to do.
  const std::weak_ptr<State> weak = state_;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (names[i].empty()) continue;
    params[i].register_grad_hook([weak, i](nn::Variable&) {
      if (const std::shared_ptr<State> state = weak.lock()) state->rounds.on_gradient(i);
    });
    params[i].register_failed_pass_hook([weak](nn::Variable&) {
      if (const std::shared_ptr<State> state = weak.lock()) state->rounds.on_failed_pass();
    });
  }
}

DistributedOptimizer::~DistributedOptimizer() { state_->rounds.stop(); }

void DistributedOptimizer::synchronize() { state_->rounds.synchronize(); }

void DistributedOptimizer::step() {
  state_->rounds.step(skip_depth_ > 0, [this] { inner_.step(); });
}

void DistributedOptimizer::zero_grad() {
  state_->rounds.check_none_in_flight("DistributedOptimizer::zero_grad()");
  inner_.zero_grad();
  state_->rounds.clear_failure();  // Fresh gradients: a failed round no longer blocks.
}

StateDict DistributedOptimizer::state_dict() const { return inner_.state_dict(); }

void DistributedOptimizer::load_state_dict(const StateDict& state) {
  inner_.load_state_dict(state);
}

}  // namespace tutti::optim

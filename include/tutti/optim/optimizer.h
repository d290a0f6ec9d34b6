// SPDX-License-Identifier: Apache-2.0
// optim::Optimizer, the base of every optimizer, and StateDict, its serializable state.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tutti/export.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::optim {

// Everything step() depends on besides the parameters themselves, in PyTorch's vocabulary.
//   tensors: per-parameter state keyed "<parameter index>.<name>", the index being the
//            position in parameters(): "0.momentum_buffer", "3.exp_avg", "3.exp_avg_sq".
//            State a rule has not created yet (SGD's momentum buffers before the first step)
//            is absent, not zero.
//   scalars: hyper-parameters and counters by PyTorch's option names ("lr", "momentum",
//            "step", ...); booleans are 0 or 1.
// A StateDict is a snapshot: the optimizers below return copies of their tensors and copy what
// they load, so it may be kept, edited or sent while training goes on.
struct StateDict {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, double> scalars;
};

// The base of all optimizers: holds the parameters it updates and defines the interface that
// DistributedOptimizer and broadcast_optimizer_state() rely on.
//
// To write a rule, derive, pass the parameters to the protected constructor and override
// step() (and state_dict()/load_state_dict() if the rule keeps state):
//   class SignSGD : public tutti::optim::Optimizer {
//    public:
//     SignSGD(std::vector<nn::Variable> ps, double lr) : Optimizer(std::move(ps)), lr_(lr) {}
//     void step() override {
//       for (nn::Variable p : parameters()) { /* update p.value() from p.grad() */ }
//     }
//    private:
//     double lr_;
//   };
//
// Parameters are shared handles: the optimizer updates the very tensors the model uses.
// Parameters that do not require grad are kept (indices stay aligned with the caller's list)
// but skipped by zero_grad() and by the built-in rules. Not thread-safe: use an optimizer from
// one thread at a time, and not while backward() runs on another.
class TUTTI_API Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Not copyable: a copy would share the parameters and, through Tensor's shared storage,
  // the state tensors of the original, so two optimizers would update one momentum buffer.
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update to every parameter from its grad(). Local: no communication. The
  // built-in rules throw InvalidArgument, having changed nothing, if a trainable parameter's
  // grad() is not a float32 CPU tensor of its shape (grad() is writable: it may have been
  // replaced).
  virtual void step() = 0;
  // Tutti addition, for rpc::DistributedOptimizer, whose owners step only the parameters that
  // a distributed autograd context has gradients for (PyTorch's optimizers skip a parameter
  // whose grad is None): one step over the parameters i with `stepped[i]` true. The built-in
  // rules leave every other parameter as if it were not in the list: its value and its state
  // (momentum buffer, moments) stay as they are, and its grad() is not read or checked; Adam's
  // and AdamW's step count, which their parameters share, counts the step if any parameter takes
  // it. With every entry true it is step(). The default, for rules that do not override it,
  // does nothing if no parameter that requires grad is stepped, calls step() if all are, and
  // otherwise zeroes the grad() of those left out first (as zero_grad() does), so that they take
  // the step with zero gradients: override it where that would move them (momentum, decay).
  // Throws InvalidArgument, having changed nothing, unless `stepped` has one entry per parameter.
  virtual void step_only(const std::vector<bool>& stepped);
  // Sets the grad() of every parameter that requires grad to zero, in place (the tensors are
  // kept, so views of them stay valid). Local. A grad() that step() would refuse (replaced by
  // an empty tensor, or one of another dtype or shape) is replaced by a new zero-filled float32
  // tensor of the parameter's shape, as PyTorch's zero_grad() drops the gradient.
  virtual void zero_grad();

  // The parameters in the order given to the constructor.
  const std::vector<nn::Variable>& parameters() const { return parameters_; }

  // A snapshot of the optimizer's state (see StateDict). The default has no tensors and no
  // scalars, which is right for stateless rules.
  virtual StateDict state_dict() const;
  // Replaces the optimizer's state with `state`, as returned by state_dict() of an optimizer
  // of the same type over parameters of the same shapes (possibly on another rank or from a
  // checkpoint). Tensors absent from `state` are dropped; scalars absent keep their current
  // value. Throws Error(InvalidArgument), leaving the optimizer unchanged, for an unknown key,
  // a parameter index out of range, or a tensor whose shape or dtype does not match. The
  // default accepts only an empty state.
  virtual void load_state_dict(const StateDict& state);

 protected:
  // Stores `parameters`. Throws Error(InvalidArgument) for an empty (default-constructed)
  // Variable among them, or one listed twice (it would be stepped twice per step()). An empty
  // list is legal (nothing to update).
  explicit Optimizer(std::vector<nn::Variable> parameters);

 private:
  std::vector<nn::Variable> parameters_;
};

}  // namespace tutti::optim

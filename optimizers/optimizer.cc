// SPDX-License-Identifier: Apache-2.0
// optim::Optimizer's defaults and the helpers of optim_util.h.
#include "tutti/optim/optimizer.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <utility>

#include "optimizers/optim_util.h"

namespace tutti::optim {
namespace internal {

bool usable_gradient(const nn::Variable& p) {
  const Tensor& grad = p.grad();
  return grad.data() != nullptr && grad.dtype() == DataType::Float32 &&
         grad.shape() == p.value().shape() && grad.device().kind == Device::Kind::CPU;
}

void check_gradients(const std::vector<nn::Variable>& parameters, const char* who,
                     const std::vector<bool>* stepped) {
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const nn::Variable& p = parameters[i];
    if (!updated(parameters, i, stepped) || usable_gradient(p)) continue;
    const Tensor& grad = p.grad();
    detail::throw_invalid_argument(
        who, ": the gradient of parameter ", i, " (shape ", detail::shape_string(p.value().shape()),
        ") is ",
        grad.data() == nullptr ? std::string("an empty tensor (no storage)")
                               : detail::str_cat("a ", to_string(grad.dtype()), " tensor of shape ",
                                                 detail::shape_string(grad.shape())),
        "; grad() must stay a float32 CPU tensor of the parameter's shape");
  }
}

void check_stepped(const std::vector<bool>& stepped, std::size_t num_parameters, const char* who) {
  if (stepped.size() != num_parameters) {
    detail::throw_invalid_argument(who, ": got ", stepped.size(), " flags for ", num_parameters,
                                   " parameters (one per parameter)");
  }
}

StateKey parse_state_key(const std::string& key, std::size_t num_parameters, const char* who) {
  const std::size_t dot = key.find('.');
  std::size_t index = 0;
  const char* end = key.data() + (dot == std::string::npos ? 0 : dot);
  const auto [ptr, error] = std::from_chars(key.data(), end, index);
  if (dot == std::string::npos || dot == 0 || error != std::errc() || ptr != end ||
      dot + 1 == key.size()) {
    detail::throw_invalid_argument(who, "::load_state_dict: state key '", key,
                                   "' is not of the form '<parameter index>.<name>'");
  }
  if (index >= num_parameters) {
    detail::throw_invalid_argument(who, "::load_state_dict: state key '", key,
                                   "' refers to parameter ", index, " but the optimizer has ",
                                   num_parameters, " parameters");
  }
  return {index, key.substr(dot + 1)};
}

Tensor checked_state_copy(const Tensor& tensor, const nn::Variable& p, const std::string& key,
                          const char* who) {
  if (!trainable(p)) {
    detail::throw_invalid_argument(who, "::load_state_dict: state '", key,
                                   "' is for a parameter that does not require grad");
  }
  if (tensor.dtype() != DataType::Float32 || tensor.device() != Device::cpu() ||
      tensor.shape() != p.value().shape()) {
    detail::throw_invalid_argument(who, "::load_state_dict: state '", key, "' is a ",
                                   to_string(tensor.dtype()), " tensor of shape ",
                                   detail::shape_string(tensor.shape()),
                                   " but its parameter is a float32 CPU tensor of shape ",
                                   detail::shape_string(p.value().shape()));
  }
  return tensor.clone();
}

std::optional<double> find_scalar(const std::map<std::string, double>& scalars,
                                  const std::string& name) {
  const auto it = scalars.find(name);
  if (it == scalars.end()) return std::nullopt;
  return it->second;
}

void check_scalar_names(const std::map<std::string, double>& scalars,
                        const std::vector<std::string_view>& known, const char* who) {
  for (const auto& [name, value] : scalars) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      detail::throw_invalid_argument(who, "::load_state_dict: unknown scalar '", name, "'");
    }
  }
}

}  // namespace internal

Optimizer::Optimizer(std::vector<nn::Variable> parameters) : parameters_(std::move(parameters)) {
  // Parameters are told apart by the address of their value tensor, which lives in the shared
  // Variable state: copies of a Variable agree, distinct Variables differ.
  std::map<const Tensor*, std::size_t> index_of;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (!parameters_[i].defined()) {
      detail::throw_invalid_argument("Optimizer: parameter ", i,
                                     " is an empty nn::Variable; assign it before use");
    }
    const auto [it, fresh] = index_of.emplace(&parameters_[i].value(), i);
    if (!fresh) {
      detail::throw_invalid_argument("Optimizer: parameter ", i, " repeats parameter ", it->second,
                                     " (it would be stepped twice per step()); list each once");
    }
  }
}

void Optimizer::zero_grad() {
  for (const nn::Variable& p : parameters_) {
    if (!internal::trainable(p)) continue;
    nn::Variable handle = p;  // Shares the parameter's gradient.
    if (!internal::usable_gradient(p)) {
      // Replaced by something step() refuses (after a failed backward(), say): zeroing means a
      // fresh gradient, as PyTorch's zero_grad() drops it.
      handle.grad() = Tensor(DataType::Float32, p.value().shape());
      continue;
    }
    std::span<float> grad = internal::floats(handle.grad());
    std::fill(grad.begin(), grad.end(), 0.0f);
  }
}

void Optimizer::step_only(const std::vector<bool>& stepped) {
  internal::check_stepped(stepped, parameters_.size(), "Optimizer::step_only");
  bool any = false, all = true;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (!internal::trainable(parameters_[i])) continue;
    any = any || stepped[i];
    all = all && stepped[i];
  }
  if (!any) return;
  if (!all) {
    // This rule cannot leave a parameter out: the best it can do is a zero gradient.
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const nn::Variable& p = parameters_[i];
      if (stepped[i] || !internal::trainable(p)) continue;
      nn::Variable handle = p;  // Shares the parameter's gradient.
      if (!internal::usable_gradient(p)) {
        handle.grad() = Tensor(DataType::Float32, p.value().shape());
      } else {
        std::span<float> grad = internal::floats(handle.grad());
        std::fill(grad.begin(), grad.end(), 0.0f);
      }
    }
  }
  step();
}

StateDict Optimizer::state_dict() const { return {}; }

void Optimizer::load_state_dict(const StateDict& state) {
  if (!state.tensors.empty()) {
    detail::throw_invalid_argument(
        "Optimizer::load_state_dict: this optimizer keeps no state, got tensor '",
        state.tensors.front().first, "'");
  }
  if (!state.scalars.empty()) {
    detail::throw_invalid_argument(
        "Optimizer::load_state_dict: this optimizer keeps no state, got scalar '",
        state.scalars.begin()->first, "'");
  }
}

}  // namespace tutti::optim

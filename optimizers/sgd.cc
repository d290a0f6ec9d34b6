// SPDX-License-Identifier: Apache-2.0
// optim::SGD: torch.optim.SGD's single-tensor update, element by element in float32.
#include "tutti/optim/sgd.h"

#include <cmath>
#include <string_view>
#include <utility>

#include "optimizers/optim_util.h"

namespace tutti::optim {
namespace {

constexpr const char* kWho = "SGD";

void check_options(const SGDOptions& o) {
  // `!(x >= 0)` also rejects NaN.
  if (!(o.lr >= 0)) detail::throw_invalid_argument("SGD: invalid learning rate ", o.lr);
  if (!(o.momentum >= 0)) detail::throw_invalid_argument("SGD: invalid momentum ", o.momentum);
  if (!(o.weight_decay >= 0)) {
    detail::throw_invalid_argument("SGD: invalid weight_decay ", o.weight_decay);
  }
  if (!std::isfinite(o.dampening))
    detail::throw_invalid_argument("SGD: invalid dampening ", o.dampening);
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    detail::throw_invalid_argument(
        "SGD: nesterov momentum requires a momentum > 0 and zero dampening, got momentum ",
        o.momentum, " and dampening ", o.dampening);
  }
}

}  // namespace

SGD::SGD(std::vector<nn::Variable> params, SGDOptions options)
    : Optimizer(std::move(params)), options_(options) {
  check_options(options_);
  momentum_buffers_.resize(parameters().size());
}

void SGD::set_lr(double lr) {
  SGDOptions changed = options_;
  changed.lr = lr;
  check_options(changed);
  options_ = changed;
}

void SGD::step() { update(nullptr); }

void SGD::step_only(const std::vector<bool>& stepped) {
  internal::check_stepped(stepped, parameters().size(), "SGD::step_only");
  update(&stepped);
}

void SGD::update(const std::vector<bool>* stepped) {
  internal::check_gradients(parameters(), stepped ? "SGD::step_only" : "SGD::step", stepped);
  const auto weight_decay = static_cast<float>(options_.weight_decay);
  const auto momentum = static_cast<float>(options_.momentum);
  const auto keep = static_cast<float>(1.0 - options_.dampening);
  const auto lr = static_cast<float>(options_.lr);
  for (std::size_t i = 0; i < parameters().size(); ++i) {
    const nn::Variable& p = parameters()[i];
    if (!internal::updated(parameters(), i, stepped)) continue;
    const std::span<float> value = internal::floats(p.value());
    const std::span<const float> grad = internal::floats(p.grad());
    std::optional<Tensor>& buffer = momentum_buffers_[i];
    const bool first = !buffer.has_value();
    if (options_.momentum != 0 && first) buffer = Tensor(DataType::Float32, p.value().shape());
    const std::span<float> buf =
        options_.momentum != 0 ? internal::floats(*buffer) : std::span<float>();
    for (std::size_t j = 0; j < value.size(); ++j) {
      float d = grad[j];
      if (options_.weight_decay != 0) d += weight_decay * value[j];
      if (options_.momentum != 0) {
        buf[j] = first ? d : buf[j] * momentum + keep * d;  // First step: the buffer is d.
        d = options_.nesterov ? d + momentum * buf[j] : buf[j];
      }
      value[j] -= lr * d;
    }
  }
}

StateDict SGD::state_dict() const {
  StateDict state;
  for (std::size_t i = 0; i < momentum_buffers_.size(); ++i) {
    if (momentum_buffers_[i]) {
      state.tensors.emplace_back(std::to_string(i) + ".momentum_buffer",
                                 momentum_buffers_[i]->clone());
    }
  }
  state.scalars = {{"lr", options_.lr},
                   {"momentum", options_.momentum},
                   {"dampening", options_.dampening},
                   {"weight_decay", options_.weight_decay},
                   {"nesterov", options_.nesterov ? 1.0 : 0.0}};
  return state;
}

void SGD::load_state_dict(const StateDict& state) {
  internal::check_scalar_names(state.scalars,
                               {"lr", "momentum", "dampening", "weight_decay", "nesterov"}, kWho);
  SGDOptions options = options_;
  const auto& s = state.scalars;
  options.lr = internal::find_scalar(s, "lr").value_or(options.lr);
  options.momentum = internal::find_scalar(s, "momentum").value_or(options.momentum);
  options.dampening = internal::find_scalar(s, "dampening").value_or(options.dampening);
  options.weight_decay = internal::find_scalar(s, "weight_decay").value_or(options.weight_decay);
  if (const std::optional<double> nesterov = internal::find_scalar(s, "nesterov")) {
    if (*nesterov != 0 && *nesterov != 1) {
      detail::throw_invalid_argument("SGD::load_state_dict: scalar 'nesterov' must be 0 or 1, got ",
                                     *nesterov);
    }
    options.nesterov = *nesterov == 1;
  }
  check_options(options);

  std::vector<std::optional<Tensor>> buffers(parameters().size());
  for (const auto& [key, tensor] : state.tensors) {
    const internal::StateKey k = internal::parse_state_key(key, parameters().size(), kWho);
    if (k.name != "momentum_buffer") {
      detail::throw_invalid_argument("SGD::load_state_dict: unknown state '", key,
                                     "' (SGD keeps '<i>.momentum_buffer')");
    }
    if (buffers[k.index])
      detail::throw_invalid_argument("SGD::load_state_dict: repeated state '", key, "'");
    buffers[k.index] = internal::checked_state_copy(tensor, parameters()[k.index], key, kWho);
  }
  options_ = options;
  momentum_buffers_ = std::move(buffers);
}

}  // namespace tutti::optim

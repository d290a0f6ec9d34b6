// SPDX-License-Identifier: Apache-2.0
// optim::Adam and optim::AdamW: torch's single-tensor Adam update (amsgrad off), shared by both
// classes, which differ only in where the weight decay enters.
#include "tutti/optim/adam.h"

#include <cmath>
#include <string>
#include <string_view>
#include <utility>

#include "optimizers/optim_util.h"

namespace tutti::optim {
namespace {

// The options of either class, with the flavour of weight decay.
struct AdamHyper {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  bool decoupled;  // AdamW: p *= 1 - lr * wd. Adam: g += wd * p.
};

template <class Options>
AdamHyper hyper(const Options& o, bool decoupled) {
  return {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, decoupled};
}

void check(const AdamHyper& h, const char* who) {
  // `!(x >= 0)` also rejects NaN.
  if (!(h.lr >= 0)) detail::throw_invalid_argument(who, ": invalid learning rate ", h.lr);
  if (!(h.eps >= 0)) detail::throw_invalid_argument(who, ": invalid epsilon value ", h.eps);
  if (!(h.beta1 >= 0 && h.beta1 < 1))
    detail::throw_invalid_argument(who, ": invalid beta1 ", h.beta1);
  if (!(h.beta2 >= 0 && h.beta2 < 1))
    detail::throw_invalid_argument(who, ": invalid beta2 ", h.beta2);
  if (!(h.weight_decay >= 0)) {
    detail::throw_invalid_argument(who, ": invalid weight_decay value ", h.weight_decay);
  }
}

// Lerp as PyTorch's CPU kernel computes it: from the nearer end, for accuracy.
inline float lerp(float self, float end, float weight) {
  return weight < 0.5f ? self + weight * (end - self) : end - (end - self) * (1.0f - weight);
}

// One step (number `step`, counted from 1) over the trainable parameters `stepped` selects (all
// when null).
void adam_step(const std::vector<nn::Variable>& params, const AdamHyper& h, std::int64_t step,
               std::vector<std::optional<Tensor>>& exp_avg,
               std::vector<std::optional<Tensor>>& exp_avg_sq,
               const std::vector<bool>* stepped = nullptr) {
  const double bias_correction1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
  const auto step_size = static_cast<float>(h.lr / bias_correction1);
  const auto bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const auto one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  const auto beta2 = static_cast<float>(h.beta2);
  const auto one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  const auto eps = static_cast<float>(h.eps);
  const auto weight_decay = static_cast<float>(h.weight_decay);
  const auto decay_factor = static_cast<float>(1.0 - h.lr * h.weight_decay);

  for (std::size_t i = 0; i < params.size(); ++i) {
    const nn::Variable& p = params[i];
    if (!internal::updated(params, i, stepped)) continue;
    // State is created lazily, per parameter, as PyTorch does; a loaded state dict may lack it.
    if (!exp_avg[i]) exp_avg[i] = Tensor(DataType::Float32, p.value().shape());
    if (!exp_avg_sq[i]) exp_avg_sq[i] = Tensor(DataType::Float32, p.value().shape());
    const std::span<float> value = internal::floats(p.value());
    const std::span<const float> grad = internal::floats(p.grad());
    const std::span<float> m = internal::floats(*exp_avg[i]);
    const std::span<float> v = internal::floats(*exp_avg_sq[i]);
    for (std::size_t j = 0; j < value.size(); ++j) {
      float g = grad[j];
      if (h.weight_decay != 0) {
        if (h.decoupled) {
          value[j] *= decay_factor;
        } else {
          g += weight_decay * value[j];
        }
      }
      m[j] = lerp(m[j], g, one_minus_beta1);
      v[j] = v[j] * beta2 + one_minus_beta2 * g * g;
      const float denom = std::sqrt(v[j]) / bias_correction2_sqrt + eps;
      value[j] += -step_size * (m[j] / denom);
    }
  }
}

// step_only(): checks, then one step, counted, if it updates any parameter.
void adam_step_only(const std::vector<nn::Variable>& params, const AdamHyper& h,
                    const std::vector<bool>& stepped, const char* who, std::int64_t& step,
                    std::vector<std::optional<Tensor>>& exp_avg,
                    std::vector<std::optional<Tensor>>& exp_avg_sq) {
  internal::check_stepped(stepped, params.size(), who);
  internal::check_gradients(params, who, &stepped);
  bool any = false;
  for (std::size_t i = 0; i < params.size(); ++i)
    any = any || internal::updated(params, i, &stepped);
  if (!any) return;
  ++step;
  adam_step(params, h, step, exp_avg, exp_avg_sq, &stepped);
}

StateDict adam_state_dict(const AdamHyper& h, std::int64_t step,
                          const std::vector<std::optional<Tensor>>& exp_avg,
                          const std::vector<std::optional<Tensor>>& exp_avg_sq) {
  StateDict state;
  for (std::size_t i = 0; i < exp_avg.size(); ++i) {
    if (exp_avg[i]) state.tensors.emplace_back(std::to_string(i) + ".exp_avg", exp_avg[i]->clone());
    if (exp_avg_sq[i]) {
      state.tensors.emplace_back(std::to_string(i) + ".exp_avg_sq", exp_avg_sq[i]->clone());
    }
  }
  state.scalars = {{"lr", h.lr},
                   {"beta1", h.beta1},
                   {"beta2", h.beta2},
                   {"eps", h.eps},
                   {"weight_decay", h.weight_decay},
                   {"step", static_cast<double>(step)}};
  return state;
}

// Validates `state` completely, then replaces the optimizer's (so a bad dict changes nothing).
template <class Options>
void adam_load(const StateDict& state, const std::vector<nn::Variable>& params, const char* who,
               bool decoupled, Options& options, std::int64_t& step,
               std::vector<std::optional<Tensor>>& exp_avg,
               std::vector<std::optional<Tensor>>& exp_avg_sq) {
  const auto& s = state.scalars;
  internal::check_scalar_names(s, {"lr", "beta1", "beta2", "eps", "weight_decay", "step"}, who);
  Options loaded = options;
  loaded.lr = internal::find_scalar(s, "lr").value_or(loaded.lr);
  loaded.beta1 = internal::find_scalar(s, "beta1").value_or(loaded.beta1);
  loaded.beta2 = internal::find_scalar(s, "beta2").value_or(loaded.beta2);
  loaded.eps = internal::find_scalar(s, "eps").value_or(loaded.eps);
  loaded.weight_decay = internal::find_scalar(s, "weight_decay").value_or(loaded.weight_decay);
  check(hyper(loaded, decoupled), who);
  std::int64_t loaded_step = step;
  if (const std::optional<double> value = internal::find_scalar(s, "step")) {
    // 2^53: beyond it a double no longer holds every integer.
    if (!(*value >= 0 && *value <= 9007199254740992.0) || std::floor(*value) != *value) {
      detail::throw_invalid_argument(
          who, "::load_state_dict: scalar 'step' must be a non-negative integer, got ", *value);
    }
    loaded_step = static_cast<std::int64_t>(*value);
  }

  std::vector<std::optional<Tensor>> m(params.size());
  std::vector<std::optional<Tensor>> v(params.size());
  for (const auto& [key, tensor] : state.tensors) {
    const internal::StateKey k = internal::parse_state_key(key, params.size(), who);
    std::vector<std::optional<Tensor>>* slot = nullptr;
    if (k.name == "exp_avg") slot = &m;
    if (k.name == "exp_avg_sq") slot = &v;
    if (slot == nullptr) {
      detail::throw_invalid_argument(who, "::load_state_dict: unknown state '", key, "' (", who,
                                     " keeps '<i>.exp_avg' and '<i>.exp_avg_sq')");
    }
    if ((*slot)[k.index])
      detail::throw_invalid_argument(who, "::load_state_dict: repeated state '", key, "'");
    (*slot)[k.index] = internal::checked_state_copy(tensor, params[k.index], key, who);
  }
  // The two moments are made together by the first step: one without the other is a dict cut
  // short or edited, and reading the missing one as zeros would silently restart half the state.
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (m[i].has_value() != v[i].has_value()) {
      detail::throw_invalid_argument(
          who, "::load_state_dict: '", i, m[i] ? ".exp_avg' has no '" : ".exp_avg_sq' has no '", i,
          m[i] ? ".exp_avg_sq'" : ".exp_avg'", " (a parameter's two moments are saved together)");
    }
  }
  options = loaded;
  step = loaded_step;
  exp_avg = std::move(m);
  exp_avg_sq = std::move(v);
}

}  // namespace

Adam::Adam(std::vector<nn::Variable> params, AdamOptions options)
    : Optimizer(std::move(params)), options_(options) {
  check(hyper(options_, false), "Adam");
  exp_avg_.resize(parameters().size());
  exp_avg_sq_.resize(parameters().size());
}

void Adam::step() {
  internal::check_gradients(parameters(), "Adam::step");
  ++step_count_;
  adam_step(parameters(), hyper(options_, false), step_count_, exp_avg_, exp_avg_sq_);
}

void Adam::step_only(const std::vector<bool>& stepped) {
  adam_step_only(parameters(), hyper(options_, false), stepped, "Adam::step_only", step_count_,
                 exp_avg_, exp_avg_sq_);
}

StateDict Adam::state_dict() const {
  return adam_state_dict(hyper(options_, false), step_count_, exp_avg_, exp_avg_sq_);
}

void Adam::load_state_dict(const StateDict& state) {
  adam_load(state, parameters(), "Adam", false, options_, step_count_, exp_avg_, exp_avg_sq_);
}

void Adam::set_lr(double lr) {
  AdamOptions changed = options_;
  changed.lr = lr;
  check(hyper(changed, false), "Adam");
  options_ = changed;
}

AdamW::AdamW(std::vector<nn::Variable> params, AdamWOptions options)
    : Optimizer(std::move(params)), options_(options) {
  check(hyper(options_, true), "AdamW");
  exp_avg_.resize(parameters().size());
  exp_avg_sq_.resize(parameters().size());
}

void AdamW::step() {
  internal::check_gradients(parameters(), "AdamW::step");
  ++step_count_;
  adam_step(parameters(), hyper(options_, true), step_count_, exp_avg_, exp_avg_sq_);
}

void AdamW::step_only(const std::vector<bool>& stepped) {
  adam_step_only(parameters(), hyper(options_, true), stepped, "AdamW::step_only", step_count_,
                 exp_avg_, exp_avg_sq_);
}

StateDict AdamW::state_dict() const {
  return adam_state_dict(hyper(options_, true), step_count_, exp_avg_, exp_avg_sq_);
}

void AdamW::load_state_dict(const StateDict& state) {
  adam_load(state, parameters(), "AdamW", true, options_, step_count_, exp_avg_, exp_avg_sq_);
}

void AdamW::set_lr(double lr) {
  AdamWOptions changed = options_;
  changed.lr = lr;
  check(hyper(changed, true), "AdamW");
  options_ = changed;
}

}  // namespace tutti::optim

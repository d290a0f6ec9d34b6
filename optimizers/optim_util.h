// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the optimizers: the "<index>.<name>" state keys and state checks. Messages
// are built with the project's header-only helpers (src/base/strings.h, throw.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/strings.h"
#include "src/common/throw.h"
#include "tutti/collectives.h"
#include "tutti/error.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::optim::internal {

// True if `p` has a gradient the rules should use (a parameter that requires grad).
inline bool trainable(const nn::Variable& p) { return p.requires_grad(); }

// Waits for `handles` (ignoring their errors) and rethrows the exception being handled: what
// a failed submission of a batch of collectives does, so that no buffer goes away under the
// runtime while the ops already submitted still read or write it.
[[noreturn]] inline void drain_and_rethrow(std::vector<Handle>& handles) {
  try {
    wait_all(handles);
  } catch (...) {  // The submission error is the one to report.
  }
  throw;
}

// The float32 elements of a parameter's value or gradient.
inline std::span<float> floats(const Tensor& t) { return t.span<float>(); }

// Whether p's grad() is a float32 CPU tensor of its value's shape with storage.
bool usable_gradient(const nn::Variable& p);

// Throws InvalidArgument naming `who` (e.g. "SGD::step") and the parameter unless every
// trainable parameter's grad() is usable_gradient(); with `stepped` (step_only()'s), only of
// the parameters it selects.
// Optimizers check all of them before changing any, so a bad gradient loses nothing; grad()
// is writable, so a user can have replaced it with anything.
void check_gradients(const std::vector<nn::Variable>& parameters, const char* who,
                     const std::vector<bool>* stepped = nullptr);

// Throws InvalidArgument naming `who` unless step_only()'s `stepped` has one entry per parameter.
void check_stepped(const std::vector<bool>& stepped, std::size_t num_parameters, const char* who);

// Whether a step updates parameter `i`: it is trainable and `stepped` (null: all) selects it.
inline bool updated(const std::vector<nn::Variable>& parameters, std::size_t i,
                    const std::vector<bool>* stepped) {
  return trainable(parameters[i]) && (stepped == nullptr || (*stepped)[i]);
}

// A state tensor key split into its parameter index and state name ("3.exp_avg" -> 3,
// "exp_avg"). Throws InvalidArgument naming `who` for a malformed key or an index not below
// `num_parameters`.
struct StateKey {
  std::size_t index;
  std::string name;
};
StateKey parse_state_key(const std::string& key, std::size_t num_parameters, const char* who);

// Checks that `tensor` may be the state of parameter `p` (float32, same shape) and returns a
// private copy. Throws InvalidArgument naming `who` and `key` otherwise.
Tensor checked_state_copy(const Tensor& tensor, const nn::Variable& p, const std::string& key,
                          const char* who);

// A scalar from a state dict, if present.
std::optional<double> find_scalar(const std::map<std::string, double>& scalars,
                                  const std::string& name);

// Throws InvalidArgument naming `who` for a scalar that is not one of `known`.
void check_scalar_names(const std::map<std::string, double>& scalars,
                        const std::vector<std::string_view>& known, const char* who);

}  // namespace tutti::optim::internal

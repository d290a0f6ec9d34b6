// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the optimizers: error messages and the "<index>.<name>" state keys.
// Private to optimizers/, which sees only the public API (STYLE.md section 7), so these do not
// reuse src/common.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/error.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::optim::internal {

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <class... Args>
[[noreturn]] void invalid_argument(const Args&... args) {
  throw Error(ErrorCode::InvalidArgument, cat(args...));
}

// "[17, 3]"
std::string shape_string(const Shape& shape);

// True if `p` has a gradient the rules should use (a parameter that requires grad).
inline bool trainable(const nn::Variable& p) { return p.requires_grad(); }

// The float32 elements of a parameter's value or gradient.
inline std::span<float> floats(const Tensor& t) { return t.span<float>(); }

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

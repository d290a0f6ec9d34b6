// SPDX-License-Identifier: Apache-2.0
// broadcast_parameters() and broadcast_optimizer_state(): the root's model and optimizer state
// to every rank, through the public collectives.
#include "tutti/optim/broadcast.h"

#include <cstdint>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "optimizers/optim_util.h"
#include "tutti/collectives.h"
#include "tutti/runtime.h"
#include "tutti/serialize.h"

namespace tutti::optim {
namespace {

// The root's description of its state dict, as broadcast_object carries it. Native byte order
// and sizes: every rank of a job runs the same build.
struct StateLayout {
  std::string error;  // Non-empty: the root found its state dict unusable; every rank throws.
  struct Entry {
    std::string key;
    DataType dtype;
    Shape shape;
  };
  std::vector<Entry> tensors;
  std::vector<std::string> scalar_names;
};

std::string encode(const StateLayout& layout) {
  ByteWriter w;
  w.put_string(layout.error);
  w.put<std::uint64_t>(layout.tensors.size());
  for (const StateLayout::Entry& e : layout.tensors) {
    w.put_string(e.key);
    w.put(static_cast<std::uint8_t>(e.dtype));
    w.put_vector(e.shape);
  }
  w.put<std::uint64_t>(layout.scalar_names.size());
  for (const std::string& name : layout.scalar_names) w.put_string(name);
  return w.take();
}

StateLayout decode(std::string_view bytes) {
  ByteReader r(bytes);
  StateLayout layout;
  std::size_t tensors = 0;
  r.get_string(&layout.error);
  r.get_count(&tensors, 1);
  for (std::size_t i = 0; i < tensors && r.ok(); ++i) {
    StateLayout::Entry e;
    r.get_string(&e.key);
    r.get_enum(&e.dtype, static_cast<int>(DataType::Bool) + 1);
    r.get_vector(&e.shape);
    layout.tensors.push_back(std::move(e));
  }
  std::size_t scalars = 0;
  r.get_count(&scalars, 1);
  for (std::size_t i = 0; i < scalars && r.ok(); ++i) {
    std::string name;
    r.get_string(&name);
    layout.scalar_names.push_back(std::move(name));
  }
  if (!r.done())
    throw Error(ErrorCode::Internal, "broadcast_optimizer_state: malformed state layout");
  return layout;
}

}  // namespace

// ProcessSet is taken by value, as the collectives take it (a cheap handle).
void broadcast_parameters(const nn::NamedParameters& params, int root_rank,
                          ProcessSet process_set) {  // NOLINT(performance-unnecessary-value-param)
  std::set<std::string> seen;
  for (const auto& [name, variable] : params) {
    if (!seen.insert(name).second) {
      detail::throw_invalid_argument("broadcast_parameters: parameter name '", name,
                                     "' appears more than once");
    }
    if (!variable.defined()) {
      detail::throw_invalid_argument("broadcast_parameters: parameter '", name,
                                     "' is an empty nn::Variable");
    }
  }
  std::vector<Handle> handles;
  handles.reserve(params.size());
  try {
    for (const auto& [name, variable] : params) {
      handles.push_back(broadcast_async(variable.value(), root_rank, "broadcast_parameters." + name,
                                        process_set));
    }
  } catch (...) {
    // Let the broadcasts already started finish before their tensors can go away.
    try {
      wait_all(handles);
    } catch (...) {  // The submission error below is the one to report.
    }
    throw;
  }
  wait_all(handles);
}

void broadcast_optimizer_state(
    Optimizer& optimizer, int root_rank,
    ProcessSet process_set) {  // NOLINT(performance-unnecessary-value-param)
  const bool is_root = process_set.included() && tutti::rank() == root_rank;
  // Only the root's state dict is needed; another rank's saves allocating tensors where it
  // matches, but a rank may have none to give (a ZeroRedundancyOptimizer's state_dict() works
  // only on the rank it consolidated to): it starts from an empty one.
  StateDict local;
  std::string root_error;
  try {
    local = optimizer.state_dict();
  } catch (const std::exception& e) {  // Error, or a user optimizer's own exception.
    if (is_root) root_error = std::string("the root's state_dict() failed: ") + e.what();
  } catch (...) {
    if (is_root) root_error = "the root's state_dict() threw a non-std::exception";
  }

  // 1. The root's keys, dtypes, shapes and scalar names. A root-side problem travels as an
  //    error string so that every rank fails the same way instead of waiting for tensors.
  std::string message;
  if (is_root) {
    StateLayout layout;
    layout.error = root_error;
    std::set<std::string> keys;
    for (const auto& [key, tensor] : local.tensors) {
      if (!keys.insert(key).second && layout.error.empty()) {
        layout.error = "the root's state dict repeats tensor '" + key + "'";
      }
      layout.tensors.push_back({key, tensor.dtype(), tensor.shape()});
    }
    for (const auto& [name, value] : local.scalars) layout.scalar_names.push_back(name);
    message = encode(layout);
  }
  const StateLayout layout =
      decode(broadcast_object(message, root_rank, "broadcast_optimizer_state.keys", process_set));
  if (!layout.error.empty())
    detail::throw_invalid_argument("broadcast_optimizer_state: ", layout.error);

  // 2. Every rank holds a tensor of the root's dtype and shape under each of the root's keys:
  //    its own where it matches, a new one otherwise; keys the root lacks are dropped.
  std::map<std::string, Tensor> mine;
  for (auto& [key, tensor] : local.tensors) mine.emplace(key, std::move(tensor));
  StateDict result;
  for (const StateLayout::Entry& e : layout.tensors) {
    const auto it = mine.find(e.key);
    if (it != mine.end() && it->second.dtype() == e.dtype && it->second.shape() == e.shape &&
        it->second.device() == Device::cpu()) {
      result.tensors.emplace_back(e.key, it->second);
    } else {
      result.tensors.emplace_back(e.key, Tensor(e.dtype, e.shape));
    }
  }
  // 3. The values: each tensor under its key, the scalars packed into one float64 tensor.
  Tensor scalars(DataType::Float64, {static_cast<std::int64_t>(layout.scalar_names.size())});
  if (is_root) {
    std::span<double> values = scalars.span<double>();
    for (std::size_t i = 0; i < layout.scalar_names.size(); ++i) {
      values[i] = local.scalars.at(layout.scalar_names[i]);
    }
  }
  std::vector<Handle> handles;
  try {
    for (const auto& [key, tensor] : result.tensors) {
      handles.push_back(
          broadcast_async(tensor, root_rank, "broadcast_optimizer_state." + key, process_set));
    }
    if (!layout.scalar_names.empty()) {
      handles.push_back(
          broadcast_async(scalars, root_rank, "broadcast_optimizer_state.scalars", process_set));
    }
  } catch (...) {
    internal::drain_and_rethrow(handles);
  }
  wait_all(handles);
  const std::span<const double> values = scalars.span<double>();
  for (std::size_t i = 0; i < layout.scalar_names.size(); ++i) {
    result.scalars[layout.scalar_names[i]] = values[i];
  }
  // 4. The root loads its own state too, which keeps every rank's sequence of calls the same.
  optimizer.load_state_dict(result);
}

}  // namespace tutti::optim

// SPDX-License-Identifier: Apache-2.0
// broadcast_parameters() and broadcast_optimizer_state(): the root's model and optimizer state
// to every rank, through the public collectives.
#include "tutti/optim/broadcast.h"

#include <cstdint>
#include <cstring>
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

namespace tutti::optim {
namespace {

// Waits for every handle, then rethrows the first failure: the tensors of the others must not
// be released while the runtime still writes them.
void wait_all(std::vector<Handle>& handles) {
  std::exception_ptr first_error;
  for (Handle& handle : handles) {
    try {
      handle.wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

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

class Writer {
 public:
  void u64(std::uint64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void i64(std::int64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(std::string_view s) {
    u64(s.size());
    bytes_.append(s);
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  std::uint64_t u64() {
    std::uint64_t v = 0;
    copy(&v, sizeof v);
    return v;
  }
  std::int64_t i64() {
    std::int64_t v = 0;
    copy(&v, sizeof v);
    return v;
  }
  std::string str() {
    const std::uint64_t size = u64();
    need(size);
    std::string s(bytes_.substr(offset_, size));
    offset_ += size;
    return s;
  }

 private:
  void need(std::uint64_t size) const {
    if (size > bytes_.size() - offset_) {
      throw Error(ErrorCode::Internal, "broadcast_optimizer_state: malformed state layout");
    }
  }
  void copy(void* out, std::size_t size) {
    need(size);
    std::memcpy(out, bytes_.data() + offset_, size);
    offset_ += size;
  }

  std::string_view bytes_;
  std::size_t offset_ = 0;
};

std::string encode(const StateLayout& layout) {
  Writer w;
  w.str(layout.error);
  w.u64(layout.tensors.size());
  for (const StateLayout::Entry& e : layout.tensors) {
    w.str(e.key);
    w.u64(static_cast<std::uint64_t>(e.dtype));
    w.u64(e.shape.size());
    for (std::int64_t d : e.shape) w.i64(d);
  }
  w.u64(layout.scalar_names.size());
  for (const std::string& name : layout.scalar_names) w.str(name);
  return w.take();
}

StateLayout decode(std::string_view bytes) {
  Reader r(bytes);
  StateLayout layout;
  layout.error = r.str();
  const std::uint64_t tensors = r.u64();
  for (std::uint64_t i = 0; i < tensors; ++i) {
    StateLayout::Entry e;
    e.key = r.str();
    e.dtype = static_cast<DataType>(r.u64());
    const std::uint64_t dims = r.u64();
    for (std::uint64_t d = 0; d < dims; ++d) e.shape.push_back(r.i64());
    layout.tensors.push_back(std::move(e));
  }
  const std::uint64_t scalars = r.u64();
  for (std::uint64_t i = 0; i < scalars; ++i) layout.scalar_names.push_back(r.str());
  return layout;
}

}  // namespace

// ProcessSet is taken by value, as the collectives take it (a cheap handle).
void broadcast_parameters(const nn::NamedParameters& params, int root_rank,
                          ProcessSet process_set) {  // NOLINT(performance-unnecessary-value-param)
  std::set<std::string> seen;
  for (const auto& [name, variable] : params) {
    if (!seen.insert(name).second) {
      internal::invalid_argument("broadcast_parameters: parameter name '", name,
                                 "' appears more than once");
    }
    if (!variable.defined()) {
      internal::invalid_argument("broadcast_parameters: parameter '", name,
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
  StateDict local = optimizer.state_dict();
  const bool is_root = process_set.included() && tutti::rank() == root_rank;

  // 1. The root's keys, dtypes, shapes and scalar names. A root-side problem travels as an
  //    error string so that every rank fails the same way instead of waiting for tensors.
  std::string message;
  if (is_root) {
    StateLayout layout;
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
    internal::invalid_argument("broadcast_optimizer_state: ", layout.error);

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
    try {
      wait_all(handles);
    } catch (...) {  // The submission error is the one to report.
    }
    throw;
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

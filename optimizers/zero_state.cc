// SPDX-License-Identifier: Apache-2.0
// ZeroRedundancyOptimizer's state dict (tutti/optim/zero.h): consolidation, a gather of every
// member's shard state translated to the unsharded layout, and loading a state of any set size.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "optimizers/optim_util.h"
#include "optimizers/zero_layout.h"
#include "tutti/collectives.h"
#include "tutti/optim/zero.h"
#include "tutti/serialize.h"

namespace tutti::optim {
namespace {

// One member's state in the unsharded layout, as the gather carries it: an error string (the
// local optimizer's state dict could not be translated; the consolidating rank throws it), the
// tensors (global key, dtype, shape, bytes) and the scalars.
std::string encode_shard(const StateDict& local, const std::vector<std::size_t>& shard) {
  ByteWriter w;
  std::string error;
  std::vector<std::string> keys;
  try {
    for (const auto& [key, tensor] : local.tensors) {
      const internal::StateKey k = internal::parse_state_key(key, shard.size(), internal::kWho);
      keys.push_back(std::to_string(shard[k.index]) + "." + k.name);
    }
  } catch (const Error& e) {
    error = std::string("the local optimizer's state dict: ") + e.what();
  }
  w.put_string(error);
  w.put<std::uint64_t>(error.empty() ? local.tensors.size() : 0);
  for (std::size_t t = 0; error.empty() && t < local.tensors.size(); ++t) {
    const Tensor& tensor = local.tensors[t].second;
    w.put_string(keys[t]);
    w.put(static_cast<std::uint8_t>(tensor.dtype()));
    w.put_vector(tensor.shape());
    w.put_string(std::string_view(static_cast<const char*>(tensor.data()), tensor.byte_size()));
  }
  w.put<std::uint64_t>(local.scalars.size());
  for (const auto& [name, value] : local.scalars) {
    w.put_string(name);
    w.put(value);
  }
  return w.take();
}

struct Entry {
  std::size_t index;  // Among all parameters: the unsharded order.
  std::string key;
  Tensor tensor;
};

// Reads one member's encode_shard() from `r` into `entries` (and `scalars` if given).
void decode_shard(ByteReader& r, std::vector<Entry>& entries,
                  std::map<std::string, double>* scalars, std::size_t num_parameters) {
  std::string error;
  std::size_t tensors = 0;
  r.get_string(&error);
  if (!error.empty())
    detail::throw_invalid_argument(internal::kWho, "::consolidate_state_dict: ", error);
  r.get_count(&tensors, 1);
  for (std::size_t t = 0; t < tensors && r.ok(); ++t) {
    std::string key, bytes;
    DataType dtype = DataType::Float32;
    Shape shape;
    r.get_string(&key);
    r.get_enum(&dtype, static_cast<int>(DataType::Bool) + 1);
    r.get_vector(&shape);
    r.get_string(&bytes);
    if (!r.ok()) break;
    Tensor tensor(dtype, shape);
    if (bytes.size() != tensor.byte_size()) break;
    if (!bytes.empty()) std::memcpy(tensor.data(), bytes.data(), bytes.size());
    const internal::StateKey k = internal::parse_state_key(key, num_parameters, internal::kWho);
    entries.push_back({k.index, std::move(key), std::move(tensor)});
  }
  std::size_t count = 0;
  r.get_count(&count, 1);
  for (std::size_t s = 0; s < count && r.ok(); ++s) {
    std::string name;
    double value = 0;
    r.get_string(&name);
    r.get(&value);
    if (scalars != nullptr && r.ok()) (*scalars)[name] = value;
  }
  if (!r.ok()) throw Error(ErrorCode::Internal, "ZeroRedundancyOptimizer: malformed shard state");
}

}  // namespace

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const ProcessSet& set = options_.process_set;
  const std::vector<int>& members = set.ranks();
  if (std::find(members.begin(), members.end(), to) == members.end()) {
    detail::throw_invalid_argument(internal::kWho, "::consolidate_state_dict: rank ", to,
                                   " is not a member of process set ", set.id());
  }
  check_layout();
  const int me = set.rank();
  const std::string mine =
      encode_shard(local_->state_dict(), layout_->shards[static_cast<std::size_t>(me)]);
  Tensor bytes(DataType::UInt8, {static_cast<std::int64_t>(mine.size())});
  if (!mine.empty()) std::memcpy(bytes.data(), mine.data(), mine.size());
  consolidated_.reset();
  consolidated_to_.reset();
  // A joined member (tutti::join()) would contribute no shard to the gather: beside it, one
  // element counts the members (a joined member contributes zero), so that every live member
  // throws the same InvalidArgument, also when `to` is the joined one.
  std::int32_t live = 1;
  const bool count = set.size() > 1;
  std::vector<Handle> handles;
  try {
    if (count) handles.push_back(internal::count_members(live, set, "consolidate"));
    handles.push_back(gather_async(bytes, to, std::string(internal::kWho) + ".consolidate", set));
  } catch (...) {
    internal::drain_and_rethrow(handles);
  }
  std::exception_ptr count_error, gather_error;
  for (std::size_t h = 0; h < handles.size(); ++h) {
    try {
      handles[h].wait();
    } catch (...) {
      (count && h == 0 ? count_error : gather_error) = std::current_exception();
    }
  }
  if (count_error) std::rethrow_exception(count_error);
  internal::require_every_member(live, set, "consolidate_state_dict");
  if (gather_error) std::rethrow_exception(gather_error);
  if (members[static_cast<std::size_t>(me)] != to) {
    consolidated_to_ = to;
    return;
  }

  const Tensor& gathered = handles.back().output();
  ByteReader reader(
      std::string_view(static_cast<const char*>(gathered.data()), gathered.byte_size()));
  std::vector<Entry> entries;
  StateDict state;
  for (int r = 0; r < set.size(); ++r) {
    decode_shard(reader, entries, r == 0 ? &state.scalars : nullptr, parameters().size());
  }
  if (!reader.done()) throw Error(ErrorCode::Internal, "ZeroRedundancyOptimizer: trailing bytes");
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.index < b.index; });
  for (Entry& e : entries) state.tensors.emplace_back(std::move(e.key), std::move(e.tensor));
  consolidated_ = std::move(state);
  consolidated_to_ = to;
}

StateDict ZeroRedundancyOptimizer::state_dict() const {
  if (!consolidated_to_) {
    detail::throw_invalid_argument(internal::kWho,
                                   "::state_dict: the state is sharded; call "
                                   "consolidate_state_dict() on every member first (after the "
                                   "last step())");
  }
  if (!consolidated_) {
    detail::throw_invalid_argument(internal::kWho,
                                   "::state_dict: the state was consolidated on rank ",
                                   *consolidated_to_, ", not on this one");
  }
  return *consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const StateDict& state) {
  const Layout& layout = *layout_;
  const int me = options_.process_set.rank();
  const std::vector<std::size_t>& shard = layout.shards[static_cast<std::size_t>(me)];
  StateDict local;
  local.scalars = state.scalars;
  for (const auto& [key, tensor] : state.tensors) {
    const internal::StateKey k =
        internal::parse_state_key(key, parameters().size(), internal::kWho);
    if (layout.owner[k.index] < 0) {
      detail::throw_invalid_argument(internal::kWho, "::load_state_dict: state '", key,
                                     "' is for a parameter that does not require grad");
    }
    if (layout.owner[k.index] != me) continue;
    const auto j = std::find(shard.begin(), shard.end(), k.index) - shard.begin();
    local.tensors.emplace_back(std::to_string(j) + "." + k.name, tensor);
  }
  local_->load_state_dict(local);
  consolidated_to_.reset();
  consolidated_.reset();
}

}  // namespace tutti::optim

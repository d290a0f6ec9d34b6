// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/validation.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>

#include "src/base/dtype.h"
#include "src/base/strings.h"

namespace tutti::core {
namespace {

using detail::shape_string;
using detail::str_cat;

std::string_view device_name(Device::Kind kind) {
  return kind == Device::Kind::CPU ? "CPU" : "CUDA";
}

std::string dims_after_first(std::span<const std::int64_t> shape) {
  return shape_string(shape.subspan(shape.empty() ? 0 : 1));
}

// The error text of API.md: "Mismatched ALLREDUCE tensor shapes for 'x': rank 0 sent [17, 3],
// rank 2 sent [17, 4]".
Response mismatch(const Request& first, int first_rank, int other_rank, std::string_view what,
                  const std::string& first_value, const std::string& other_value,
                  std::string_view tensor) {
  Response response;
  response.ok = false;
  response.error_code = ErrorCode::Mismatch;
  response.error_message =
      str_cat("Mismatched ", to_string(first.op), " ", what, " for '", tensor, "': rank ",
              first_rank, " sent ", first_value, ", rank ", other_rank, " sent ", other_value);
  return response;
}

// A scale factor as the shortest text that reads back as the same double: two factors that
// differ must print differently (1.0 / 3 against 0.333333; an ostream's 6 digits showed both as
// 0.333333).
std::string exact(double value) {
  char digits[32];  // The longest shortest form, -2.2250738585072014e-308, is 24.
  const std::to_chars_result end = std::to_chars(digits, digits + sizeof digits, value);
  return std::string(digits, end.ptr);
}

std::string tensor_label(const Request& request, std::size_t index) {
  return request.tensors.size() == 1 ? request.name.str() : str_cat(request.name, "[", index, "]");
}

// Compares `other` with `first`; an error Response on the first difference.
std::optional<Response> compare(const Request& first, int first_rank, const Request& other,
                                int other_rank) {
  if (other.op != first.op) {
    Response response;
    response.ok = false;
    response.error_code = ErrorCode::Mismatch;
    response.error_message =
        str_cat("Mismatched operations for '", first.name, "': rank ", first_rank, " sent ",
                to_string(first.op), ", rank ", other_rank, " sent ", to_string(other.op));
    return response;
  }
  auto differ = [&](std::string_view what, const std::string& a, const std::string& b,
                    std::string_view tensor) {
    return mismatch(first, first_rank, other_rank, what, a, b, tensor);
  };
  if (other.device != first.device) {
    return differ("devices", std::string(device_name(first.device)),
                  std::string(device_name(other.device)), first.name);
  }
  if (other.tensors.size() != first.tensors.size()) {
    return differ("group sizes", str_cat(first.tensors.size(), " tensors"),
                  str_cat(other.tensors.size(), " tensors"), first.name);
  }
  const bool reduces = first.op == Collective::Allreduce || first.op == Collective::Reducescatter ||
                       first.op == Collective::Reduce;
  if (reduces && other.reduce_op != first.reduce_op) {
    return differ("reduction ops", std::string(to_string(first.reduce_op)),
                  std::string(to_string(other.reduce_op)), first.name);
  }
  if (reduces && other.prescale != first.prescale) {
    return differ("prescale factors", exact(first.prescale), exact(other.prescale), first.name);
  }
  if (reduces && other.postscale != first.postscale) {
    return differ("postscale factors", exact(first.postscale), exact(other.postscale), first.name);
  }
  // Broadcast and the rooted ops (-1 on both sides for the others).
  if (other.root_rank != first.root_rank) {
    return differ("root ranks", str_cat(first.root_rank), str_cat(other.root_rank), first.name);
  }
  if (first.op == Collective::AddProcessSet && other.set_ranks != first.set_ranks) {
    return differ("process set ranks", str_cat("[", detail::join_list(first.set_ranks), "]"),
                  str_cat("[", detail::join_list(other.set_ranks), "]"), first.name);
  }
  if (first.op == Collective::RemoveProcessSet && other.target_set_id != first.target_set_id) {
    return differ("process sets", str_cat(first.target_set_id), str_cat(other.target_set_id),
                  first.name);
  }
  for (std::size_t t = 0; t < first.tensors.size(); ++t) {
    const TensorSpec& a = first.tensors[t];
    const TensorSpec& b = other.tensors[t];
    // The label is made only for an error: a copy of a name longer than std::string keeps in
    // place is an allocation, once per op and rank compared (an unnamed op's is).
    if (a.dtype != b.dtype) {
      return differ("data types", std::string(to_string(a.dtype)), std::string(to_string(b.dtype)),
                    tensor_label(first, t));
    }
    // Only the root's shape counts in a scatter (negotiate_response takes it from its request).
    if (first.op == Collective::Scatter) continue;
    // Allgather, gather and alltoall may differ in dim 0; everything else must match exactly.
    const bool rows_vary = first.op == Collective::Allgather || first.op == Collective::Gather ||
                           first.op == Collective::Alltoall;
    if (rows_vary) {
      // Compared in place: printing both shapes for the comparison was two strings an op.
      if (a.shape.size() != b.shape.size() ||
          !std::equal(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end(),
                      b.shape.begin() + (b.shape.empty() ? 0 : 1))) {
        return differ("tensor shapes", shape_string(a.shape), shape_string(b.shape),
                      tensor_label(first, t));
      }
    } else if (a.shape != b.shape) {
      return differ("tensor shapes", shape_string(a.shape), shape_string(b.shape),
                    tensor_label(first, t));
    }
  }
  return std::nullopt;
}

// Why an op cannot run now that members have joined, or nullopt. `absent`: set ranks without
// data for this op; `joined`: global ranks that have joined the set. See Note [Join].
std::optional<std::string> refuse_after_join(const Request& first,
                                             const std::vector<int>& global_ranks,
                                             const std::vector<int>& absent,
                                             const std::vector<int>& joined) {
  if (absent.empty() && joined.empty()) return std::nullopt;
  std::vector<int> joined_ranks = joined;
  for (int set_rank : absent) {
    const int global = global_ranks[static_cast<std::size_t>(set_rank)];
    if (std::find(joined_ranks.begin(), joined_ranks.end(), global) == joined_ranks.end()) {
      joined_ranks.push_back(global);
    }
  }
  std::sort(joined_ranks.begin(), joined_ranks.end());
  switch (first.op) {
    case Collective::Alltoall:
    case Collective::Reducescatter:
    case Collective::Scatter:  // Every member receives a part: none may be missing.
    case Collective::AddProcessSet:
    case Collective::RemoveProcessSet:
      return str_cat(to_string(first.op), " '", first.name, "' cannot run while process set ",
                     first.process_set_id, " has joined ranks: ", detail::join_list(joined_ranks));
    case Collective::Broadcast:
    case Collective::Reduce:
    case Collective::Gather:
      for (int set_rank : absent) {
        if (global_ranks[static_cast<std::size_t>(set_rank)] == first.root_rank) {
          return str_cat(to_string(first.op), " '", first.name, "': root rank ", first.root_rank,
                         " has joined process set ", first.process_set_id);
        }
      }
      return std::nullopt;
    case Collective::Allreduce:
    case Collective::Allgather:
    case Collective::Barrier:
    case Collective::Join: return std::nullopt;
  }
  return std::nullopt;
}

// A scatter's shape and splits are the root's (the members agreed on the root and the dtype;
// a refusal after a join has ruled out a missing root). The root checked its splits at its call:
// a wrong count here is a protocol error, reported like alltoall's.
void scatter_response(const std::vector<int>& global_ranks,
                      const std::vector<std::shared_ptr<const Request>>& requests,
                      Response& response) {
  const auto root = std::find(global_ranks.begin(), global_ranks.end(), response.root_rank);
  const Request* from_root =
      root == global_ranks.end()
          ? nullptr
          : requests[static_cast<std::size_t>(root - global_ranks.begin())].get();
  if (from_root == nullptr || from_root->splits.size() != requests.size() ||
      from_root->tensors.size() != 1 || from_root->tensors.front().shape.empty()) {
    response.ok = false;
    response.error_code = ErrorCode::InvalidArgument;
    response.error_message = str_cat("SCATTER '", response.name, "': root rank ",
                                     response.root_rank, " sent no valid shape and splits");
    return;
  }
  response.tensors = from_root->tensors;
  response.splits = from_root->splits;
}

// Whether a tensor of `parts`' sum of rows, each row `spec`'s dims after the first, can exist:
// its rows, elements and bytes within int64. Each rank checked its own tensor at its call; the
// sum of the ranks' rows, which an allgather, a gather or an alltoall's receiver makes, is
// checked here, so that an impossible sum fails the op on every rank instead of the
// communication thread that would make the tensor (a negative shape stopped the runtime, and an
// alltoall's other ranks waited in the exchange).
bool fits_tensor(const std::vector<std::int64_t>& parts, const TensorSpec& spec) {
  std::int64_t rows = 0;
  for (const std::int64_t part : parts) {
    if (__builtin_add_overflow(rows, part, &rows)) return false;
  }
  std::int64_t bytes = rows;
  for (std::size_t d = 1; d < spec.shape.size(); ++d) {
    if (__builtin_mul_overflow(bytes, spec.shape[d], &bytes)) return false;
  }
  return !__builtin_mul_overflow(
      bytes, static_cast<std::int64_t>(detail::element_bytes(spec.dtype)), &bytes);
}

// Fails `response` with InvalidArgument: the rows `parts` that `whose` output ("rank 2's")
// would put together into one tensor of `spec`'s other dims are more than a tensor holds.
void refuse_rows(Response& response, std::string_view tensor, const std::string& whose,
                 const std::vector<std::int64_t>& parts, const TensorSpec& spec) {
  response.ok = false;
  response.error_code = ErrorCode::InvalidArgument;
  response.error_message = str_cat(
      to_string(response.op), " '", tensor, "': ", whose, " output would have ",
      detail::join_list(parts, " + "), " rows of ", dims_after_first(spec.shape), " ",
      to_string(spec.dtype), ", more than a tensor holds (2^63 - 1 rows, elements or bytes)");
  response.rows.clear();
  response.splits.clear();
}

}  // namespace

Response negotiate_response(const std::vector<int>& global_ranks,
                            const std::vector<std::shared_ptr<const Request>>& requests,
                            const std::vector<int>& joined) {
  // The first member that submitted the op is the reference; null slots are joined members.
  std::size_t first_index = 0;
  while (requests[first_index] == nullptr) ++first_index;
  const Request& first = *requests[first_index];
  std::vector<int> absent;  // Set ranks of joined members without data.
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] == nullptr) absent.push_back(static_cast<int>(i));
  }
  for (std::size_t i = first_index + 1; i < requests.size(); ++i) {
    if (requests[i] == nullptr) continue;
    if (std::optional<Response> error =
            compare(first, global_ranks[first_index], *requests[i], global_ranks[i])) {
      error->process_set_id = first.process_set_id;
      error->name = first.name;
      error->op = first.op;
      error->joined = absent;  // Absent members still see the name go by (Note [Join]).
      return *error;
    }
  }
  Response response;
  response.process_set_id = first.process_set_id;
  response.name = first.name;
  response.op = first.op;
  response.device = first.device;
  response.reduce_op = first.reduce_op;
  response.prescale = first.prescale;
  response.postscale = first.postscale;
  response.root_rank = first.root_rank;
  response.tensors = first.tensors;
  response.target_set_id = first.target_set_id;
  response.joined = absent;
  if (std::optional<std::string> refusal = refuse_after_join(first, global_ranks, absent, joined)) {
    response.ok = false;
    response.error_code = ErrorCode::InvalidArgument;
    response.error_message = std::move(*refusal);
    return response;
  }
  const std::size_t size = requests.size();
  if (first.op == Collective::Allgather || first.op == Collective::Gather) {
    std::vector<std::int64_t> parts;
    for (std::size_t t = 0; t < first.tensors.size(); ++t) {
      parts.clear();
      for (const auto& request : requests) {
        parts.push_back(request ? request->tensors[t].shape.at(0) : 0);
      }
      if (!fits_tensor(parts, first.tensors[t])) {
        const std::string whose = first.op == Collective::Gather
                                      ? str_cat("the root's (rank ", first.root_rank, ")")
                                      : std::string("each rank's");
        refuse_rows(response, tensor_label(first, t), whose, parts, first.tensors[t]);
        return response;
      }
      response.rows.insert(response.rows.end(), parts.begin(), parts.end());
    }
  } else if (first.op == Collective::Alltoall) {
    for (const auto& request : requests) {
      if (request->splits.size() != size) {
        response.ok = false;
        response.error_code = ErrorCode::InvalidArgument;
        response.error_message = str_cat("ALLTOALL '", first.name, "' got ", request->splits.size(),
                                         " splits from a rank of a set of ", size);
        return response;
      }
      response.splits.insert(response.splits.end(), request->splits.begin(), request->splits.end());
    }
    std::vector<std::int64_t> received(size);
    for (std::size_t to = 0; to < size; ++to) {
      for (std::size_t from = 0; from < size; ++from)
        received[from] = response.splits[from * size + to];
      if (!fits_tensor(received, first.tensors.front())) {
        refuse_rows(response, first.name, str_cat("rank ", global_ranks[to], "'s"), received,
                    first.tensors.front());
        return response;
      }
    }
  } else if (first.op == Collective::Scatter) {
    scatter_response(global_ranks, requests, response);
  } else if (first.op == Collective::AddProcessSet) {
    response.set_ranks = first.set_ranks;
    std::sort(response.set_ranks.begin(), response.set_ranks.end());
  }
  return response;
}

}  // namespace tutti::core

namespace tutti::core {

std::string_view to_string(Collective op) {
  switch (op) {
    case Collective::Allreduce: return "ALLREDUCE";
    case Collective::Allgather: return "ALLGATHER";
    case Collective::Broadcast: return "BROADCAST";
    case Collective::Alltoall: return "ALLTOALL";
    case Collective::Reducescatter: return "REDUCESCATTER";
    case Collective::Barrier: return "BARRIER";
    case Collective::Join: return "JOIN";
    case Collective::AddProcessSet: return "ADD_PROCESS_SET";
    case Collective::RemoveProcessSet: return "REMOVE_PROCESS_SET";
    case Collective::Reduce: return "REDUCE";
    case Collective::Gather: return "GATHER";
    case Collective::Scatter: return "SCATTER";
  }
  return "UNKNOWN";
}

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/message_codec.h"

#include <cstdint>

#include "ops/backend.h"
#include "src/base/strings.h"
#include "tutti/serialize.h"

namespace tutti::core {
namespace {

constexpr std::uint32_t kRequestMagic = 0x54524551;   // "TREQ"
constexpr std::uint32_t kResponseMagic = 0x54525350;  // "TRSP"
// Decoded lists are bounded so a corrupt count cannot ask for gigabytes.
constexpr std::uint64_t kMaxCount = 1u << 28;
constexpr int kErrorCodeCount = static_cast<int>(ErrorCode::Timeout) + 1;

// A shape as ByteWriter::put_vector writes a vector: the count, then the dims.
void put_dims(ByteWriter& w, const Dims& dims) {
  w.put<std::uint64_t>(dims.size());
  w.put_bytes(dims.data(), dims.size() * sizeof(std::int64_t));
}

bool get_dims(ByteReader& r, Dims* dims) {
  std::size_t n = 0;
  if (!r.get_count(&n, sizeof(std::int64_t))) return false;
  dims->resize(n);
  return r.get_bytes(dims->data(), n * sizeof(std::int64_t));
}

void put_specs(ByteWriter& w, const TensorSpecs& specs) {
  w.put<std::uint64_t>(specs.size());
  for (const TensorSpec& spec : specs) {
    w.put(static_cast<std::uint8_t>(spec.dtype));
    put_dims(w, spec.shape);
  }
}

bool get_specs(ByteReader& r, TensorSpecs* specs) {
  std::size_t n = 0;
  if (!r.get_count(&n, 9)) return false;  // A dtype byte and a shape length at least.
  specs->resize(n);
  for (TensorSpec& spec : *specs) {
    if (!r.get_enum(&spec.dtype, static_cast<int>(DataType::Bool) + 1)) return false;
    if (!get_dims(r, &spec.shape)) return false;
  }
  return true;
}

// Fields shared by Request and Response, in one order.
template <class M>
void put_common(ByteWriter& w, const M& m) {
  w.put<std::int32_t>(m.process_set_id);
  w.put_string(m.name);
  w.put(static_cast<std::uint8_t>(m.op));
  w.put(static_cast<std::uint8_t>(m.device));
  w.put(static_cast<std::uint8_t>(m.reduce_op));
  w.put(m.prescale);
  w.put(m.postscale);
  w.put<std::int32_t>(m.root_rank);
  put_specs(w, m.tensors);
  w.put_vector(m.splits);
  w.put_vector(m.set_ranks);
  w.put<std::int32_t>(m.target_set_id);
}

template <class M>
bool get_common(ByteReader& r, M* m) {
  std::int32_t set = 0;
  std::int32_t root = 0;
  std::int32_t target = 0;
  std::string_view name;
  const bool ok = r.get(&set) && r.get_string_view(&name) && r.get_enum(&m->op, kCollectiveCount) &&
                  r.get_enum(&m->device, 2) &&
                  r.get_enum(&m->reduce_op, static_cast<int>(ReduceOp::Adasum) + 1) &&
                  r.get(&m->prescale) && r.get(&m->postscale) && r.get(&root) &&
                  get_specs(r, &m->tensors) && r.get_vector(&m->splits) &&
                  r.get_vector(&m->set_ranks) && r.get(&target);
  m->name = name;  // In place up to 31 characters: no allocation (Note [Names in place]).
  m->process_set_id = set;
  m->root_rank = root;
  m->target_set_id = target;
  return ok;
}

Status corrupt(std::string_view what) {
  return Status(ErrorCode::Internal, detail::str_cat("corrupt or truncated ", what, " message"));
}

}  // namespace

std::string encode(const RequestList& list) {
  ByteWriter w;
  w.put(kRequestMagic);
  w.put<std::uint8_t>(list.shutdown ? 1 : 0);
  w.put<std::uint8_t>(list.shutdown_after_error ? 1 : 0);
  w.put(static_cast<std::uint8_t>(list.shutdown_code));
  w.put_string(list.shutdown_message);
  w.put_vector(list.cache_hits);
  w.put_vector(list.sequences);
  w.put<std::uint64_t>(list.requests.size());
  for (const Request& request : list.requests) put_common(w, request);
  return w.take();
}

Result<RequestList> decode_request_list(std::string_view bytes) {
  ByteReader r(bytes);
  RequestList list;
  std::uint32_t magic = 0;
  std::uint8_t shutdown = 0;
  std::uint8_t after_error = 0;
  std::size_t count = 0;
  if (!r.get(&magic) || magic != kRequestMagic || !r.get(&shutdown) || shutdown > 1 ||
      !r.get(&after_error) || after_error > 1 ||
      !r.get_enum(&list.shutdown_code, kErrorCodeCount) || !r.get_string(&list.shutdown_message) ||
      !r.get_vector(&list.cache_hits) || !r.get_vector(&list.sequences) ||
      !r.get_count(&count, 8, kMaxCount)) {
    return corrupt("request");
  }
  list.shutdown = shutdown == 1;
  list.shutdown_after_error = after_error == 1;
  list.requests.resize(count);
  for (Request& request : list.requests) {
    if (!get_common(r, &request)) return corrupt("request");
  }
  if (!list.sequences.empty() && list.sequences.size() != list.requests.size()) {
    return corrupt("request");
  }
  if (!r.done()) return corrupt("request");
  return list;
}

std::string encode(const ResponseList& list) {
  ByteWriter w;
  w.put(kResponseMagic);
  w.put<std::uint8_t>(list.shutdown ? 1 : 0);
  w.put<std::uint8_t>(list.shutdown_after_error ? 1 : 0);
  w.put(static_cast<std::uint8_t>(list.shutdown_code));
  w.put_string(list.shutdown_message);
  w.put_vector(list.cache_ids);
  w.put_vector(list.hit);
  w.put_vector(list.evicted);
  w.put_vector(list.resend);
  w.put<std::int64_t>(list.fusion_threshold_bytes);
  w.put<std::int64_t>(list.cycle_time_us);
  w.put<std::int32_t>(list.host_routes);
  w.put<std::uint64_t>(list.responses.size());
  for (std::size_t i = 0; i < list.responses.size(); ++i) {
    if (i < list.hit.size() && list.hit[i] > 0) continue;  // Hits carry no body.
    const Response& response = list.responses[i];
    put_common(w, response);
    w.put_vector(response.rows);
    w.put_vector(response.joined);
    w.put<std::uint8_t>(response.ok ? 1 : 0);
    w.put(static_cast<std::uint8_t>(response.error_code));
    w.put_string(response.error_message);
    w.put<std::int32_t>(response.last_joined_rank);
  }
  return w.take();
}

Result<ResponseList> decode_response_list(std::string_view bytes) {
  ByteReader r(bytes);
  ResponseList list;
  std::uint32_t magic = 0;
  std::uint8_t shutdown = 0;
  std::uint8_t after_error = 0;
  std::size_t count = 0;
  if (!r.get(&magic) || magic != kResponseMagic || !r.get(&shutdown) || shutdown > 1 ||
      !r.get(&after_error) || after_error > 1 ||
      !r.get_enum(&list.shutdown_code, kErrorCodeCount) || !r.get_string(&list.shutdown_message) ||
      !r.get_vector(&list.cache_ids) || !r.get_vector(&list.hit) || !r.get_vector(&list.evicted) ||
      !r.get_vector(&list.resend) || !r.get(&list.fusion_threshold_bytes) ||
      list.fusion_threshold_bytes < -1 || !r.get(&list.cycle_time_us) || list.cycle_time_us < -1 ||
      !r.get(&list.host_routes) || list.host_routes < -1 ||
      list.host_routes > ops::kAllHostRoutes || !r.get_count(&count, 0, kMaxCount)) {
    return corrupt("response");
  }
  list.shutdown = shutdown == 1;
  list.shutdown_after_error = after_error == 1;
  if (list.cache_ids.size() != count || list.hit.size() != count) return corrupt("response");
  list.responses.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (list.hit[i] < 0) return corrupt("response");
    if (list.hit[i] > 0) {
      // A run of hits names ids that exist: from 0, and not past the largest id.
      const std::int64_t last = std::int64_t{list.cache_ids[i]} + list.hit[i] - 1;
      if (list.cache_ids[i] < 0 || last > INT32_MAX) return corrupt("response");
      continue;
    }
    Response& response = list.responses[i];
    std::uint8_t ok = 0;
    std::int32_t last = 0;
    if (!get_common(r, &response) || !r.get_vector(&response.rows) ||
        !r.get_vector(&response.joined) || !r.get(&ok) || ok > 1 ||
        !r.get_enum(&response.error_code, kErrorCodeCount) ||
        !r.get_string(&response.error_message) || !r.get(&last)) {
      return corrupt("response");
    }
    response.ok = ok == 1;
    response.last_joined_rank = last;
  }
  if (!r.done()) return corrupt("response");
  return list;
}

}  // namespace tutti::core

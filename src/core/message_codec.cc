// SPDX-License-Identifier: Apache-2.0
#include "src/core/message_codec.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "src/common/strings.h"

namespace tutti::core {
namespace {

constexpr std::uint32_t kRequestMagic = 0x54524551;   // "TREQ"
constexpr std::uint32_t kResponseMagic = 0x54525350;  // "TRSP"
// Decoded lists and strings are bounded so a corrupt length cannot ask for gigabytes.
constexpr std::uint64_t kMaxCount = 1u << 28;

class Writer {
 public:
  template <class T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const std::size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    out_.append(s);
  }
  template <class T>
  void put_vector(const std::vector<T>& v) {
    put<std::uint32_t>(static_cast<std::uint32_t>(v.size()));
    for (const T& x : v) put(x);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads fields in order; the first short read makes every later read fail too.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  template <class T>
  bool get(T* value) {
    if (failed_ || in_.size() - at_ < sizeof(T)) return fail();
    std::memcpy(value, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool get_count(std::size_t* count, std::size_t element_bytes) {
    std::uint32_t n = 0;
    if (!get(&n)) return false;
    // Every element takes at least `element_bytes`, so more than the rest holds is corrupt.
    if (n > kMaxCount || static_cast<std::uint64_t>(n) * element_bytes > in_.size() - at_) return fail();
    *count = n;
    return true;
  }
  bool get_string(std::string* s) {
    std::size_t n = 0;
    if (!get_count(&n, 1)) return false;
    s->assign(in_.data() + at_, n);
    at_ += n;
    return true;
  }
  template <class T>
  bool get_vector(std::vector<T>* v) {
    std::size_t n = 0;
    if (!get_count(&n, sizeof(T))) return false;
    v->resize(n);
    for (T& x : *v) get(&x);
    return !failed_;
  }
  template <class E>
  bool get_enum(E* value, int count) {
    std::uint8_t raw = 0;
    if (!get(&raw)) return false;
    if (raw >= count) return fail();
    *value = static_cast<E>(raw);
    return true;
  }
  bool done() const { return !failed_ && at_ == in_.size(); }
  bool failed() const { return failed_; }

 private:
  bool fail() {
    failed_ = true;
    return false;
  }
  std::string_view in_;
  std::size_t at_ = 0;
  bool failed_ = false;
};

void put_specs(Writer& w, const std::vector<TensorSpec>& specs) {
  w.put<std::uint32_t>(static_cast<std::uint32_t>(specs.size()));
  for (const TensorSpec& spec : specs) {
    w.put(static_cast<std::uint8_t>(spec.dtype));
    w.put_vector(spec.shape);
  }
}

bool get_specs(Reader& r, std::vector<TensorSpec>* specs) {
  std::size_t n = 0;
  if (!r.get_count(&n, 5)) return false;
  specs->resize(n);
  for (TensorSpec& spec : *specs) {
    if (!r.get_enum(&spec.dtype, static_cast<int>(DataType::Bool) + 1)) return false;
    if (!r.get_vector(&spec.shape)) return false;
  }
  return true;
}

// Fields shared by Request and Response, in one order.
template <class M>
void put_common(Writer& w, const M& m) {
  w.put<std::int32_t>(m.process_set_id);
  w.put_string(m.name);
  w.put(static_cast<std::uint8_t>(m.op));
  w.put(static_cast<std::uint8_t>(m.device));
  w.put(static_cast<std::uint8_t>(m.reduce_op));
  w.put(m.prescale);
  w.put(m.postscale);
  w.put<std::int32_t>(m.root_rank);
  put_specs(w, m.tensors);
}

template <class M>
bool get_common(Reader& r, M* m) {
  std::int32_t set = 0;
  std::int32_t root = 0;
  const bool ok = r.get(&set) && r.get_string(&m->name) &&
                  r.get_enum(&m->op, kCollectiveCount) && r.get_enum(&m->device, 2) &&
                  r.get_enum(&m->reduce_op, static_cast<int>(ReduceOp::Adasum) + 1) &&
                  r.get(&m->prescale) && r.get(&m->postscale) && r.get(&root) &&
                  get_specs(r, &m->tensors);
  m->process_set_id = set;
  m->root_rank = root;
  return ok;
}

Status corrupt(std::string_view what) {
  return Status(ErrorCode::Internal, detail::str_cat("corrupt or truncated ", what, " message"));
}

}  // namespace

std::string encode(const RequestList& list) {
  Writer w;
  w.put(kRequestMagic);
  w.put<std::uint8_t>(list.shutdown ? 1 : 0);
  w.put_vector(list.cache_hits);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(list.requests.size()));
  for (const Request& request : list.requests) {
    put_common(w, request);
    w.put_vector(request.splits);
    w.put<std::int32_t>(request.target_set_id);
  }
  return w.take();
}

Result<RequestList> decode_request_list(std::string_view bytes) {
  Reader r(bytes);
  RequestList list;
  std::uint32_t magic = 0;
  std::uint8_t shutdown = 0;
  std::size_t count = 0;
  if (!r.get(&magic) || magic != kRequestMagic || !r.get(&shutdown) || shutdown > 1 ||
      !r.get_vector(&list.cache_hits) || !r.get_count(&count, 8)) {
    return corrupt("request");
  }
  list.shutdown = shutdown == 1;
  list.requests.resize(count);
  for (Request& request : list.requests) {
    std::int32_t target = 0;
    if (!get_common(r, &request) || !r.get_vector(&request.splits) || !r.get(&target)) {
      return corrupt("request");
    }
    request.target_set_id = target;
  }
  if (!r.done()) return corrupt("request");
  return list;
}

std::string encode(const ResponseList& list) {
  Writer w;
  w.put(kResponseMagic);
  w.put<std::uint8_t>(list.shutdown ? 1 : 0);
  w.put(static_cast<std::uint8_t>(list.shutdown_code));
  w.put_string(list.shutdown_message);
  w.put_vector(list.cache_ids);
  w.put_vector(list.hit);
  w.put_vector(list.evicted);
  w.put_vector(list.resend);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(list.responses.size()));
  for (std::size_t i = 0; i < list.responses.size(); ++i) {
    if (i < list.hit.size() && list.hit[i]) continue;  // A hit carries no body.
    const Response& response = list.responses[i];
    put_common(w, response);
    w.put_vector(response.rows);
    w.put_vector(response.joined);
    w.put<std::uint8_t>(response.ok ? 1 : 0);
    w.put(static_cast<std::uint8_t>(response.error_code));
    w.put_string(response.error_message);
    w.put<std::int32_t>(response.last_joined_rank);
    w.put<std::int32_t>(response.target_set_id);
  }
  return w.take();
}

Result<ResponseList> decode_response_list(std::string_view bytes) {
  Reader r(bytes);
  ResponseList list;
  std::uint32_t magic = 0;
  std::uint8_t shutdown = 0;
  std::size_t count = 0;
  if (!r.get(&magic) || magic != kResponseMagic || !r.get(&shutdown) || shutdown > 1 ||
      !r.get_enum(&list.shutdown_code, static_cast<int>(ErrorCode::Internal) + 1) ||
      !r.get_string(&list.shutdown_message) || !r.get_vector(&list.cache_ids) ||
      !r.get_vector(&list.hit) || !r.get_vector(&list.evicted) || !r.get_vector(&list.resend) ||
      !r.get_count(&count, 0)) {
    return corrupt("response");
  }
  list.shutdown = shutdown == 1;
  if (count > kMaxCount || list.cache_ids.size() != count || list.hit.size() != count) {
    return corrupt("response");
  }
  list.responses.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (list.hit[i] > 1) return corrupt("response");
    if (list.hit[i]) continue;
    Response& response = list.responses[i];
    std::uint8_t ok = 0;
    std::int32_t last = 0;
    std::int32_t target = 0;
    if (!get_common(r, &response) || !r.get_vector(&response.rows) ||
        !r.get_vector(&response.joined) || !r.get(&ok) || ok > 1 ||
        !r.get_enum(&response.error_code, static_cast<int>(ErrorCode::Internal) + 1) ||
        !r.get_string(&response.error_message) || !r.get(&last) || !r.get(&target)) {
      return corrupt("response");
    }
    response.ok = ok == 1;
    response.last_joined_rank = last;
    response.target_set_id = target;
  }
  if (!r.done()) return corrupt("response");
  return list;
}

}  // namespace tutti::core

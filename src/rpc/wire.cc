// SPDX-License-Identifier: Apache-2.0
// Byte layout (native endianness: every rank of a job runs on the same architecture), written
// with tutti::ByteWriter (tutti/serialize.h):
//   u8 fragment flag (0) | u32 magic "TRPC" | u8 format version | u8 kind | u32 epoch | u64 id |
//   kind's fields
//   request:  string function | string meta | i64 context | i64 autograd message | payload
//   response: u8 status (0 OK, else 1 + ErrorCode) | string message | string meta |
//             i64 context | i64 autograd message | payload
//   control:  u8 control kind | u64 round | u64 sent | u64 received
//   payload:  u64 n | n x (u8 requires_grad | u8 dtype | u8 ndim | ndim x i64 | data)
//             u64 m | m x (i32 owner | u64 rref | u64 fork | i32 parent) | string bytes
//   string:   u64 length | bytes
// Format 2 (this one) counts in u64, as tutti/serialize.h does; format 1 (no version byte)
// counted payload items in u32. A frame of another format is refused as corrupt.
#include "src/rpc/wire.h"

#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "src/base/strings.h"
#include "src/common/byte_buffers.h"

namespace tutti::rpc::detail {
namespace {

using ::tutti::detail::shape_string;
using ::tutti::detail::str_cat;

constexpr std::uint32_t kMagic = 0x43505254;  // "TRPC"
constexpr std::uint8_t kFormat = 2;
constexpr int kMaxDims = 32;

void put_payload(ByteWriter& w, const WirePayload& payload) {
  w.put<std::uint64_t>(payload.tensors.size());
  for (const WireTensor& t : payload.tensors) {
    w.put<std::uint8_t>(t.requires_grad ? 1 : 0);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(t.value.dtype()));
    w.put<std::uint8_t>(static_cast<std::uint8_t>(t.value.shape().size()));
    for (std::int64_t d : t.value.shape()) w.put<std::int64_t>(d);
    w.put_bytes(t.value.data(), t.value.byte_size());
  }
  w.put<std::uint64_t>(payload.rrefs.size());
  for (const WireRRef& r : payload.rrefs) {
    w.put<std::int32_t>(r.owner);
    w.put<std::uint64_t>(r.rref_id);
    w.put<std::uint64_t>(r.fork_id);
    w.put<std::int32_t>(r.parent);
  }
  w.put_string(payload.bytes);
}

// One tensor; `what` says what was wrong when it fails.
bool get_tensor(ByteReader& r, WireTensor* tensor, std::string* what) {
  std::uint8_t requires_grad = 0, dtype = 0, ndim = 0;
  if (!r.get(&requires_grad) || !r.get(&dtype) || !r.get(&ndim)) return false;
  if (requires_grad > 1 || dtype != static_cast<std::uint8_t>(DataType::Float32) ||
      ndim > kMaxDims) {
    *what = str_cat("a tensor header (requires_grad ", int(requires_grad), ", dtype ", int(dtype),
                    ", ", int(ndim), " dims) is invalid");
    return r.fail();
  }
  Shape shape(ndim);
  std::uint64_t count = 1;
  for (std::int64_t& d : shape) {
    if (!r.get(&d)) return false;
    // Bound every partial product by what the rest of the bytes can hold: no overflow.
    if (d < 0 || (d > 0 && count > r.remaining() / sizeof(float) / static_cast<std::uint64_t>(d))) {
      *what = str_cat("a tensor of shape ", shape_string(shape), " does not fit the frame");
      return r.fail();
    }
    count *= static_cast<std::uint64_t>(d);
  }
  tensor->requires_grad = requires_grad == 1;
  tensor->value = Tensor::empty(DataType::Float32, std::move(shape));  // Overwritten whole.
  return r.get_bytes(tensor->value.data(), count * sizeof(float));
}

bool get_payload(ByteReader& r, WirePayload* payload, std::string* what) {
  std::size_t tensors = 0;
  if (!r.get_count(&tensors, 3)) return false;
  payload->tensors.resize(tensors);
  for (WireTensor& t : payload->tensors) {
    if (!get_tensor(r, &t, what)) return false;
  }
  std::size_t rrefs = 0;
  if (!r.get_count(&rrefs, 24)) return false;
  payload->rrefs.resize(rrefs);
  for (WireRRef& ref : payload->rrefs) {
    std::int32_t owner = 0, parent = 0;
    if (!r.get(&owner) || !r.get(&ref.rref_id) || !r.get(&ref.fork_id) || !r.get(&parent))
      return false;
    ref.owner = owner;
    ref.parent = parent;
  }
  return r.get_string(&payload->bytes);
}

// What put_payload() writes, to the byte.
std::size_t payload_bytes(const WirePayload& payload) {
  std::size_t bytes = 8 + 8 + payload.rrefs.size() * 24 + 8 + payload.bytes.size();
  for (const WireTensor& t : payload.tensors)
    bytes += 3 + 8 * t.value.shape().size() + t.value.byte_size();
  return bytes;
}

}  // namespace

std::size_t encoded_size(const Frame& frame) {
  constexpr std::size_t kHead = 1 + 4 + 1 + 1 + 4 + 8;  // Flag to id.
  constexpr std::size_t kIds = 8 + 8;                   // Context, autograd message.
  switch (frame.kind) {
    case FrameKind::Request:
      return kHead + 8 + frame.function.size() + 8 + frame.meta.size() + kIds +
             payload_bytes(frame.payload);
    case FrameKind::Response:
      return kHead + 1 + 8 + frame.status.message().size() + 8 + frame.meta.size() + kIds +
             payload_bytes(frame.payload);
    case FrameKind::Control: return kHead + 1 + 8 + 8 + 8;
  }
  return kHead;
}

std::string encode(const Frame& frame) {
  // A buffer of the exact size, kept for reuse if large (Note [Byte buffers kept for reuse] in
  // src/common/byte_buffers.h): a frame carrying a large tensor is written once, into one
  // buffer, without the copy into a buffer twice as large that a reservation a few bytes short
  // cost for its last bytes.
  ByteWriter w(::tutti::detail::take_byte_buffer(encoded_size(frame)));
  w.put<std::uint8_t>(0);  // Fragment flag: see fragment().
  w.put<std::uint32_t>(kMagic);
  w.put<std::uint8_t>(kFormat);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(frame.kind));
  w.put<std::uint32_t>(frame.epoch);
  w.put<std::uint64_t>(frame.id);
  switch (frame.kind) {
    case FrameKind::Request:
      w.put_string(frame.function);
      w.put_string(frame.meta);
      w.put<std::int64_t>(frame.context_id);
      w.put<std::int64_t>(frame.autograd_message_id);
      put_payload(w, frame.payload);
      break;
    case FrameKind::Response:
      w.put<std::uint8_t>(
          frame.status.ok() ? 0
                            : static_cast<std::uint8_t>(1 + static_cast<int>(frame.status.code())));
      w.put_string(frame.status.message());
      w.put_string(frame.meta);
      w.put<std::int64_t>(frame.context_id);
      w.put<std::int64_t>(frame.autograd_message_id);
      put_payload(w, frame.payload);
      break;
    case FrameKind::Control:
      w.put<std::uint8_t>(static_cast<std::uint8_t>(frame.control));
      w.put<std::uint64_t>(frame.round);
      w.put<std::uint64_t>(frame.sent);
      w.put<std::uint64_t>(frame.received);
      break;
  }
  return w.take();
}

Result<Frame> decode(std::string_view bytes) {
  ByteReader r(bytes);
  Frame frame;
  std::string what;
  std::uint8_t flag = 0, format = 0, kind = 0;
  std::uint32_t magic = 0;
  if (r.get(&flag) && r.get(&magic) && r.get(&format) && r.get(&kind) && r.get(&frame.epoch) &&
      r.get(&frame.id)) {
    if (flag != 0 || magic != kMagic || format != kFormat || kind < 1 || kind > 3) {
      what = str_cat("bad header (flag ", int(flag), ", magic ", magic, ", format ", int(format),
                     ", kind ", int(kind), ")");
      r.fail();
    }
  }
  frame.kind = static_cast<FrameKind>(kind);
  if (r.ok() && frame.kind == FrameKind::Request) {
    if (r.get_string(&frame.function) && r.get_string(&frame.meta) && r.get(&frame.context_id) &&
        r.get(&frame.autograd_message_id)) {
      get_payload(r, &frame.payload, &what);
    }
  } else if (r.ok() && frame.kind == FrameKind::Response) {
    std::uint8_t code = 0;
    std::string message;
    if (r.get(&code) && r.get_string(&message) && r.get_string(&frame.meta) &&
        r.get(&frame.context_id) && r.get(&frame.autograd_message_id)) {
      if (code > 1 + static_cast<int>(ErrorCode::Timeout)) {
        what = str_cat("unknown status code ", int(code));
        r.fail();
      } else if (code != 0) {
        frame.status = Status(static_cast<ErrorCode>(code - 1), message);
      }
      if (r.ok()) get_payload(r, &frame.payload, &what);
    }
  } else if (r.ok()) {
    std::uint8_t control = 0;
    if (r.get(&control) && r.get(&frame.round) && r.get(&frame.sent) && r.get(&frame.received)) {
      if (control < 1 || control > 5) {
        what = str_cat("unknown control kind ", int(control));
        r.fail();
      }
      frame.control = static_cast<ControlKind>(control);
    }
  }
  if (r.ok() && r.remaining() != 0) {
    what = str_cat(r.remaining(), " bytes after the end of the frame");
    r.fail();
  }
  if (!r.ok()) {
    return Status(ErrorCode::Internal, str_cat("corrupt RPC frame of ", bytes.size(),
                                               " bytes: ", what.empty() ? "truncated" : what));
  }
  return frame;
}

std::vector<std::string> fragment(std::string frame, std::size_t max_piece_bytes) {
  std::vector<std::string> pieces;
  if (frame.size() <= max_piece_bytes + 1) {
    pieces.push_back(std::move(frame));
    return pieces;
  }
  for (std::size_t at = 1; at < frame.size(); at += max_piece_bytes) {
    const std::size_t size = std::min(max_piece_bytes, frame.size() - at);
    std::string piece;
    piece.reserve(size + 1);
    piece.push_back(at + size < frame.size() ? '\1' : '\0');
    piece.append(frame, at, size);
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

Result<std::optional<std::string>> Reassembler::add(int source, std::string piece) {
  if (piece.empty() || static_cast<unsigned char>(piece[0]) > 1) {
    return Status(ErrorCode::Internal, str_cat("corrupt RPC fragment from rank ", source));
  }
  const bool last = piece[0] == '\0';
  auto it = partial_.find(source);
  if (it == partial_.end()) {
    if (last) return std::optional<std::string>(std::move(piece));  // Whole: no copy.
    it = partial_.emplace(source, std::string(1, '\0')).first;
  }
  it->second.append(piece, 1, std::string::npos);
  if (!last) return std::optional<std::string>();
  std::string frame = std::move(it->second);
  partial_.erase(it);
  return std::optional<std::string>(std::move(frame));
}

}  // namespace tutti::rpc::detail

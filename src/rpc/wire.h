// SPDX-License-Identifier: Apache-2.0
// The RPC agent's frames and their bytes: requests, responses and the agent's own control
// messages, with a bounds-checked decoder (truncated or corrupt bytes are an error, never a read
// past the end), and the fragmentation that lets a frame of any size cross a control plane.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "src/common/status.h"
#include "tutti/serialize.h"
#include "tutti/tensor.h"

namespace tutti::rpc::detail {

// Frames are written and read with tutti::ByteWriter / ByteReader (tutti/serialize.h).
using ::tutti::ByteReader;
using ::tutti::ByteWriter;

// A tensor as it travels: float32 values and whether the sender's Variable required grad.
struct WireTensor {
  bool requires_grad = false;
  Tensor value;
};

// An RRef as it travels (see Note [RRef protocol] in src/rpc/rref_context.h): the owner's
// rank, the value's id, the fork id made for the receiver, and the sender (the fork's parent).
struct WireRRef {
  int owner = -1;
  std::uint64_t rref_id = 0;
  std::uint64_t fork_id = 0;
  int parent = -1;
};

struct WirePayload {
  std::vector<WireTensor> tensors;
  std::vector<WireRRef> rrefs;
  std::string bytes;
};

enum class FrameKind : std::uint8_t { Request = 1, Response = 2, Control = 3 };

// The agent's own messages (Note [Graceful shutdown] in src/rpc/agent_shutdown.cc). Not counted as
// traffic by the shutdown protocol.
enum class ControlKind : std::uint8_t {
  Goodbye = 1,
  Intent = 2,
  Probe = 3,
  Report = 4,
  Finish = 5
};

struct Frame {
  FrameKind kind = FrameKind::Request;
  std::uint32_t epoch = 0;  // init_rpc() generation: frames of an earlier agent are dropped.
  std::uint64_t id = 0;     // Request id, unique per sender and epoch; a response repeats it.

  // Request: the function to run. Response: OK, or the error the caller gets.
  std::string function;
  Status status;
  // Arguments and results of Tutti's own calls ("tutti.*"), apart from the user's Message.
  std::string meta;
  // Request and response: the distributed autograd context the call runs in (-1: none) and,
  // when this frame's tensors were recorded by a send, the send's id (-1: none).
  std::int64_t context_id = -1;
  std::int64_t autograd_message_id = -1;
  WirePayload payload;

  // Control.
  ControlKind control = ControlKind::Goodbye;
  std::uint64_t round = 0;
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
};

// The frame's bytes. They start with the one-byte fragment flag of fragment() (0), so a frame
// that fits one plane message goes out without a copy.
std::string encode(const Frame& frame);
// encode()'s size, to the byte: encode() allocates once.
std::size_t encoded_size(const Frame& frame);
// The frame, or Internal naming what is wrong with the bytes.
Result<Frame> decode(std::string_view bytes);

// Splits an encoded frame into plane messages of at most `max_piece_bytes` + 1 bytes: each is a
// flag byte (1: more pieces follow, 0: last) and a chunk. One piece when it fits.
std::vector<std::string> fragment(std::string frame, std::size_t max_piece_bytes);

// Puts fragment()'s pieces back together, per sender (pieces of one sender arrive in order,
// and one sender's frames are never interleaved). One thread.
class Reassembler {
 public:
  // The whole frame once `piece` completes one, else nothing. Internal for an empty piece.
  Result<std::optional<std::string>> add(int source, std::string piece);

 private:
  std::map<int, std::string> partial_;  // Chunks so far, after a leading 0 byte.
};

}  // namespace tutti::rpc::detail

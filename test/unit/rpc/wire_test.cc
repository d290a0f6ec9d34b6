// SPDX-License-Identifier: Apache-2.0
// The RPC wire codec: round trips, every truncation and corrupt headers are errors (never reads
// past the end), and fragmentation reassembles frames of any size.
#include "src/rpc/wire.h"

#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::test {
namespace {

using rpc::detail::ControlKind;
using rpc::detail::decode;
using rpc::detail::encode;
using rpc::detail::encoded_size;
using rpc::detail::Frame;
using rpc::detail::FrameKind;

Tensor counting(const Shape& shape) {
  Tensor t(DataType::Float32, shape);
  float v = 0.5f;
  for (float& x : t.span<float>()) x = v++;
  return t;
}

Frame sample_request() {
  Frame f;
  f.kind = FrameKind::Request;
  f.epoch = 7;
  f.id = 123456789012345ULL;
  f.function = "my_add";
  f.meta = std::string("\0\1\2meta", 7);
  f.context_id = (std::int64_t{3} << 48) | 5;
  f.autograd_message_id = 42;
  f.payload.tensors = {{.requires_grad = true, .value = counting({2, 3})},
                       {.requires_grad = false, .value = counting({})},
                       {.requires_grad = false, .value = counting({0, 4})}};
  f.payload.rrefs = {{.owner = 2, .rref_id = 99, .fork_id = 100, .parent = 1}};
  f.payload.bytes = std::string("bytes\0with nul", 14);
  return f;
}

TEST_CASE("A request frame survives encode and decode", "[rpc][wire]") {
  const Frame in = sample_request();
  Result<Frame> out = decode(encode(in));
  REQUIRE(out.ok());
  const Frame& f = out.value();
  CHECK(f.kind == FrameKind::Request);
  CHECK(f.epoch == 7);
  CHECK(f.id == in.id);
  CHECK(f.function == "my_add");
  CHECK(f.meta == in.meta);
  CHECK(f.context_id == in.context_id);
  CHECK(f.autograd_message_id == 42);
  REQUIRE(f.payload.tensors.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(f.payload.tensors[i].requires_grad == in.payload.tensors[i].requires_grad);
    CHECK(f.payload.tensors[i].value.shape() == in.payload.tensors[i].value.shape());
    const auto a = f.payload.tensors[i].value.span<float>();
    const auto b = in.payload.tensors[i].value.span<float>();
    CHECK(std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end()));
  }
  REQUIRE(f.payload.rrefs.size() == 1);
  CHECK(f.payload.rrefs[0].owner == 2);
  CHECK(f.payload.rrefs[0].rref_id == 99);
  CHECK(f.payload.rrefs[0].fork_id == 100);
  CHECK(f.payload.rrefs[0].parent == 1);
  CHECK(f.payload.bytes == in.payload.bytes);
}

TEST_CASE("Response and control frames survive encode and decode", "[rpc][wire]") {
  Frame error;
  error.kind = FrameKind::Response;
  error.id = 5;
  error.status = Status(ErrorCode::Timeout, "too slow");
  Result<Frame> e = decode(encode(error));
  REQUIRE(e.ok());
  CHECK(e.value().kind == FrameKind::Response);
  CHECK(e.value().status.code() == ErrorCode::Timeout);
  CHECK(e.value().status.message() == "too slow");

  Frame ok;
  ok.kind = FrameKind::Response;
  ok.payload.bytes = "fine";
  Result<Frame> o = decode(encode(ok));
  REQUIRE(o.ok());
  CHECK(o.value().status.ok());
  CHECK(o.value().payload.bytes == "fine");

  Frame control;
  control.kind = FrameKind::Control;
  control.control = ControlKind::Report;
  control.round = 3;
  control.sent = 11;
  control.received = 12;
  Result<Frame> c = decode(encode(control));
  REQUIRE(c.ok());
  CHECK(c.value().control == ControlKind::Report);
  CHECK(c.value().round == 3);
  CHECK(c.value().sent == 11);
  CHECK(c.value().received == 12);
}

// Sizes by the layout in wire.cc's header comment. encode() reserves encoded_size(): one too
// few, and a frame with a large tensor was copied into a buffer twice its size for its last bytes.
TEST_CASE("encoded_size() is the encoded frame's size, to the byte", "[rpc][wire]") {
  constexpr std::size_t kHead = 1 + 4 + 1 + 1 + 4 + 8;
  // function, meta, ids; then the tensors' count and the tensors (3 header bytes, 8 a dim, the
  // data): {2, 3}, a scalar, {0, 4}; one RRef; the bytes.
  const std::size_t request = kHead + (8 + 6) + (8 + 7) + 16 + 8 + (3 + 16 + 24) + (3 + 0 + 4) +
                              (3 + 16 + 0) + (8 + 24) + (8 + 14);
  CHECK(encode(sample_request()).size() == request);
  CHECK(encoded_size(sample_request()) == request);

  Frame error;
  error.kind = FrameKind::Response;
  error.status = Status(ErrorCode::Timeout, "too slow");
  const std::size_t response = kHead + 1 + (8 + 8) + (8 + 0) + 16 + 8 + 8 + (8 + 0);
  CHECK(encode(error).size() == response);
  CHECK(encoded_size(error) == response);

  Frame control;
  control.kind = FrameKind::Control;
  CHECK(encode(control).size() == kHead + 1 + 24);
  CHECK(encoded_size(control) == kHead + 1 + 24);
}

TEST_CASE("Every truncation of a frame and every extra byte is an error", "[rpc][wire]") {
  const std::string bytes = encode(sample_request());
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    Result<Frame> f = decode(std::string_view(bytes.data(), size));
    CHECK_FALSE(f.ok());
    if (!f.ok()) CHECK(f.status().code() == ErrorCode::Internal);
  }
  CHECK_FALSE(decode(bytes + "x").ok());
}

TEST_CASE("Corrupt headers, counts and shapes are errors", "[rpc][wire]") {
  const std::string good = encode(sample_request());
  SECTION("bad magic") {
    std::string bad = good;
    bad[1] ^= 0x55;
    CHECK_FALSE(decode(bad).ok());
  }
  SECTION("another format version") {  // Format 1 counted in u32 and had no version byte.
    std::string bad = good;
    bad[5] = 1;
    CHECK_FALSE(decode(bad).ok());
  }
  SECTION("unknown kind") {
    std::string bad = good;
    bad[6] = 9;
    CHECK_FALSE(decode(bad).ok());
  }
  SECTION("random single-byte corruption never crashes") {
    std::mt19937 rng(1);
    for (int i = 0; i < 2000; ++i) {
      std::string bad = good;
      bad[rng() % bad.size()] = static_cast<char>(rng());
      static_cast<void>(decode(bad));  // Any outcome but a crash or a read past the end.
    }
  }
  SECTION("a shape whose element count overflows") {
    Frame f;
    f.kind = FrameKind::Request;
    f.payload.tensors = {{.requires_grad = false, .value = counting({1})}};
    std::string bytes = encode(f);
    // The tensor's one dim sits before its 4 data bytes, the u64 RRef count and the u64 length
    // of the (empty) bytes.
    const std::size_t dim_at = bytes.size() - (4 + 8 + 8 + 8);
    const std::int64_t huge = std::int64_t{1} << 62;
    std::memcpy(bytes.data() + dim_at, &huge, sizeof huge);
    Result<Frame> r = decode(bytes);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(std::string(r.status().message()), Catch::Contains("does not fit"));
  }
}

TEST_CASE("Fragments of several senders reassemble into the frames sent", "[rpc][wire]") {
  const std::size_t piece = GENERATE(1, 7, 1000, 1 << 20);
  std::vector<std::string> frames;
  for (int n : {0, 5, 999, 4096, 100000}) {
    Frame f;
    f.kind = FrameKind::Request;
    f.id = static_cast<std::uint64_t>(n);
    f.payload.bytes = std::string(static_cast<std::size_t>(n), 'a' + static_cast<char>(n % 26));
    frames.push_back(encode(f));
  }
  rpc::detail::Reassembler reassembler;
  // Two senders interleaved piece by piece; each sender's own pieces stay in order.
  std::vector<std::vector<std::string>> streams(2);
  for (const std::string& frame : frames) {
    for (int source = 0; source < 2; ++source) {
      for (std::string& p : rpc::detail::fragment(frame, piece))
        streams[static_cast<std::size_t>(source)].push_back(std::move(p));
    }
  }
  std::vector<std::vector<std::string>> received(2);
  std::size_t next[2] = {0, 0};
  while (next[0] < streams[0].size() || next[1] < streams[1].size()) {
    for (int source = 0; source < 2; ++source) {
      auto s = static_cast<std::size_t>(source);
      if (next[s] == streams[s].size()) continue;
      Result<std::optional<std::string>> done = reassembler.add(source, streams[s][next[s]++]);
      REQUIRE(done.ok());
      if (done.value()) received[s].push_back(std::move(*done.value()));
    }
  }
  CHECK(received[0] == frames);
  CHECK(received[1] == frames);
  CHECK_FALSE(reassembler.add(0, "").ok());
  CHECK_FALSE(reassembler.add(0, "\x05junk").ok());
}

}  // namespace
}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/message_codec.h"

#include <cstdint>
#include <cstring>
#include <string>

#include <catch2/catch.hpp>

#include "test/unit/core/negotiation_fixtures.h"

namespace tutti::core {
namespace {

using test::named;

RequestList sample_requests() {
  RequestList list;
  list.shutdown = true;
  list.cache_hits = {3, 7, 42};
  Request request = named("grad.fc1");
  request.process_set_id = 2;
  request.op = Collective::Alltoall;
  request.reduce_op = ReduceOp::Max;
  request.prescale = 0.5;
  request.postscale = 4.0;
  request.root_rank = 3;
  request.splits = {1, 0, 5};
  // Three tensors and a 6-d shape: past what TensorSpecs and Dims keep in place.
  request.tensors = {TensorSpec{.dtype = DataType::BFloat16, .shape = {6, 2}},
                     TensorSpec{.dtype = DataType::Int64, .shape = {}},
                     TensorSpec{.dtype = DataType::Float32, .shape = {1, 2, 3, 4, 5, 6}}};
  list.requests.push_back(request);
  list.requests.push_back(named(""));
  list.sequences = {12, 13};  // The desync check's (TUTTI_DEBUG=DETAIL).
  return list;
}

ResponseList sample_responses() {
  ResponseList list;
  Response full;
  full.process_set_id = 1;
  full.name = "x";
  full.op = Collective::Allgather;
  full.tensors = {TensorSpec{.dtype = DataType::Float16, .shape = {0, 3}}};
  full.rows = {0, 4, 2};
  full.joined = {1};
  full.ok = false;
  full.error_code = ErrorCode::Mismatch;
  full.error_message = "Mismatched ...";
  full.last_joined_rank = 2;
  list.responses = {full, Response{}, Response{}};
  list.cache_ids = {5, 9, 20};
  list.hit = {0, 1, 300};  // Hits on id 9, and on ids 20 to 319.
  list.evicted = {1, 2};
  list.resend = {8};
  list.shutdown = true;
  list.shutdown_after_error = true;
  list.shutdown_code = ErrorCode::Stalled;
  list.shutdown_message = "stalled";
  list.fusion_threshold_bytes = std::int64_t{3} << 40;  // Beyond 32 bits.
  list.cycle_time_us = 2500;
  list.host_routes = 2;
  return list;
}

TEST_CASE("RequestList round-trips through bytes", "[codec]") {
  const RequestList list = sample_requests();
  Result<RequestList> decoded = decode_request_list(encode(list));
  REQUIRE(decoded.ok());
  CHECK(decoded.value().shutdown);
  CHECK(decoded.value().shutdown_after_error == list.shutdown_after_error);
  CHECK(decoded.value().cache_hits == list.cache_hits);
  CHECK(decoded.value().requests == list.requests);
  CHECK(decoded.value().sequences == list.sequences);
}

TEST_CASE("Names of every length round-trip, kept in place or on the heap", "[codec]") {
  // 31 characters are the most a name keeps in place (Note [Names in place]); the decoder
  // copies each name from the message, which the decoded list outlives.
  RequestList requests;
  ResponseList responses;
  std::vector<std::string> names;
  for (const std::size_t n : {0, 15, 16, 31, 32, 300}) {
    names.push_back(std::string(n, static_cast<char>('a' + names.size())));
    requests.requests.push_back(named(names.back()));
    Response response;
    response.name = names.back();
    responses.responses.push_back(response);
    responses.cache_ids.push_back(-1);
    responses.hit.push_back(0);
  }
  Result<RequestList> got_requests = [&] {
    const std::string bytes = encode(requests);
    return decode_request_list(bytes);
  }();
  Result<ResponseList> got_responses = [&] {
    const std::string bytes = encode(responses);
    return decode_response_list(bytes);
  }();
  REQUIRE(got_requests.ok());
  REQUIRE(got_responses.ok());
  REQUIRE(got_requests.value().requests.size() == names.size());
  REQUIRE(got_responses.value().responses.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    CHECK(got_requests.value().requests[i].name.str() == names[i]);
    CHECK(got_responses.value().responses[i].name.str() == names[i]);
  }
}

TEST_CASE("Sequence numbers that do not pair with the requests are a corrupt message", "[codec]") {
  RequestList list = sample_requests();
  list.sequences = {12};
  CHECK(decode_request_list(encode(list)).status().code() == ErrorCode::Internal);
  list.sequences.clear();  // None at all: the check is off.
  CHECK(decode_request_list(encode(list)).ok());
}

TEST_CASE("ResponseList round-trips, with hits carried as ids alone", "[codec]") {
  const ResponseList list = sample_responses();
  const std::string bytes = encode(list);
  Result<ResponseList> decoded = decode_response_list(bytes);
  REQUIRE(decoded.ok());
  const ResponseList& got = decoded.value();
  CHECK(got.responses[0] == list.responses[0]);
  CHECK(got.cache_ids == list.cache_ids);
  CHECK(got.hit == list.hit);
  CHECK(got.evicted == list.evicted);
  CHECK(got.resend == list.resend);
  CHECK(got.shutdown);
  CHECK(got.shutdown_after_error);
  CHECK(got.shutdown_code == ErrorCode::Stalled);
  CHECK(got.shutdown_message == "stalled");
  CHECK(got.fusion_threshold_bytes == std::int64_t{3} << 40);
  CHECK(got.cycle_time_us == 2500);
  CHECK(got.host_routes == 2);
}

TEST_CASE("A run of hits that names no ids is a corrupt message", "[codec]") {
  // A negative count; a negative first id; a run past the largest id.
  const std::vector<std::pair<std::int32_t, std::int32_t>> bad = {
      {5, -1}, {-1, 1}, {INT32_MAX, 2}, {INT32_MAX - 9, 11}};
  for (const auto& [first, count] : bad) {
    ResponseList list;
    list.responses.resize(1);
    list.cache_ids = {first};
    list.hit = {count};
    CHECK_FALSE(decode_response_list(encode(list)).ok());
  }
  ResponseList last;  // Up to the largest id is fine.
  last.responses.resize(1);
  last.cache_ids = {INT32_MAX - 9};
  last.hit = {10};
  CHECK(decode_response_list(encode(last)).ok());
}

TEST_CASE("Autotuned settings travel with their list; -1 means no change", "[codec]") {
  for (std::int64_t value : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1} << 20}) {
    ResponseList list;
    list.fusion_threshold_bytes = value;
    list.cycle_time_us = value;
    Result<ResponseList> decoded = decode_response_list(encode(list));
    REQUIRE(decoded.ok());
    CHECK(decoded.value().fusion_threshold_bytes == value);
    CHECK(decoded.value().cycle_time_us == value);
  }
  // Anything below -1 is corrupt: the threshold follows magic(4) shutdown(1) after_error(1)
  // code(1), the message and four empty vectors (an 8-byte length each); the cycle time follows.
  constexpr std::size_t kAt = 4 + 1 + 1 + 1 + 8 + 4 * 8;
  for (std::size_t at : {kAt, kAt + 8}) {
    std::string bytes = encode(ResponseList{});
    REQUIRE(bytes.size() > at + 8);
    CHECK(bytes.substr(at, 8) == std::string(8, '\xff'));  // -1, little-endian.
    bytes[at] = '\xfe';                                    // -2.
    CHECK_FALSE(decode_response_list(bytes).ok());
  }
}

TEST_CASE("Host routes travel with their list; -1 means no change, other values are corrupt",
          "[codec]") {
  for (std::int32_t value : {-1, 0, 1, 2, 3}) {
    ResponseList list;
    list.host_routes = value;
    Result<ResponseList> decoded = decode_response_list(encode(list));
    REQUIRE(decoded.ok());
    CHECK(decoded.value().host_routes == value);
  }
  // The routes (4 bytes) follow the threshold and the cycle time (8 bytes each).
  constexpr std::size_t kAt = 4 + 1 + 1 + 1 + 8 + 4 * 8 + 2 * 8;
  for (std::int32_t bad : {-2, 4, 255}) {
    ResponseList list;
    list.host_routes = 1;
    std::string bytes = encode(list);
    REQUIRE(bytes.size() > kAt + 4);
    std::int32_t there = 0;  // Native byte order, as the codec writes.
    std::memcpy(&there, bytes.data() + kAt, sizeof there);
    REQUIRE(there == 1);
    std::memcpy(bytes.data() + kAt, &bad, sizeof bad);
    CHECK_FALSE(decode_response_list(bytes).ok());
  }
}

TEST_CASE("Every truncation of a message is rejected, never read past", "[codec]") {
  const std::string requests = encode(sample_requests());
  for (std::size_t n = 0; n < requests.size(); ++n) {
    Result<RequestList> r = decode_request_list(std::string_view(requests).substr(0, n));
    CHECK_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::Internal);
  }
  const std::string responses = encode(sample_responses());
  for (std::size_t n = 0; n < responses.size(); ++n) {
    CHECK_FALSE(decode_response_list(std::string_view(responses).substr(0, n)).ok());
  }
}

TEST_CASE("Corrupt bytes are rejected", "[codec]") {
  std::string bytes = encode(sample_requests());
  SECTION("bad magic") {
    bytes[0] ^= 0x5a;
    CHECK_FALSE(decode_request_list(bytes).ok());
  }
  SECTION("trailing garbage") {
    bytes += "x";
    CHECK_FALSE(decode_request_list(bytes).ok());
  }
  SECTION("a huge length") {
    // The cache-hit count follows the 4-byte magic and the 1-byte shutdown flag.
    bytes[5] = '\xff';
    bytes[6] = '\xff';
    bytes[7] = '\xff';
    bytes[8] = '\x7f';
    CHECK_FALSE(decode_request_list(bytes).ok());
  }
  SECTION("an enum out of range") {
    RequestList list;
    list.requests.push_back(named("a"));
    std::string one = encode(list);
    // The op byte follows magic(4) shutdown(1) hits(4) count(4) set(4) name(4+1).
    one[4 + 1 + 4 + 4 + 4 + 5] = 99;
    CHECK_FALSE(decode_request_list(one).ok());
  }
  SECTION("a response list that is a request list") {
    CHECK_FALSE(decode_response_list(bytes).ok());
  }
}

}  // namespace
}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// Issue 11: the message codec under random and mutated input. RequestList and ResponseList
// arrive from other ranks, so decoding must either succeed or return Internal ("corrupt or
// truncated ..."), never crash, read past the end or allocate for a length the input cannot
// hold; what it accepts must be exactly what encode() writes. Millions of cases from a fixed
// seed, so a failure reproduces.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/negotiation/message_codec.h"
#include "test/support/sanitizers.h"

// ThreadSanitizer's runtime defines the global operator new and delete itself (they cannot be
// replaced under it): there the allocation sizes go untracked and only those checks are skipped.
#if defined(TUTTI_THREAD_SANITIZER)
#define TUTTI_TRACK_ALLOCATIONS 0
#else
#define TUTTI_TRACK_ALLOCATIONS 1
#endif

namespace {

// The largest single allocation while `tracking` is set on this thread. Replacing the global
// operator new covers every container the decoder grows (operator new[] forwards to it in
// libstdc++). The nothrow form is replaced too, so that every form allocates with malloc and
// frees with free: a sanitizer's runtime would otherwise pair its own nothrow new (used by
// Catch) with this file's delete.
thread_local bool tracking = false;
thread_local std::size_t largest_allocation = 0;
constexpr bool kTracksAllocations = TUTTI_TRACK_ALLOCATIONS;

}  // namespace

#if TUTTI_TRACK_ALLOCATIONS
void* operator new(std::size_t size) {
  if (tracking) largest_allocation = std::max(largest_allocation, size);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  if (tracking) largest_allocation = std::max(largest_allocation, size);
  return std::malloc(size == 0 ? 1 : size);
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace tutti::core {
namespace {

using Rng = std::mt19937_64;

std::uint64_t below(Rng& rng, std::uint64_t n) { return rng() % n; }

std::string random_string(Rng& rng, std::size_t max_length) {
  std::string s(below(rng, max_length + 1), '\0');
  for (char& c : s) c = static_cast<char>(below(rng, 256));
  return s;
}

template <class T>
std::vector<T> random_vector(Rng& rng, std::size_t max_length) {
  std::vector<T> v(below(rng, max_length + 1));
  for (T& x : v) x = static_cast<T>(rng());
  return v;
}

template <class M>
void fill_common(Rng& rng, M& m) {
  m.process_set_id = static_cast<int>(rng());
  m.name = random_string(rng, 12);
  m.op = static_cast<Collective>(below(rng, kCollectiveCount));
  m.device = static_cast<Device::Kind>(below(rng, 2));
  m.reduce_op = static_cast<ReduceOp>(below(rng, static_cast<int>(ReduceOp::Adasum) + 1));
  m.prescale = static_cast<double>(below(rng, 1000)) / 8;
  m.postscale = -static_cast<double>(below(rng, 1000)) / 4;
  m.root_rank = static_cast<int>(rng());
  m.tensors.resize(below(rng, 3));
  for (TensorSpec& spec : m.tensors) {
    spec.dtype = static_cast<DataType>(below(rng, static_cast<int>(DataType::Bool) + 1));
    spec.shape = random_vector<std::int64_t>(rng, 6);
  }
  m.splits = random_vector<std::int64_t>(rng, 3);
  m.set_ranks = random_vector<int>(rng, 3);
  m.target_set_id = static_cast<int>(rng());
}

RequestList random_requests(Rng& rng) {
  RequestList list;
  list.shutdown = below(rng, 2) == 1;
  list.shutdown_after_error = below(rng, 2) == 1;
  list.shutdown_code = static_cast<ErrorCode>(below(rng, static_cast<int>(ErrorCode::Timeout) + 1));
  list.shutdown_message = random_string(rng, 8);
  list.cache_hits = random_vector<std::int32_t>(rng, 4);
  // Runs of consecutive ids too, as a step's hits are (the codec writes them as runs).
  for (std::size_t run = below(rng, 3); run > 0; --run) {
    const auto first = static_cast<std::int32_t>(rng());
    const auto length = static_cast<std::int32_t>(below(rng, 5));
    for (std::int32_t k = 0; k < length && first <= INT32_MAX - k; ++k)
      list.cache_hits.push_back(first + k);
  }
  list.requests.resize(below(rng, 4));
  for (Request& request : list.requests) fill_common(rng, request);
  return list;
}

ResponseList random_responses(Rng& rng) {
  ResponseList list;
  list.shutdown = below(rng, 2) == 1;
  list.shutdown_after_error = below(rng, 2) == 1;
  list.shutdown_code = static_cast<ErrorCode>(below(rng, static_cast<int>(ErrorCode::Timeout) + 1));
  list.shutdown_message = random_string(rng, 8);
  const std::size_t count = below(rng, 4);
  list.responses.resize(count);
  list.cache_ids = random_vector<std::int32_t>(rng, 0);
  for (std::size_t i = 0; i < count; ++i) {
    // A run of hits names existing ids: from 0, not past the largest.
    list.hit.push_back(static_cast<std::int32_t>(below(rng, 3)));
    list.cache_ids.push_back(list.hit.back() > 0 ? static_cast<std::int32_t>(below(rng, 1 << 30))
                                                 : static_cast<std::int32_t>(rng()));
    if (list.hit.back() > 0) continue;  // Hits travel as their ids alone.
    Response& response = list.responses[i];
    fill_common(rng, response);
    response.rows = random_vector<std::int64_t>(rng, 3);
    response.joined = random_vector<int>(rng, 2);
    response.ok = below(rng, 2) == 1;
    response.error_code =
        static_cast<ErrorCode>(below(rng, static_cast<int>(ErrorCode::Timeout) + 1));
    response.error_message = random_string(rng, 8);
    response.last_joined_rank = static_cast<int>(rng());
  }
  list.evicted = random_vector<std::int32_t>(rng, 3);
  list.resend = random_vector<std::int32_t>(rng, 3);
  // Autotune's threshold: mostly none (-1), else any valid value, 64-bit ones included.
  list.fusion_threshold_bytes =
      below(rng, 2) == 0 ? -1 : static_cast<std::int64_t>(rng() >> (1 + below(rng, 63)));
  list.cycle_time_us =
      below(rng, 2) == 0 ? -1 : static_cast<std::int64_t>(rng() >> (1 + below(rng, 63)));
  list.host_routes = static_cast<std::int32_t>(below(rng, 5)) - 1;  // -1 to 3.
  return list;
}

// One mutation of `bytes`: bit flips, truncation, insertion, deletion, or a little-endian
// 32- or 64-bit field overwritten with a huge or boundary value (the length fields are 64-bit).
std::string mutate(Rng& rng, std::string bytes) {
  static constexpr std::uint64_t kHuge[] = {1ull << 60, UINT64_MAX,       1ull << 63, 1ull << 32,
                                            UINT32_MAX, (1ull << 28) + 1, 1u << 28,   0};
  const auto at = [&] { return bytes.empty() ? 0 : below(rng, bytes.size()); };
  switch (below(rng, 6)) {
    case 0:
      for (std::uint64_t i = 0, n = 1 + below(rng, 3); i < n && !bytes.empty(); ++i) {
        bytes[at()] ^= static_cast<char>(1u << below(rng, 8));
      }
      break;
    case 1: bytes.resize(below(rng, bytes.size() + 1)); break;
    case 2: bytes.insert(below(rng, bytes.size() + 1), random_string(rng, 16)); break;
    case 3:
      if (!bytes.empty()) bytes.erase(at(), 1 + below(rng, 8));
      break;
    case 4:
    case 5: {
      const std::size_t width = below(rng, 2) == 0 ? 8 : 4;
      if (bytes.size() < width) break;
      const std::size_t offset = below(rng, bytes.size() - width + 1);
      const std::uint64_t value = kHuge[below(rng, std::size(kHuge))] + below(rng, 3);
      for (std::size_t i = 0; i < width; ++i) {
        bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
      }
      break;
    }
  }
  return bytes;
}

// What a failed decode must look like.
bool is_documented_error(const Status& status, std::string_view what) {
  return status.code() == ErrorCode::Internal &&
         status.message() == std::string("corrupt or truncated ") + std::string(what) + " message";
}

struct Tally {
  std::size_t cases = 0, accepted = 0, bad_errors = 0, not_canonical = 0, absurd = 0;
};

// Decodes `bytes` with `decode`, checking the error and the largest allocation, and that an
// accepted input is exactly what encode() makes of its decoding.
template <class Decode>
void check_decode(Decode decode, const std::string& bytes, std::string_view what, Tally& tally) {
  ++tally.cases;
  largest_allocation = 0;
  tracking = true;
  auto result = decode(bytes);
  tracking = false;
  // At most one decoded element (the largest, a Response) per input byte, plus a little.
  if (largest_allocation > sizeof(Response) * (bytes.size() + 1) + 4096) ++tally.absurd;
  if (!result.ok()) {
    if (!is_documented_error(result.status(), what)) ++tally.bad_errors;
    return;
  }
  ++tally.accepted;
  if (encode(result.value()) != bytes) ++tally.not_canonical;
}

TEST_CASE("Random valid RequestLists and ResponseLists round-trip", "[codec][fuzz]") {
  Rng rng(20261123);
  for (int i = 0; i < 20000; ++i) {
    const RequestList requests = random_requests(rng);
    Result<RequestList> r = decode_request_list(encode(requests));
    REQUIRE(r.ok());
    CHECK(r.value().requests == requests.requests);
    CHECK(r.value().cache_hits == requests.cache_hits);
    CHECK(r.value().shutdown_message == requests.shutdown_message);
    CHECK(r.value().shutdown_after_error == requests.shutdown_after_error);
    const ResponseList responses = random_responses(rng);
    Result<ResponseList> s = decode_response_list(encode(responses));
    REQUIRE(s.ok());
    CHECK(s.value().responses == responses.responses);
    CHECK(s.value().cache_ids == responses.cache_ids);
    CHECK(s.value().hit == responses.hit);
    CHECK(s.value().evicted == responses.evicted);
    CHECK(s.value().resend == responses.resend);
    CHECK(s.value().shutdown_code == responses.shutdown_code);
    CHECK(s.value().shutdown_after_error == responses.shutdown_after_error);
    CHECK(s.value().fusion_threshold_bytes == responses.fusion_threshold_bytes);
    CHECK(s.value().cycle_time_us == responses.cycle_time_us);
    CHECK(s.value().host_routes == responses.host_routes);
  }
}

TEST_CASE("Mutated and random bytes decode or fail with Internal, never crash or overallocate",
          "[codec][fuzz]") {
  Rng rng(11);
  Tally requests, responses;
  constexpr int kSeeds = 2000;
  constexpr int kMutationsPerSeed = 500;  // 2 x 1,000,000 mutated messages.
  for (int seed = 0; seed < kSeeds; ++seed) {
    const std::string request_bytes = encode(random_requests(rng));
    const std::string response_bytes = encode(random_responses(rng));
    for (int i = 0; i < kMutationsPerSeed; ++i) {
      std::string mutated = mutate(rng, request_bytes);
      if (below(rng, 4) == 0) mutated = mutate(rng, mutated);  // Sometimes two mutations.
      check_decode(decode_request_list, mutated, "request", requests);
      mutated = mutate(rng, response_bytes);
      if (below(rng, 4) == 0) mutated = mutate(rng, mutated);
      check_decode(decode_response_list, mutated, "response", responses);
    }
    // Random bytes, and random bytes after a valid magic.
    const std::string noise = random_string(rng, 64);
    check_decode(decode_request_list, noise, "request", requests);
    check_decode(decode_request_list, request_bytes.substr(0, 4) + noise, "request", requests);
    check_decode(decode_response_list, noise, "response", responses);
    check_decode(decode_response_list, response_bytes.substr(0, 4) + noise, "response", responses);
  }
  for (const Tally* tally : {&requests, &responses}) {
    INFO("cases " << tally->cases << ", accepted " << tally->accepted);
    CHECK(tally->cases > 1000000);
    CHECK(tally->bad_errors == 0);
    CHECK(tally->not_canonical == 0);
    CHECK(tally->absurd == 0);
    CHECK(tally->accepted > 0);  // Some mutations (a flipped name byte) are valid messages.
  }
}

TEST_CASE("A length of 2^60 in any 64-bit field is refused before allocating", "[codec][fuzz]") {
  Rng rng(60);
  bool hook_saw_allocations = false;
  for (int seed = 0; seed < 50; ++seed) {
    for (const std::string& bytes : {encode(random_requests(rng)), encode(random_responses(rng))}) {
      const bool request = bytes.substr(0, 4) == encode(RequestList{}).substr(0, 4);
      // The hook sees the decoder's allocations (not every message allocates: short strings
      // and empty lists stay inline).
      largest_allocation = 0;
      tracking = true;
      const bool valid =
          request ? decode_request_list(bytes).ok() : decode_response_list(bytes).ok();
      tracking = false;
      CHECK(valid);
      hook_saw_allocations = hook_saw_allocations || largest_allocation > 0;
      for (std::size_t offset = 0; offset + 8 <= bytes.size(); ++offset) {
        std::string mutated = bytes;
        for (std::size_t i = 0; i < 8; ++i) {
          mutated[offset + i] = static_cast<char>(((1ull << 60) >> (8 * i)) & 0xff);
        }
        largest_allocation = 0;
        tracking = true;
        const bool ok =
            request ? decode_request_list(mutated).ok() : decode_response_list(mutated).ok();
        tracking = false;
        CHECK(largest_allocation < (std::size_t{1} << 20));
        static_cast<void>(ok);  // Either outcome; the point is the allocation.
      }
    }
  }
  CHECK((hook_saw_allocations || !kTracksAllocations));
}

}  // namespace
}  // namespace tutti::core

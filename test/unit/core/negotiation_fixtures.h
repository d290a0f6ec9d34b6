// SPDX-License-Identifier: Apache-2.0
// Fixtures shared by the coordinator's tests: a job's process-set table without threads or
// MPI, and hand-made requests.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/process_set_table.h"
#include "src/core/request.h"
#include "test/support/fake_transport.h"

namespace tutti::test {

// The coordinator's view of a job of `size` ranks: rank 0's transport and a process-set table
// whose set 0 holds every rank.
struct Job {
  explicit Job(int size) : world(size), transport(world.transport(0)), sets(*transport, 1) {
    std::vector<int> everyone;
    for (int r = 0; r < size; ++r) everyone.push_back(r);
    REQUIRE(sets.add(0, everyone).ok());
  }
  FakeWorld world;
  std::unique_ptr<ops::Transport> transport;
  core::ProcessSetTable sets;
};

// The time every test's negotiation starts from.
inline const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

// A request with only its name set.
inline core::Request named(const std::string& name) {
  core::Request request;
  request.name = name;
  return request;
}

// An allreduce request of one float32 tensor of `shape` on process set `set`.
inline core::Request allreduce(const std::string& name, Shape shape, int set = 0) {
  core::Request r = named(name);
  r.process_set_id = set;
  r.op = core::Collective::Allreduce;
  r.tensors = {core::TensorSpec{.dtype = DataType::Float32, .shape = std::move(shape)}};
  return r;
}

// The request join() submits in set 0.
inline core::Request join_request() {
  core::Request request = named(std::string(core::kJoinName));
  request.op = core::Collective::Join;
  return request;
}

// A rank's request list: full requests and counted cache hits.
inline core::RequestList list_of(std::vector<core::Request> requests,
                                 std::vector<std::int32_t> hits = {}) {
  core::RequestList list;
  list.requests = std::move(requests);
  list.cache_hits = std::move(hits);
  return list;
}

}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// DistributedSampler resumed mid-epoch (Horovod's ElasticSampler semantics): position() counts
// what all replicas consumed together, and a sampler set to that position at another replica
// count visits the rest of the epoch, so every sample is seen exactly once over the launches.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include <catch2/catch.hpp>

#include "tutti/data/distributed_sampler.h"
#include "tutti/error.h"

namespace tutti::data {
namespace {

// One launch of a job: `replicas` ranks resume the epoch at `position`, take `committed`
// batches of `batch` (the last commit), then `lost` more that a failure throws away.
struct Launch {
  int replicas;
  std::size_t committed;  // Batches; SIZE_MAX: to the end of the epoch.
  std::size_t lost;
};

struct Outcome {
  std::map<std::size_t, int> visits;  // Sample -> times its update survived.
  std::size_t padding_bound = 0;      // Replicas of the launch that took the tail, minus 1.
};

// Runs `launches` over one epoch of `n` samples the way a data-parallel job would, each launch
// building fresh samplers at its own replica count, and counts the visits that a commit kept.
Outcome run_epoch(std::size_t n, bool shuffle, bool drop_last, std::size_t batch,
                  const std::vector<Launch>& launches) {
  Outcome out;
  std::size_t position = 0;
  for (const Launch& launch : launches) {
    std::vector<DistributedSampler> samplers;
    std::vector<std::vector<std::size_t>> indices;
    for (int r = 0; r < launch.replicas; ++r) {
      samplers.emplace_back(n, launch.replicas, r, shuffle, /*seed=*/11, drop_last);
      samplers.back().set_epoch(3);
      samplers.back().set_position(position);
      indices.push_back(samplers.back().indices());
    }
    const std::size_t steps = (samplers[0].num_samples() + batch - 1) / batch;
    const std::size_t kept = std::min(launch.committed, steps);
    for (std::size_t step = 0; step < std::min(steps, kept + launch.lost); ++step) {
      const std::size_t begin = step * batch;
      const std::size_t end = std::min(begin + batch, samplers[0].num_samples());
      for (int r = 0; r < launch.replicas; ++r) {
        if (step < kept) {
          for (std::size_t i = begin; i < end; ++i) ++out.visits[indices[r][i]];
        }
        if (step < kept) samplers[r].advance(end - begin);
      }
    }
    for (const DistributedSampler& s : samplers) CHECK(s.position() == samplers[0].position());
    position = samplers[0].position();  // The commit.
    if (steps > 0 && kept == steps) {   // This launch took the epoch's tail, padding and all.
      out.padding_bound =
          std::max(out.padding_bound, static_cast<std::size_t>(launch.replicas) - 1);
    }
  }
  return out;
}

TEST_CASE("advance() and position() count the entries all replicas consumed", "[sampler]") {
  // 10 samples, 4 replicas: padded to 12, 3 indices each.
  DistributedSampler sampler(10, 4, 1, false);
  CHECK(sampler.position() == 0);
  sampler.advance(1);
  CHECK(sampler.position() == 4);
  sampler.advance(1);
  CHECK(sampler.position() == 8);
  sampler.advance(1);
  CHECK(sampler.position() == 10);  // The padding is not counted past the data set's end.
  CHECK(sampler.indices() == std::vector<std::size_t>{1, 5, 9});  // advance() leaves it.
}

TEST_CASE("A resumed sampler lays out the rest of the epoch as torch lays out a whole one",
          "[sampler]") {
  const bool shuffle = GENERATE(false, true);
  DistributedSampler whole(100, 1, 0, shuffle, 5);
  whole.set_epoch(2);
  const std::vector<std::size_t> order = whole.indices();
  // 1 replica: exactly the rest of the epoch's order.
  DistributedSampler one(100, 1, 0, shuffle, 5);
  one.set_epoch(2);
  one.set_position(37);
  CHECK(one.indices() == std::vector<std::size_t>(order.begin() + 37, order.end()));
  CHECK(one.num_samples() == 63);
  // 4 replicas over the 63 left: 16 each, padded from the rest's start.
  std::vector<std::size_t> rest(order.begin() + 37, order.end());
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(100, 4, r, shuffle, 5);
    s.set_epoch(2);
    s.set_position(37);
    REQUIRE(s.num_samples() == 16);
    for (std::size_t i = 0; i < 16; ++i) {
      CHECK(s.indices()[i] == rest[(i * 4 + static_cast<std::size_t>(r)) % rest.size()]);
    }
  }
  // Position 0 is the ordinary layout.
  DistributedSampler zero(100, 3, 2, shuffle, 5);
  DistributedSampler plain(100, 3, 2, shuffle, 5);
  zero.set_epoch(2);
  plain.set_epoch(2);
  zero.set_position(0);
  CHECK(zero.indices() == plain.indices());
}

TEST_CASE("Every sample of an epoch is seen once over launches at changing world sizes",
          "[sampler]") {
  const std::size_t n = GENERATE(1, 7, 64, 101);
  const bool shuffle = GENERATE(false, true);
  const std::size_t batch = GENERATE(1, 5);
  const std::vector<std::vector<Launch>> scenarios = {
      {{4, 2, 1}, {2, 3, 2}, {3, SIZE_MAX, 0}},  // shrink, grow
      {{1, 3, 0}, {4, 1, 3}, {1, SIZE_MAX, 0}},  // grow, shrink to 1
      {{3, 0, 2}, {3, 0, 0}, {2, SIZE_MAX, 0}},  // launches that committed nothing
  };
  const std::vector<Launch>& launches = scenarios[GENERATE(0u, 1u, 2u)];
  const Outcome out = run_epoch(n, shuffle, /*drop_last=*/false, batch, launches);
  std::size_t extra = 0;
  for (std::size_t i = 0; i < n; ++i) {
    INFO("sample " << i);
    REQUIRE(out.visits.contains(i));  // Nothing skipped.
    extra += static_cast<std::size_t>(out.visits.at(i) - 1);
  }
  CHECK(out.visits.size() == n);
  // Repeats are the last launch's padding of the epoch's tail only, as without a restart.
  CHECK(extra <= out.padding_bound);
}

TEST_CASE("With drop_last, a resumed epoch repeats nothing and drops only its tail", "[sampler]") {
  const std::size_t n = GENERATE(7, 101);
  const Outcome out =
      run_epoch(n, true, /*drop_last=*/true, 3, {{4, 2, 1}, {2, 3, 2}, {3, SIZE_MAX, 0}});
  for (const auto& [sample, visits] : out.visits) CHECK(visits == 1);
  CHECK(out.visits.size() + out.padding_bound >= n);  // At most replicas - 1 dropped.
}

TEST_CASE("A finished drop_last epoch stays finished when resumed at fewer replicas", "[sampler]") {
  // 10 samples, 3 replicas, drop_last: 3 indices each, sample order[9] dropped. A commit at the
  // epoch's last step must not leave that sample for the next launch: before, position() was 9
  // and a relaunch at 1 replica trained one more step of the finished epoch.
  std::size_t position = 0;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(10, 3, r, /*shuffle=*/true, /*seed=*/4, /*drop_last=*/true);
    s.set_epoch(1);
    REQUIRE(s.num_samples() == 3);
    s.advance(3);
    CHECK(s.position() == 10);
    position = s.position();
  }
  DistributedSampler one(10, 1, 0, true, 4, true);
  one.set_epoch(1);
  one.set_position(position);
  CHECK(one.num_samples() == 0);
  CHECK(one.indices().empty());
}

TEST_CASE("set_epoch() keeps the current epoch's position and resets it for another", "[sampler]") {
  DistributedSampler sampler(50, 2, 0, true, 1);
  sampler.set_epoch(4);
  sampler.set_position(20);
  const std::vector<std::size_t> rest = sampler.indices();
  sampler.advance(3);
  sampler.set_epoch(4);  // The loop's top, after a restore.
  CHECK(sampler.position() == 26);
  CHECK(sampler.indices() == rest);
  sampler.set_epoch(5);
  CHECK(sampler.position() == 0);
  CHECK(sampler.num_samples() == 25);
}

TEST_CASE("advance() past the end and set_position() past the data set are refused", "[sampler]") {
  DistributedSampler sampler(10, 4, 0, false);
  auto code_of = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::Internal;
  };
  CHECK(code_of([&] { sampler.advance(4); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([&] { sampler.set_position(11); }) == ErrorCode::InvalidArgument);
  CHECK(sampler.position() == 0);  // Unchanged by the refusals.
  sampler.advance(3);
  CHECK(code_of([&] { sampler.advance(1); }) == ErrorCode::InvalidArgument);
  sampler.set_position(10);  // The epoch's end: nothing left.
  CHECK(sampler.num_samples() == 0);
  CHECK(sampler.indices().empty());
  CHECK(sampler.position() == 10);
}

}  // namespace
}  // namespace tutti::data

// SPDX-License-Identifier: Apache-2.0
// Issue 12: the autotuner. The search on noisy closed-form valleys (the optimum is known in
// closed form), its budget, and the tuner's step and sample bookkeeping on synthetic response
// lists with a fake clock, including its CSV log.
#include "src/core/tuning/autotune.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/tuning/autotune_search.h"
#include "test/unit/core/autotune_valleys.h"

namespace tutti::core {
namespace {

using std::chrono::milliseconds;
using Time = std::chrono::steady_clock::time_point;

// Runs the search to the end on `valley` under `noise`; the chosen threshold.
std::int64_t search(const test::Valley& valley, test::Noise& noise, int budget) {
  HalvingSearch search({.max_samples = budget});
  while (search.phase() == HalvingSearch::Phase::Search) {
    search.record(noise.throughput(valley.step_time(static_cast<double>(search.next()))));
  }
  return search.next();
}

struct Outcome {
  int within = 0;      // Runs that chose a threshold within 5 % of the best step time.
  double worst = 1.0;  // The worst chosen step time over the best.
};

Outcome run_seeds(const test::Valley& valley, double sigma, double spike, int drift, int seeds) {
  Outcome outcome;
  for (int seed = 0; seed < seeds; ++seed) {
    test::Noise noise(static_cast<std::uint64_t>(seed) * 7919 + 1, sigma, spike, drift);
    const double ratio =
        valley.step_time(static_cast<double>(search(valley, noise, 30))) / valley.best_time;
    outcome.within += ratio <= 1.05 ? 1 : 0;
    outcome.worst = std::max(outcome.worst, ratio);
  }
  return outcome;
}

TEST_CASE("Without noise the search finds each valley's best grid point", "[autotune]") {
  for (const test::Valley& valley : test::valleys()) {
    test::Noise exact(1, 0, 0, 0);
    const std::int64_t chosen = search(valley, exact, 30);
    INFO(valley.name << " chose " << chosen);
    // Closed forms: the smooth valley's minimum at 1.5 MiB lies between the grid points 1 and
    // 2 MiB (2 MiB is nearer on the log scale: log2(2 / 1.5) < log2(1.5)); the Intel table is
    // lowest at 1 MiB; the AMD table is flat from 1 to 4 MiB and ties go to the smallest.
    const std::int64_t expected = valley.name == "smooth" ? 2 << 20 : 1 << 20;
    CHECK(chosen == expected);
  }
}

TEST_CASE("With noise the search settles within 5 % of the optimum within its budget",
          "[autotune]") {
  // 100 seeds each, per-sample noise as seen on the shared development VM: 5 % with one
  // sample in 50 twice as slow, without and with load that changes over time (drift 1), and
  // 3 % with builds starting and stopping (drift 2: load 1x or 3x); 2 % on a quiet machine.
  // The Intel table's runner-up (2 MiB) is only 5.4 % slower than its best, closer than 5 %
  // noise separates every time, so there some runs settle 5.4 % off; a 3x load jump during
  // the first round can knock out the best region, and the search then settles further off.
  struct Case {
    double sigma, spike;
    int drift;
    int min_within[3];  // Smooth, Intel, AMD: of 100.
    double max_worst;   // The worst chosen step time over the best.
  };
  for (const Case& c :
       {Case{0.05, 0.02, 0, {100, 75, 99}, 1.08}, Case{0.05, 0.02, 1, {99, 70, 98}, 1.08},
        Case{0.03, 0, 2, {98, 90, 98}, 1.25}, Case{0.02, 0, 0, {100, 100, 100}, 1.03}}) {
    std::size_t i = 0;
    for (const test::Valley& valley : test::valleys()) {
      const Outcome outcome = run_seeds(valley, c.sigma, c.spike, c.drift, 100);
      INFO(valley.name << " sigma " << c.sigma << " drift " << c.drift << ": " << outcome.within
                       << " of 100 within 5 %, worst " << outcome.worst);
      CHECK(outcome.within >= c.min_within[i++]);
      CHECK(outcome.worst <= c.max_worst);
    }
  }
}

TEST_CASE("The search spends exactly its budget, or less when it runs out of candidates",
          "[autotune]") {
  const test::Valley valley = test::valleys()[0];
  for (int budget : {1, 5, 11, 13, 20, 21, 24, 30, 31, 100}) {
    HalvingSearch search({.max_samples = budget});
    std::vector<std::int64_t> measured;
    while (search.phase() == HalvingSearch::Phase::Search) {
      measured.push_back(search.next());
      search.record(1 / valley.step_time(static_cast<double>(search.next())));
    }
    INFO("budget " << budget);
    // 11 grid points, then 2 rounds of 5 if the budget leaves 3 more for the final stage,
    // then whole rounds of 3.
    const int expected = budget <= 11  ? budget
                         : budget < 24 ? 11 + (budget - 11) / 3 * 3
                                       : 21 + (budget - 21) / 3 * 3;
    CHECK(search.samples() == expected);
    CHECK(static_cast<int>(measured.size()) == expected);
    if (budget == 1) CHECK(search.next() == HalvingSearch::kMinBytes);
  }
}

TEST_CASE("A threshold the user set is measured and can win", "[autotune]") {
  const std::int64_t three_mib = 3 << 20;
  HalvingSearch search({.start = three_mib, .start_is_candidate = true});
  bool measured = false;
  while (search.phase() == HalvingSearch::Phase::Search) {
    measured = measured || search.next() == three_mib;
    const double x = std::log2(static_cast<double>(search.next()) / three_mib);
    search.record(1 / (1 + x * x));  // Best exactly at 3 MiB, off the grid.
  }
  CHECK(measured);
  CHECK(search.next() == three_mib);
}

// ---- The tuner: steps, samples, switching, log.

std::vector<SeenOp> ops(std::initializer_list<std::uint64_t> keys, std::uint64_t bytes) {
  std::vector<SeenOp> out;
  for (std::uint64_t key : keys) out.push_back(SeenOp{.key = key, .bytes = bytes});
  return out;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> fields_of(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  for (std::string field; std::getline(in, field, ',');) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  return fields;
}

TEST_CASE("Steps are recognised by repeated names however the lists split them", "[autotune]") {
  // Each step: ops 1..4 in two lists of 2, 1000 bytes each; a step takes 8 ms whatever the
  // settings, so every sample's throughput is 4000 B / 8 ms = 500000 B/s.
  const std::string log =
      (std::filesystem::temp_directory_path() / "tutti_autotune_unit_test.csv").string();
  Autotuner tuner({.warmup_samples = 1,
                   .steps_per_sample = 2,
                   .threshold = {.start = 1 << 20, .max_samples = 14},
                   .cycle = {.start = 1000, .max_samples = 9},
                   .log_path = log});
  Time now{};
  std::vector<TunedSettings> carried;  // The settings each step ran at.
  std::vector<int> switch_steps;
  TunedSettings now_at{.fusion_threshold_bytes = 1 << 20, .cycle_time_us = 1000};
  for (int step = 0; step < 60; ++step) {
    if (auto change = tuner.observe(ops({1, 2}, 1000), now)) {
      if (change->fusion_threshold_bytes >= 0)
        now_at.fusion_threshold_bytes = change->fusion_threshold_bytes;
      if (change->cycle_time_us >= 0) now_at.cycle_time_us = change->cycle_time_us;
      switch_steps.push_back(step);
    }
    now += milliseconds(4);
    CHECK_FALSE(tuner.observe(ops({3, 4}, 1000), now).has_value());  // Never mid-step.
    now += milliseconds(4);
    carried.push_back(now_at);
  }
  // Warm-up: steps 0-1 (one sample of 2 steps) at the start; then 14 threshold samples of 2
  // steps (11 grid points, one round of the best 3), then 9 cycle-time samples (3 rounds of
  // 0, 1 and 5 ms); the settle decision comes at step 2 + 2 * (14 + 9) = 48.
  CHECK(tuner.settled());
  CHECK(tuner.steps() == 48);
  REQUIRE(!switch_steps.empty());
  CHECK(switch_steps.front() == 2);
  for (int step : switch_steps) CHECK(step % 2 == 0);  // Samples start at whole steps.
  CHECK(carried[0].fusion_threshold_bytes == (1 << 20));
  CHECK(carried[2].fusion_threshold_bytes == HalvingSearch::kMinBytes);  // Grid first.
  CHECK(carried[2].cycle_time_us == 1000);  // The start until the threshold settles.
  CHECK(carried[30].cycle_time_us == 0);    // Then the cycle times, from 0.
  CHECK(carried[30].fusion_threshold_bytes == HalvingSearch::kMinBytes);  // All tie: smallest.
  CHECK(carried[50].cycle_time_us == 0);                                  // All tie: the smallest.

  const std::vector<std::string> lines = lines_of(log);
  REQUIRE(lines.size() == 1 + 1 + 14 + 9 + 1);  // Header, warm-up, samples, settled.
  CHECK(lines[0] == kLogHeader);
  const std::vector<std::string> warmup = fields_of(lines[1]);
  REQUIRE(warmup.size() == 10);
  CHECK(warmup[0] == "0");
  CHECK(warmup[1] == "2");
  CHECK(warmup[2] == "warmup");
  CHECK(warmup[3] == "1048576");
  CHECK(warmup[4] == "1");
  CHECK(warmup[5].empty());  // The host transport is not the tuner's to choose here.
  CHECK(std::stod(warmup[6]) == Approx(0.016));
  CHECK(warmup[7] == "8000");
  CHECK(warmup[8] == "500000");
  CHECK(warmup[9] == "0");
  const std::vector<std::string> first = fields_of(lines[2]);
  CHECK(first[2] == "grid");
  CHECK(first[3] == "65536");
  CHECK(first[8] == "500000");
  CHECK(first[9] == "1");  // The only one measured so far: the best.
  const std::vector<std::string> cycle = fields_of(lines[16]);
  CHECK(cycle[2] == "cycle");
  CHECK(cycle[3] == "65536");
  CHECK(cycle[4] == "0");
  const std::vector<std::string> settled = fields_of(lines.back());
  REQUIRE(settled.size() == 10);
  CHECK(settled[0] == "24");
  CHECK(settled[1] == "48");
  CHECK(settled[2] == "settled");
  CHECK(settled[3] == "65536");
  CHECK(settled[4] == "0");
  CHECK(settled[5].empty());
  CHECK(settled[6].empty());
  CHECK(settled[7].empty());
  CHECK(settled[8] == "500000");
  CHECK(settled[9] == "1");
  std::filesystem::remove(log);
}

TEST_CASE("The tuner settles on the settings a closed-form job runs fastest at", "[autotune]") {
  // A job of 10 ops of 1 MB whose step takes (1 + 0.08 * log2(t / 4 MiB)^2) ms at threshold
  // t, plus 0.05 ms unless the cycle time is 5 ms: best at 4 MiB (a grid point) and 5 ms.
  // Defaults: 3 warm-up samples of 10 steps, 30 threshold samples, 9 cycle-time samples.
  Autotuner tuner({.threshold = {.start = 1 << 20}, .cycle = {.start = 1000, .max_samples = 9}});
  Time now{};
  TunedSettings at{.fusion_threshold_bytes = 1 << 20, .cycle_time_us = 1000};
  for (int step = 0; step < 1000 && !tuner.settled(); ++step) {
    for (std::uint64_t op = 0; op < 10; ++op) {
      if (auto change = tuner.observe(ops({op}, 1000000), now)) {
        CHECK(op == 0);  // Switches only where a step starts.
        if (change->fusion_threshold_bytes >= 0)
          at.fusion_threshold_bytes = change->fusion_threshold_bytes;
        if (change->cycle_time_us >= 0) at.cycle_time_us = change->cycle_time_us;
      }
    }
    const double x = std::log2(static_cast<double>(at.fusion_threshold_bytes) / (4 << 20));
    const double ms = 1 + 0.08 * x * x + (at.cycle_time_us == 5000 ? 0 : 0.05);
    now += std::chrono::microseconds(static_cast<std::int64_t>(1000 * ms));
  }
  CHECK(tuner.settled());
  CHECK(tuner.threshold() == (4 << 20));
  CHECK(tuner.cycle_time_us() == 5000);
  CHECK(at.fusion_threshold_bytes == (4 << 20));
  CHECK(at.cycle_time_us == 5000);
  CHECK(tuner.steps() == (3 + 30 + 9) * 10);  // Steps completed when the last sample ended.
}

TEST_CASE("Where there is a host transport to choose, the tuner chooses it last, per size class",
          "[autotune]") {
  // The closed-form job above without its cycle-time term, plus 0.3 ms unless small
  // collectives go over MPI and large ones over shared memory (routes 1), and 0.1 ms more if
  // large ones go over MPI: best at routes 1, then 0, then 3 and 2.
  const std::string log =
      (std::filesystem::temp_directory_path() / "tutti_autotune_routes_test.csv").string();
  Autotuner tuner({.threshold = {.start = 1 << 20},
                   .cycle = {.start = 1000, .max_samples = 9},
                   .tune_host_routes = true,
                   .log_path = log});
  Time now{};
  TunedSettings at{.fusion_threshold_bytes = 1 << 20, .cycle_time_us = 1000, .host_routes = 0};
  std::vector<std::int32_t> routes_seen;
  for (int step = 0; step < 1000 && !tuner.settled(); ++step) {
    for (std::uint64_t op = 0; op < 10; ++op) {
      if (auto change = tuner.observe(ops({op}, 1000000), now)) {
        CHECK(op == 0);
        if (change->fusion_threshold_bytes >= 0)
          at.fusion_threshold_bytes = change->fusion_threshold_bytes;
        if (change->cycle_time_us >= 0) at.cycle_time_us = change->cycle_time_us;
        if (change->host_routes >= 0) {
          // Not before the threshold and the cycle time have settled.
          CHECK(step >= (3 + 30 + 9) * 10);
          at.host_routes = change->host_routes;
          routes_seen.push_back(change->host_routes);
        }
      }
    }
    const double x = std::log2(static_cast<double>(at.fusion_threshold_bytes) / (4 << 20));
    const double ms =
        1 + 0.08 * x * x + (at.host_routes == 1 ? 0 : 0.3) + ((at.host_routes & 2) != 0 ? 0.1 : 0);
    now += std::chrono::microseconds(static_cast<std::int64_t>(1000 * ms));
  }
  CHECK(tuner.settled());
  CHECK(tuner.threshold() == (4 << 20));
  CHECK(tuner.host_routes() == 1);
  CHECK(at.host_routes == 1);
  CHECK(tuner.steps() == (3 + 30 + 9 + 10) * 10);
  // The lists carried each assignment other than the start's (0, which needs no change).
  const std::set<std::int32_t> carried(routes_seen.begin(), routes_seen.end());
  CHECK(carried.contains(1));
  CHECK(carried.contains(2));
  CHECK(carried.contains(3));
  CHECK(host_routes_text(0) == "shm/shm");
  CHECK(host_routes_text(1) == "mpi/shm");
  CHECK(host_routes_text(2) == "shm/mpi");
  CHECK(host_routes_text(3) == "mpi/mpi");

  const std::vector<std::string> lines = lines_of(log);
  REQUIRE(lines.size() == 1 + 3 + 30 + 9 + 10 + 1);  // Header, warm-up, samples, settled.
  std::set<std::string> measured;
  for (std::size_t i = 1 + 3 + 30 + 9; i + 1 < lines.size(); ++i) {
    const std::vector<std::string> row = fields_of(lines[i]);
    REQUIRE(row.size() == 10);
    CHECK(row[2] == "transport");
    CHECK(row[3] == "4194304");  // At the chosen threshold.
    measured.insert(row[5]);
  }
  CHECK(measured == std::set<std::string>{"shm/shm", "mpi/shm", "shm/mpi", "mpi/mpi"});
  CHECK(fields_of(lines[1])[5] == "shm/shm");  // The job starts with all on shared memory.
  const std::vector<std::string> settled = fields_of(lines.back());
  REQUIRE(settled.size() == 10);
  CHECK(settled[2] == "settled");
  CHECK(settled[5] == "mpi/shm");
  CHECK(settled[9] == "1");
  std::filesystem::remove(log);
}

TEST_CASE("Cycle times and thresholds the user set are candidates", "[autotune]") {
  Config config;
  config.autotune = true;
  config.fusion_threshold_bytes = 3000000;
  config.fusion_threshold_set = true;
  config.cycle_time = std::chrono::microseconds(2500);
  config.cycle_time_set = true;
  const Autotuner::Options options = Autotuner::options_of(config);
  CHECK(options.threshold.start == 3000000);
  CHECK(options.threshold.start_is_candidate);
  CHECK(options.cycle.start == 2500);
  CHECK(options.cycle.start_is_candidate);
  // 0, 1, 2.5 and 5 ms: one round of all, then 2 rounds of the best 3.
  CHECK(options.cycle.max_samples == 4 + 2 * 3);
  config.cycle_time = std::chrono::microseconds(1000);  // One of the candidates already.
  CHECK(Autotuner::options_of(config).cycle.max_samples == 3 * 3);
}

TEST_CASE("seen_ops resolves cache hits, skips errors, and names unnamed ops alike", "[autotune]") {
  Response big;
  big.name = "grad.fc";
  big.tensors = {TensorSpec{.dtype = DataType::Float32, .shape = {10, 25}}};
  Response failed = big;
  failed.name = "bad";
  failed.ok = false;
  Response unnamed3 = big;
  unnamed3.name = "allreduce.noname.3";
  unnamed3.tensors = {TensorSpec{.dtype = DataType::Float64, .shape = {2}}};
  Response unnamed4 = unnamed3;
  unnamed4.name = "allreduce.noname.4";
  Request request;
  request.name = "grad.fc";
  RankCache cache;
  cache.insert(7, request, big);
  ResponseList list;
  list.responses = {Response{}, failed, unnamed3, unnamed4};
  list.cache_ids = {7, -1, -1, -1};
  list.hit = {1, 0, 0, 0};
  const std::vector<SeenOp> seen = seen_ops(list, cache);
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].bytes == 10 * 25 * 4);
  CHECK(seen[1].bytes == 2 * 8);
  CHECK(seen[1].key == seen[2].key);  // Each unnamed allreduce is a step of its own.
  CHECK(seen[0].key != seen[1].key);
}

// Not run by default (hidden tag): prints how often the search and the Bayesian-optimisation
// baseline settle within 5 % of each valley's optimum, for Note [Autotune search].
TEST_CASE("Successive halving against Bayesian optimisation", "[.comparison]") {
  constexpr int kSeeds = 200;
  for (int drift : {0, 1, 2}) {
    for (double sigma : {0.03, 0.05, 0.1}) {
      for (const test::Valley& valley : test::valleys()) {
        int halving = 0, bayes = 0;
        for (int seed = 0; seed < kSeeds; ++seed) {
          test::Noise a(static_cast<std::uint64_t>(seed) * 7919 + 1, sigma, sigma / 2.5, drift);
          test::Noise b(static_cast<std::uint64_t>(seed) * 7919 + 1, sigma, sigma / 2.5, drift);
          const double chosen = static_cast<double>(search(valley, a, 30));
          const double gp = test::bayes_opt_choice(
              [&](double x) { return b.throughput(valley.step_time(x)); }, 30);
          halving += valley.step_time(chosen) <= 1.05 * valley.best_time ? 1 : 0;
          bayes += valley.step_time(gp) <= 1.05 * valley.best_time ? 1 : 0;
        }
        std::printf("%-6s sigma %.2f drift %d: within 5%%: halving %3d/%d, bayes-opt %3d/%d\n",
                    valley.name.c_str(), sigma, drift, halving, kSeeds, bayes, kSeeds);
      }
    }
  }
}

TEST_CASE("A later Autotuner of the process adds to the log an earlier one wrote", "[autotune]") {
  // A program that calls init() again after shutdown() keeps TUTTI_AUTOTUNE_LOG: the second
  // session must neither truncate the first one's rows nor write the header again.
  const std::string log =
      (std::filesystem::temp_directory_path() / "tutti_autotune_sessions_test.csv").string();
  std::filesystem::remove(log);
  { Autotuner first({.log_path = log}); }
  std::ofstream(log, std::ios::app) << "a row of the first session\n";
  { Autotuner second({.log_path = log}); }
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].starts_with("sample,step,phase,"));
  CHECK(lines[1] == "a row of the first session");
  std::filesystem::remove(log);
}

}  // namespace
}  // namespace tutti::core

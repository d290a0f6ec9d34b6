// SPDX-License-Identifier: Apache-2.0
// Issue 12: TUTTI_AUTOTUNE=1 under mpiexec. One sample per step, so the fusion threshold (and
// piece size), then the cycle time, then (ranks sharing a host on shared memory) which size
// classes go over MPI, change at almost every step while allreduces of many sizes run; every
// result is checked against its closed form, and rank 0's log against its documented columns.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// The variables of one test case, unset again at its end.
class AutotuneEnv {
 public:
  explicit AutotuneEnv(std::vector<std::pair<std::string, std::string>> values)
      : values_(std::move(values)) {
    for (const auto& [name, value] : values_) setenv(name.c_str(), value.c_str(), 1);
  }
  ~AutotuneEnv() {
    for (const auto& [name, value] : values_) unsetenv(name.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::string>> values_;
};

// A log path that every rank agrees on (rank 0's process id keeps parallel jobs apart).
std::string log_path(const std::string& tag) {
  int pid = static_cast<int>(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() /
          ("tutti_autotune_" + tag + "_" + std::to_string(pid) + ".csv"))
      .string();
}

// Element counts: tiny to 3 MB, so that thresholds from 64 KiB to 64 MiB fuse them differently
// and the largest is reduced in 1 to 48 pieces.
const std::vector<std::int64_t> kCounts = {1, 7, 300, 4096, 16385, 65536, 100003, 250000, 786432};

// `steps` training-like steps: every tensor allreduced (Sum for even, Average for odd
// indices), all submitted, then all waited. Values are small integers, so the closed form
// is exact: element j of tensor i at step s is (rank + 1) * ((i + j + s) % 7), summed over
// ranks ((i + j + s) % 7) * size (size + 1) / 2, averaged that over size.
bool run_steps(int steps) {
  const int size = world_size();
  const int rank = world_rank();
  std::vector<std::vector<float>> floats(kCounts.size());
  std::vector<std::vector<double>> doubles(kCounts.size());  // Another fusion key.
  bool ok = true;
  for (int s = 0; s < steps; ++s) {
    std::vector<Handle> handles;
    for (std::size_t i = 0; i < kCounts.size(); ++i) {
      const auto n = static_cast<std::size_t>(kCounts[i]);
      floats[i].resize(n);
      doubles[i].resize(n);
      for (std::size_t j = 0; j < n; ++j) {
        const double v =
            (rank + 1) * static_cast<double>((i + j + static_cast<std::size_t>(s)) % 7);
        floats[i][j] = static_cast<float>(v);
        doubles[i][j] = v;
      }
      const ReduceOp op = i % 2 == 0 ? ReduceOp::Sum : ReduceOp::Average;
      const Shape shape = {kCounts[i]};
      handles.push_back(allreduce_async(TensorView(floats[i].data(), shape),
                                        "f." + std::to_string(i), {.op = op}));
      handles.push_back(allreduce_async(TensorView(doubles[i].data(), shape),
                                        "d." + std::to_string(i), {.op = op}));
    }
    for (Handle& h : handles) h.wait();
    for (std::size_t i = 0; i < kCounts.size(); ++i) {
      const double factor = (i % 2 == 0 ? 1.0 : 1.0 / size) * size * (size + 1) / 2;
      for (std::size_t j = 0; j < floats[i].size(); ++j) {
        const double expected =
            factor * static_cast<double>((i + j + static_cast<std::size_t>(s)) % 7);
        ok = ok && std::abs(floats[i][j] - expected) <= 1e-6 * std::max(1.0, expected) &&
             std::abs(doubles[i][j] - expected) <= 1e-12 * std::max(1.0, expected);
      }
    }
  }
  return ok;
}

// Whether the tuner chooses the host routes in this job: with several ranks (all on this host
// in the suite) on shared memory, which TUTTI_HOST_TRANSPORT=auto (or unset) gives them.
bool routes_tuned() {
  const char* transport = std::getenv("TUTTI_HOST_TRANSPORT");
  return world_size() > 1 && (transport == nullptr || std::string(transport) == "auto");
}

std::vector<std::vector<std::string>> read_csv(const std::string& path, std::string* header) {
  std::ifstream in(path);
  std::getline(in, *header);
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::stringstream fields_in(line);
    for (std::string field; std::getline(fields_in, field, ',');) fields.push_back(field);
    if (!line.empty() && line.back() == ',') fields.emplace_back();
    rows.push_back(fields);
  }
  return rows;
}

TEST_CASE("Results stay exact while autotune switches the settings at every step", "[autotune]") {
  const std::string path = log_path("switching");
  {
    // No warm-up, one step per sample, 14 threshold samples (11 grid points and one round of
    // the best 3), then 9 cycle-time samples (3 rounds of 0, 1 and 5 ms), then where they are
    // tuned 10 host-route samples (one round of the 4, 2 of the best 3).
    AutotuneEnv env({{"TUTTI_AUTOTUNE", "1"},
                     {"TUTTI_AUTOTUNE_LOG", path},
                     {"TUTTI_AUTOTUNE_WARMUP_SAMPLES", "0"},
                     {"TUTTI_AUTOTUNE_STEPS_PER_SAMPLE", "1"},
                     {"TUTTI_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "14"}});
    tutti::init();
    const bool ok = run_steps(40);  // Settles after 23 or 33 steps; the rest as chosen.
    tutti::shutdown();
    CHECK(all_ranks(ok));
  }
  bool log_ok = true;
  std::string why;
  if (world_rank() == 0) {
    std::string header;
    const auto rows = read_csv(path, &header);
    std::set<std::string> thresholds, cycle_times, routes, transports;
    for (const auto& row : rows) {
      if (row.size() != 10) log_ok = false;
      if (row.size() != 10) continue;
      if (row[2] != "settled") thresholds.insert(row[3]);
      if (row[2] == "cycle") cycle_times.insert(row[4]);
      if (row[2] == "transport") routes.insert(row[5]);
      transports.insert(row[5]);
    }
    const bool tuned = routes_tuned();
    log_ok = log_ok &&
             header ==
                 "sample,step,phase,fusion_threshold_bytes,cycle_time_ms,host_transport,seconds,"
                 "bytes,bytes_per_second,is_best" &&
             rows.size() == (tuned ? 34u : 24u) && thresholds.size() == 11 &&
             cycle_times == std::set<std::string>{"0", "1", "5"} && rows.back()[2] == "settled" &&
             rows.back()[9] == "1" && rows.front()[2] == "grid" && rows.front()[3] == "65536" &&
             (tuned ? routes == std::set<std::string>{"shm/shm", "mpi/shm", "shm/mpi", "mpi/mpi"}
                    : routes.empty() && transports == std::set<std::string>{""});
    why = header + " / " + std::to_string(rows.size()) + " rows, " +
          std::to_string(thresholds.size()) + " thresholds, " + std::to_string(cycle_times.size()) +
          " cycle times, " + std::to_string(routes.size()) + " host routes";
    std::filesystem::remove(path);
  }
  INFO(why);
  CHECK(all_ranks(log_ok));
}

TEST_CASE("Settings set with autotune are measured as candidates", "[autotune]") {
  const std::string path = log_path("explicit");
  {
    AutotuneEnv env({{"TUTTI_AUTOTUNE", "1"},
                     {"TUTTI_FUSION_THRESHOLD", "3000000"},
                     {"TUTTI_CYCLE_TIME", "2.5"},
                     {"TUTTI_AUTOTUNE_LOG", path},
                     {"TUTTI_AUTOTUNE_WARMUP_SAMPLES", "1"},
                     {"TUTTI_AUTOTUNE_STEPS_PER_SAMPLE", "1"},
                     {"TUTTI_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "12"}});
    tutti::init();
    const bool ok = run_steps(38);
    tutti::shutdown();
    CHECK(all_ranks(ok));
  }
  bool log_ok = true;
  std::string why;
  if (world_rank() == 0) {
    std::string header;
    const auto rows = read_csv(path, &header);
    int threshold_rows = 0, cycle_rows = 0;  // Search rows at the user's settings.
    for (const auto& row : rows) {
      threshold_rows += row.size() == 10 && row[2] == "grid" && row[3] == "3000000";
      cycle_rows += row.size() == 10 && row[2] == "cycle" && row[4] == "2.5";
    }
    // Warm-up at the user's settings, the 12 thresholds once, then the 4 cycle times once and
    // the best 3 twice more, then where tuned the host routes (10 samples).
    log_ok = rows.size() == 1 + 12 + 10 + (routes_tuned() ? 10u : 0u) + 1 &&
             rows.front()[2] == "warmup" && rows.front()[3] == "3000000" &&
             rows.front()[4] == "2.5" && threshold_rows == 1 && cycle_rows >= 1 &&
             rows.back()[2] == "settled";
    why = std::to_string(rows.size()) + " rows";
    std::filesystem::remove(path);
  }
  INFO(why);
  CHECK(all_ranks(log_ok));
}

TEST_CASE("A log rank 0 cannot write fails init() on every rank", "[autotune]") {
  AutotuneEnv env(
      {{"TUTTI_AUTOTUNE", "1"}, {"TUTTI_AUTOTUNE_LOG", "/nonexistent-tutti-dir/autotune.csv"}});
  ErrorCode code = ErrorCode::Internal;
  std::string message;
  try {
    tutti::init();
    tutti::shutdown();
  } catch (const Error& e) {
    code = e.code();
    message = e.what();
  }
  INFO(message);
  CHECK(all_ranks(code == ErrorCode::InvalidArgument &&
                  message.find("TUTTI_AUTOTUNE_LOG") != std::string::npos));
}

}  // namespace
}  // namespace tutti::test

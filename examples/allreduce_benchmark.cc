// SPDX-License-Identifier: Apache-2.0
// Tutti's allreduce against plain MPI in the same run (DESIGN.md section 6):
//   P1  ResNet-50's 161 gradients via allreduce_async, against the best of raw MPI_Allreduce
//       over the same bytes in 1, 4, 16 and 64 MB pieces
//   P2  median latency of a lone 1-float allreduce, against raw MPI_Allreduce
//   P3  10,000 tiny named tensors per step (cache warm), against a raw per-tensor loop
//   P4  CPU used by an idle initialized runtime over 5 s
// Usage: mpirun -n 2 allreduce_benchmark [--grads FILE] [--repeats N] [--sweep-fusion]
//   --sweep-fusion  also runs P1 at several TUTTI_FUSION_THRESHOLD values (restarting Tutti).
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <tutti/tutti.h>

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::vector<std::int64_t> read_grads(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot open %s (use --grads FILE)\n", path.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  std::vector<std::int64_t> counts;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    counts.push_back(std::stoll(line));
  }
  return counts;
}

// The slowest rank's time decides: every figure is the max over ranks.
double max_over_ranks(double value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return value;
}

double p1_tutti(std::vector<std::vector<float>>& grads, int repeats) {
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {  // The first round warms the cache and buffers.
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    std::vector<tutti::Handle> handles;
    handles.reserve(grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      handles.push_back(tutti::allreduce_async(
          tutti::TensorView(grads[i].data(), {static_cast<std::int64_t>(grads[i].size())}),
          "grad." + std::to_string(i)));
    }
    for (tutti::Handle& h : handles) h.wait();
    const double ms = max_over_ranks(ms_since(start));
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

double p1_raw(std::vector<float>& flat, std::size_t piece_bytes, int repeats) {
  const std::size_t piece = piece_bytes / sizeof(float);
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    for (std::size_t off = 0; off < flat.size(); off += piece) {
      const int n = static_cast<int>(std::min(piece, flat.size() - off));
      MPI_Allreduce(MPI_IN_PLACE, flat.data() + off, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    const double ms = max_over_ranks(ms_since(start));
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void p2(double* tutti_us, double* raw_us) {
  constexpr int kIterations = 1000;
  float x = 1.0f;
  std::vector<double> t(kIterations), raw(kIterations);
  for (int i = 0; i < 100; ++i) tutti::allreduce(tutti::TensorView(&x, {1}), "lone");
  for (int i = 0; i < kIterations; ++i) {
    const Clock::time_point start = Clock::now();
    tutti::allreduce(tutti::TensorView(&x, {1}), "lone");
    t[i] = ms_since(start) * 1000.0;
  }
  for (int i = 0; i < kIterations; ++i) {
    const Clock::time_point start = Clock::now();
    MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    raw[i] = ms_since(start) * 1000.0;
  }
  *tutti_us = max_over_ranks(median(t));
  *raw_us = max_over_ranks(median(raw));
}

void p3(int repeats, double* tutti_ms, double* raw_ms) {
  constexpr int kTensors = 10000;
  std::vector<float> values(kTensors, 1.0f);
  std::vector<std::string> names(kTensors);
  for (int i = 0; i < kTensors; ++i) names[i] = "tiny." + std::to_string(i);
  std::vector<tutti::Handle> handles(kTensors);
  double best = 1e30;
  for (int r = 0; r < repeats + 2; ++r) {  // Two warm-up steps fill the response cache.
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < kTensors; ++i) {
      handles[i] = tutti::allreduce_async(tutti::TensorView(&values[i], {1}), names[i],
                                          {.op = tutti::ReduceOp::Sum});
    }
    for (tutti::Handle& h : handles) h.wait();
    const double ms = max_over_ranks(ms_since(start));
    if (r > 1) best = std::min(best, ms);
  }
  *tutti_ms = best;
  best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < kTensors; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, &values[i], 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    const double ms = max_over_ranks(ms_since(start));
    if (r > 0) best = std::min(best, ms);
  }
  *raw_ms = best;
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

double p4() {
  MPI_Barrier(MPI_COMM_WORLD);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // Let the loop go idle.
  const double cpu_start = cpu_seconds();
  const Clock::time_point start = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const double percent = (cpu_seconds() - cpu_start) / (ms_since(start) / 1000.0) * 100.0;
  return max_over_ranks(percent);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  std::string grads_path = "../shared/bench/resnet50_grads.txt";
  int repeats = 5;
  bool sweep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--grads" && i + 1 < argc) grads_path = argv[++i];
    else if (arg == "--repeats" && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--sweep-fusion") sweep = true;
    else {
      if (world_rank() == 0) std::fprintf(stderr, "usage: %s [--grads FILE] [--repeats N] [--sweep-fusion]\n", argv[0]);
      MPI_Finalize();
      return 2;
    }
  }
  const bool root = world_rank() == 0;
  // P3 reuses 10,000 names per step; "cache warm" needs room for all of them (default 1024).
  setenv("TUTTI_CACHE_CAPACITY", "16384", 0);
  const std::vector<std::int64_t> counts = read_grads(grads_path);
  std::vector<std::vector<float>> grads;
  std::size_t total = 0;
  for (std::int64_t n : counts) {
    grads.emplace_back(static_cast<std::size_t>(n), 1.0f);
    total += static_cast<std::size_t>(n);
  }
  std::vector<float> flat(total, 1.0f);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (root) {
    std::printf("ranks=%d tensors=%zu floats=%zu (%.1f MB) TUTTI_CACHE_CAPACITY=%s\n", size,
                grads.size(), total, total * 4.0 / 1e6, std::getenv("TUTTI_CACHE_CAPACITY"));
  }

  double best_raw = 1e30;
  for (std::size_t mb : {1, 4, 16, 64}) {
    const double ms = p1_raw(flat, mb << 20, repeats);
    if (root) std::printf("raw MPI_Allreduce in %2zu MB pieces: %.2f ms\n", mb, ms);
    best_raw = std::min(best_raw, ms);
  }
  if (sweep) {
    for (std::size_t kb : {256, 1024, 2048, 4096, 8192, 16384, 65536}) {
      setenv("TUTTI_FUSION_THRESHOLD", std::to_string(kb << 10).c_str(), 1);
      tutti::init();
      const double ms = p1_tutti(grads, repeats);
      tutti::shutdown();
      if (root) std::printf("tutti P1 with TUTTI_FUSION_THRESHOLD=%zu KB: %.2f ms (%.3fx best raw)\n", kb, ms, ms / best_raw);
    }
    unsetenv("TUTTI_FUSION_THRESHOLD");
  }
  tutti::init();
  const double p1 = p1_tutti(grads, repeats);
  double p2_tutti = 0, p2_raw = 0, p3_tutti = 0, p3_raw = 0;
  p2(&p2_tutti, &p2_raw);
  p3(repeats, &p3_tutti, &p3_raw);
  const double idle = p4();
  tutti::shutdown();
  if (root) {
    std::printf("P1 tutti_ms=%.2f best_raw_ms=%.2f ratio=%.3f\n", p1, best_raw, p1 / best_raw);
    std::printf("P2 tutti_us=%.2f raw_us=%.2f ratio=%.2f\n", p2_tutti, p2_raw, p2_tutti / p2_raw);
    std::printf("P3 tutti_ms=%.2f raw_ms=%.2f ratio=%.3f\n", p3_tutti, p3_raw, p3_tutti / p3_raw);
    std::printf("P4 idle_cpu_percent=%.3f\n", idle);
  }
  MPI_Finalize();
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// P6 of DESIGN.md section 6: isend/irecv ping-pong between ranks 0 and 1 against raw
// MPI_Send/MPI_Recv in the same run: the latency of 1 float (median half round trip) and the
// bandwidth at 64 MB. The raw ping-pong runs on a duplicate of MPI_COMM_WORLD while Tutti's
// communication thread idles. The 64 MB round trips take turns, Tutti's and raw MPI's (Note
// [Bandwidth in turns]); the bandwidths are each one's median.
//
// Usage: mpirun -n 2 build/examples/p2p_benchmark [--iterations N] [--mb-iterations M]
//                                               [--sweep-sizes]
//   --iterations     1-float round trips timed, 1 to 10^6 (default 2000)
//   --mb-iterations  64 MB round trips timed of each, Tutti's and raw MPI's, each in a turn of its
//                    own (a pause and a warm-up round trip first), 1 to 10^6 (default 20)
//   --sweep-sizes    also the sizes between P6's two, 4 KB to 16 MB (Note [Sizes between]): a line
//                    per size, after P6's
// Ends with: P6 latency_us=<x> raw_us=<y> bandwidth_ratio=<tutti 64 MB bandwidth / raw>
// Before it, for the latency runs, what a profile would say first (examples/process_usage.h):
//   P6 detail tutti: latency_us by tenth of the run=<median of each tenth, in order>
//   P6 detail tutti per round trip: switches_voluntary=<rank 0>/<rank 1>/... (and raw's)
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <mpi.h>

#include "examples/flag_reader.h"
#include "examples/machine_line.h"
#include "examples/process_usage.h"

namespace {

using tutti::examples::per_op;
using tutti::examples::process_usage;
using tutti::examples::ProcessUsage;
using tutti::examples::usage_by_rank;
using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "usage: p2p_benchmark [--iterations N] [--mb-iterations M] [--sweep-sizes]\n";
constexpr std::int64_t kMaxIterations = 1'000'000;

// The value `tenths` tenths of `samples` lie below (5: the median).
double tenths_point(std::vector<double> samples, std::size_t tenths) {
  std::sort(samples.begin(), samples.end());
  return samples.empty() ? 0 : samples[samples.size() * tenths / 10];
}

double median(std::vector<double> samples) { return tenths_point(std::move(samples), 5); }
double p90(std::vector<double> samples) { return tenths_point(std::move(samples), 9); }

double mean(const std::vector<double>& samples) {
  double sum = 0;
  for (const double x : samples) sum += x;
  return samples.empty() ? 0 : sum / static_cast<double>(samples.size());
}

// The one-way latency (half the median round trip) of each tenth of `samples`, in order: on the
// 16-core machine a ping-pong of 10 took 2.75 µs and one of 2,000 a median of 7.00 (benchmark
// log, sixteenth round), so whether the latency grows as the run goes on is worth printing.
std::string latency_by_tenth(const std::vector<double>& samples) {
  const std::size_t tenth = samples.size() / 10;
  if (tenth == 0) return "n/a (fewer than 10 round trips)";
  std::string line;
  for (std::size_t t = 0; t < 10; ++t) {
    const auto from = samples.begin() + static_cast<std::ptrdiff_t>(t * tenth);
    char value[32];
    std::snprintf(value, sizeof value, "%s%.2f", t == 0 ? "" : " ",
                  median({from, from + static_cast<std::ptrdiff_t>(tenth)}) / 2);
    line += value;
  }
  return line;
}

// Note [Bandwidth in turns]
// The 64 MB round trips were timed in two blocks, Tutti's 20 and then raw MPI's 20, and the
// ratio of the two medians read 0.887 and 1.004 in consecutive runs on the idle 2-core AMD EPYC
// VM (family 25 model 17): that VM switches between a fast and a slow mode within seconds, and a
// block could meet one mode and the next block the other. So the round trips take turns, one
// turn of Tutti's and one of raw MPI's per timed pair, and each turn is a pause of 50 ms, a
// warm-up round trip and the timed one:
//  - after its last work, an idle runtime's communication thread naps from 10 us on, each nap
//    an eighth of the idle time so far (src/core/idle_policy.h): some 50 wake-ups in the 10 ms
//    after Tutti's round trip, each some 20 us of CPU on a VM, which a raw round trip that
//    followed at once would pay for. After 50 ms the naps are 6 ms long.
//  - raw MPI's turns pause as well, so that no timed round trip follows an idle spell the other
//    side's do not (a VM's idle CPU may serve other guests meanwhile), and in both the warm-up
//    round trip after the pause is not timed.
// 18 pairs of runs on that VM, the two ways back to back, ranks bound: the ratio read
// 0.888-1.108 with the blocks and 0.938-1.032 with the turns (examples/BENCHMARK_LOG.md,
// thirty-ninth round).
void pause_before_turn() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

// Round trips of `buffer` with tutti's point-to-point ops, in microseconds (rank 0's clock): P6's
// way (rank 0 posts irecv() before its send(), then waits), or with `blocking` send() and
// recv() on both ranks (Note [Sizes between]). Rank 1 blocks either way.
std::vector<double> time_tutti(int rank, std::vector<float>& buffer, int iterations,
                               bool blocking = false) {
  const tutti::TensorView t(buffer.data(), {static_cast<std::int64_t>(buffer.size())});
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) {
    if (rank == 0) {
      const Clock::time_point start = Clock::now();
      if (blocking) {
        tutti::send(t, 1);
        tutti::recv(t, 1);
      } else {
        tutti::Handle r = tutti::irecv(t, 1);
        tutti::send(t, 1);
        r.wait();
      }
      samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    } else if (rank == 1) {
      tutti::recv(t, 0);
      tutti::send(t, 0);
    }
  }
  return samples;
}

// The same with MPI_Send/MPI_Recv on `comm`.
std::vector<double> time_raw(MPI_Comm comm, int rank, std::vector<float>& buffer, int iterations) {
  const int n = static_cast<int>(buffer.size());
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) {
    if (rank == 0) {
      const Clock::time_point start = Clock::now();
      MPI_Send(buffer.data(), n, MPI_FLOAT, 1, 0, comm);
      MPI_Recv(buffer.data(), n, MPI_FLOAT, 1, 0, comm, MPI_STATUS_IGNORE);
      samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    } else if (rank == 1) {
      MPI_Recv(buffer.data(), n, MPI_FLOAT, 0, 0, comm, MPI_STATUS_IGNORE);
      MPI_Send(buffer.data(), n, MPI_FLOAT, 0, 0, comm);
    }
  }
  return samples;
}

// Note [Sizes between]
// P6 times 1 float, which rides inside its header, and 64 MB, where the copy dominates. Between
// them a message is a header and a payload, and a wake-up of the communication thread that P6's
// latency does not pay may cost what the copy does not hide: with blocking send() and recv(),
// 4 KB to 1 MB took 1.2-3.1x raw MPI's time on the 2-core AMD EPYC VM while P6 was met there,
// 1.1-1.4x once they stopped waking it (examples/BENCHMARK_LOG.md, fifty-seventh round). So
// each size is timed two ways beside raw MPI_Send/MPI_Recv: both ranks with blocking send() and
// recv(), and P6's way (rank 0 posts irecv() before its send() and then waits; rank 1 blocks),
// where the receive is submitted before its thread waits on it. Medians of one-way time, rank
// 0's clock, the three kinds in turns of `kSweepTurn` round trips after a warm-up of each; then
// a detail line with each kind's mean and 90th percentile, since a cost that hits one round
// trip in ten or more hides from the median: waking the communication thread for P6's way took
// its 4 KB mean from 9.5 to 15 us and its 90th percentile from 9 to 31 us while the median moved
// from 7.6 to 7.9 (a probe of 100,000 round trips, fifty-ninth round).
constexpr int kSweepTurn = 20;

void sweep_sizes(MPI_Comm comm, int rank) {
  for (const std::size_t bytes :
       {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20}) {
    std::vector<float> buffer(bytes / sizeof(float), 1.0f);
    const int turns = bytes >= (std::size_t{1} << 20) ? 5 : 50;
    std::vector<double> blocking, posted, raw;
    static_cast<void>(time_tutti(rank, buffer, 2, /*blocking=*/true));
    static_cast<void>(time_tutti(rank, buffer, 2));
    static_cast<void>(time_raw(comm, rank, buffer, 2));
    for (int turn = 0; turn < turns; ++turn) {
      for (double x : time_tutti(rank, buffer, kSweepTurn, /*blocking=*/true))
        blocking.push_back(x);
      for (double x : time_tutti(rank, buffer, kSweepTurn)) posted.push_back(x);
      for (double x : time_raw(comm, rank, buffer, kSweepTurn)) raw.push_back(x);
    }
    MPI_Barrier(comm);
    if (rank != 0) continue;
    const double raw_us = median(raw) / 2;
    std::printf(
        "P6 sizes bytes=%zu send_recv_us=%.2f (%.2fx raw) irecv_send_wait_us=%.2f (%.2fx raw) "
        "raw_us=%.2f\n",
        bytes, median(blocking) / 2, median(blocking) / 2 / raw_us, median(posted) / 2,
        median(posted) / 2 / raw_us, raw_us);
    std::printf(
        "P6 sizes detail bytes=%zu mean_us send_recv=%.2f irecv_send_wait=%.2f raw=%.2f "
        "p90_us send_recv=%.2f irecv_send_wait=%.2f raw=%.2f\n",
        bytes, mean(blocking) / 2, mean(posted) / 2, mean(raw) / 2, p90(blocking) / 2,
        p90(posted) / 2, p90(raw) / 2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000;
  int mb_iterations = 20;
  bool sizes = false;
  tutti::examples::FlagReader flags("p2p_benchmark", argc, argv);
  while (flags.next()) {
    if (flags.is("--iterations"))
      iterations = static_cast<int>(flags.integer(1, kMaxIterations));
    else if (flags.is("--mb-iterations"))
      mb_iterations = static_cast<int>(flags.integer(1, kMaxIterations));
    else if (flags.is("--sweep-sizes"))
      sizes = true;
    else
      flags.unknown();
  }
  if (const std::optional<int> exit_status = flags.exit_status(kUsage)) return *exit_status;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  tutti::init();
  const int rank = tutti::rank();
  // First line: the machine (CPU model, MPI library, binding), as every benchmark prints it.
  {
    const std::string machine = tutti::examples::machine_line();
    if (tutti::rank() == 0) std::printf("%s\n", machine.c_str());
  }
  if (tutti::size() < 2) {
    std::fprintf(stderr, "p2p_benchmark needs at least 2 ranks\n");
    tutti::shutdown();
    MPI_Finalize();
    return 2;  // A usage error, as rpc_benchmark's.
  }
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  constexpr std::int64_t kBig = (64 << 20) / sizeof(float);
  const int warmup = std::max(1, iterations / 10);

  std::vector<float> one(1, 1.0f);
  static_cast<void>(time_tutti(rank, one, warmup));
  ProcessUsage before = process_usage();
  const std::vector<double> tutti_samples = time_tutti(rank, one, iterations);
  const std::string tutti_usage = usage_by_rank(per_op(before, process_usage(), iterations), comm);
  const double tutti_latency = median(tutti_samples) / 2;
  MPI_Barrier(comm);
  static_cast<void>(time_raw(comm, rank, one, warmup));
  before = process_usage();
  const std::vector<double> raw_samples = time_raw(comm, rank, one, iterations);
  const std::string raw_usage = usage_by_rank(per_op(before, process_usage(), iterations), comm);
  const double raw_latency = median(raw_samples) / 2;
  MPI_Barrier(comm);
  // In turns (Note [Bandwidth in turns]), one buffer for both.
  std::vector<float> big(static_cast<std::size_t>(kBig), 1.0f);
  std::vector<double> tutti_big_samples, raw_big_samples;
  for (int i = 0; i < mb_iterations; ++i) {
    pause_before_turn();
    const std::vector<double> tutti_trip = time_tutti(rank, big, 2);
    pause_before_turn();
    const std::vector<double> raw_trip = time_raw(comm, rank, big, 2);
    // Rank 0 times; the second round trip of each turn is the timed one.
    if (rank == 0) {
      tutti_big_samples.push_back(tutti_trip.back());
      raw_big_samples.push_back(raw_trip.back());
    }
  }
  // Ranks past 1 take no part: they wait here, since their shutdown would end Tutti's session
  // for the turns still to come.
  MPI_Barrier(comm);
  const double tutti_big = median(tutti_big_samples) / 2;
  const double raw_big = median(raw_big_samples) / 2;

  if (rank == 0) {
    const double bytes = static_cast<double>(kBig * sizeof(float));
    const double tutti_gbs = bytes / tutti_big / 1e3;
    const double raw_gbs = bytes / raw_big / 1e3;
    std::printf("1 float:  tutti %.2f us, raw MPI %.2f us (one way, median of %d)\n", tutti_latency,
                raw_latency, iterations);
    std::printf("64 MB:    tutti %.2f GB/s, raw MPI %.2f GB/s (median of %d)\n", tutti_gbs, raw_gbs,
                mb_iterations);
    std::printf("P6 detail tutti: latency_us by tenth of the run=%s\n",
                latency_by_tenth(tutti_samples).c_str());
    std::printf("P6 detail raw: latency_us by tenth of the run=%s\n",
                latency_by_tenth(raw_samples).c_str());
    std::printf("P6 detail tutti per round trip: %s\n", tutti_usage.c_str());
    std::printf("P6 detail raw per round trip: %s\n", raw_usage.c_str());
    std::printf("P6 latency_us=%.2f raw_us=%.2f bandwidth_ratio=%.3f\n", tutti_latency, raw_latency,
                tutti_gbs / raw_gbs);
  }
  if (sizes) sweep_sizes(comm, rank);
  MPI_Comm_free(&comm);
  tutti::shutdown();
  MPI_Finalize();
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// Online tuning (TUTTI_AUTOTUNE=1) of the fusion threshold, then the cycle time, then the host
// transport of each size class of collective: the coordinator measures the running job's throughput
// under candidate settings, settles on the best, and every rank switches with it at the same
// response list.
//
// Note [Autotune]
// 1. Steps. A training step submits the same tensor names again, so a step is recognised by
//    names: a response list that holds an op whose (process set, name) was already seen in the
//    current step starts the next step. This holds however the step's ops are split into lists
//    (that depends on timing), needs no help from the application, and includes whatever the
//    application does between steps (forward, backward, data loading), as throughput must.
//    Unnamed ops count as one name per op type ("allreduce.noname.<n>" as "allreduce.noname"),
//    so each of them is a step. A job whose names never repeat never completes a step and so
//    keeps its starting settings.
// 2. Samples. A sample is TUTTI_AUTOTUNE_STEPS_PER_SAMPLE whole steps at one setting; its
//    throughput is the bytes of the ops in those steps divided by the wall time from the start
//    of its first step to the start of the step after its last. The first
//    TUTTI_AUTOTUNE_WARMUP_SAMPLES samples run at the starting settings and are discarded
//    (the first step negotiates every op afresh, buffers grow, pages fault in).
// 3. Two searches, one after the other (Note [Autotune search] in autotune_search.h): the
//    fusion threshold at the starting cycle time, with TUTTI_AUTOTUNE_BAYES_OPT_MAX_SAMPLES
//    samples; then the cycle time (0, 1 and 5 ms, and TUTTI_CYCLE_TIME if set) at the chosen
//    threshold: one round of each, then 2 rounds of the best 3 (9 samples by default). The
//    threshold matters most (P1 on the Intel VM: 1.3x between 64 KiB and 512 KiB, 2x at 64 MiB);
//    the cycle time less: the request sender batches only while ops keep arriving, so it changes
//    how a burst of submissions is split, which on P1 was worth about 6 % at the default 1 MiB
//    threshold (0 ms against the default 1 ms) and within 2 % at the tuned 512 KiB. The two
//    barely interact, so one pass each costs far fewer samples than searching their product.
//    Third, where the global set's host backend has a choice (ranks sharing a host on shared
//    memory, TUTTI_HOST_TRANSPORT=auto), which collectives go over MPI instead of shared memory:
//    none, the small ones (up to 64 KiB), the large ones, or all (Note [Host transport by size]
//    in ops/shm/shm_backend.h), at the chosen threshold and cycle time, by the same search: one
//    round of the 4, then 2 of the best 3 (10 samples). Last, because the threshold decides how
//    large the fused collectives are, and so which class each falls in.
// 4. Switching. Timings are taken where rank 0 builds each list, before it is sent: on rank 0
//    the previous lists have run by then (the loop executes a list before it builds the next),
//    so that is when the previous step ended. A new setting travels in the list that starts a
//    step (ResponseList::fusion_threshold_bytes, cycle_time_us). Every rank's ResponseExecutor
//    adopts the threshold before it plans that list's fusion, so every rank plans every list
//    with the same threshold (Note [Same decision on every rank] in negotiation/coordinator.h) and
//    each step runs at one setting; the host routes likewise, before the list's collectives
//    run (ProcessSetTable::route_host); every rank's RequestSender adopts the cycle time for its
//    next batch (it decides only when this rank's requests leave, never what the collectives are).
// 5. Once settled nothing is measured any more and the loop skips the tuner.
// 6. TUTTI_AUTOTUNE_LOG: rank 0 writes one CSV row per sample, flushed as it is written (see
//    kLogHeader), and a last row with phase "settled". The file was opened once at init() (the
//    start handshake fails init() on every rank if rank 0 cannot open it); a later write error
//    is logged once and ends the logging, not the job.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "src/core/config.h"
#include "src/core/request.h"
#include "src/core/response_cache.h"
#include "src/core/tuning/autotune_search.h"

namespace tutti::core {

// The CSV columns of TUTTI_AUTOTUNE_LOG. sample: 0, 1, ... (the settled row continues the
// count); step: steps completed when the row was written; phase: warmup, grid, top5, top3
// (the threshold search's steps of Note [Autotune search]), cycle (the cycle-time search),
// transport (the host-route search) or settled; fusion_threshold_bytes, cycle_time_ms,
// host_transport: the sample's settings (settled: the chosen ones); host_transport is the
// transport of collectives up to 64 KiB, then of larger ones ("shm/mpi": small ones over
// shared memory, large ones over MPI), empty where the tuner does not choose it; seconds, bytes:
// the sample's wall time and bytes (empty on the settled row); bytes_per_second: the sample's
// throughput (settled: the median of the chosen settings' samples); is_best: 1 if the setting this
// row's search varies is that search's best after this row.
inline constexpr std::string_view kLogHeader =
    "sample,step,phase,fusion_threshold_bytes,cycle_time_ms,host_transport,seconds,bytes,"
    "bytes_per_second,is_best";

// The cycle times the second search chooses from (step 3 of Note [Autotune]), in us.
inline constexpr std::int64_t kCycleCandidatesUs[] = {0, 1000, 5000};

// One op of a response list as the tuner counts it: a key for its step identity (see step 1
// of Note [Autotune]) and its bytes.
struct SeenOp {
  std::uint64_t key = 0;
  std::uint64_t bytes = 0;
};

// The ops of `list` that succeeded, with hits resolved through `cache` (the coordinator's own
// rank cache, which holds every id a list can hit).
std::vector<SeenOp> seen_ops(const ResponseList& list, const RankCache& cache);

// Settings a list carries to every rank; -1: unchanged.
struct TunedSettings {
  std::int64_t fusion_threshold_bytes = -1;
  std::int64_t cycle_time_us = -1;
  std::int32_t host_routes = -1;  // ops::HostRoutes.
};

// "shm/mpi" for host routes that send collectives up to 64 KiB over shared memory and larger
// ones over MPI; likewise the other three (the log's host_transport column).
std::string host_routes_text(std::int64_t routes);

// Communication thread of the coordinator (rank 0) only.
class Autotuner {
 public:
  struct Options {
    int warmup_samples = 3;
    int steps_per_sample = 10;  // At least 1.
    HalvingSearch::Options threshold{};
    HalvingSearch::Options cycle{};  // In us; empty candidates: kCycleCandidatesUs.
    // Whether to choose the host routes (step 3 of Note [Autotune]); the job starts with none
    // over MPI.
    bool tune_host_routes = false;
    std::string log_path{};  // Empty: no log.
  };
  // TUTTI_AUTOTUNE_* and the settings the job starts with.
  static Options options_of(const Config& config);

  explicit Autotuner(Options options);

  // Files the next response list's ops, built at `now`. Returns the settings the list must
  // carry when it starts a step at new settings.
  std::optional<TunedSettings> observe(std::span<const SeenOp> ops,
                                       std::chrono::steady_clock::time_point now);
  bool settled() const { return last_search().phase() == HalvingSearch::Phase::Settled; }
  // The settings the job runs at now.
  std::int64_t threshold() const { return threshold_bytes_; }
  std::int64_t cycle_time_us() const { return cycle_us_; }
  std::int64_t host_routes() const { return routes_; }
  int steps() const { return steps_; }  // Completed since the first list.

 private:
  // The sample that just ended: files it, and moves to the next sample's settings.
  void end_sample(std::chrono::steady_clock::time_point now);
  // The search the tuner ends with: the host routes' if it chooses them, else the cycle's.
  const HalvingSearch& last_search() const {
    return options_.tune_host_routes ? routes_search_ : cycle_;
  }
  void write_row(std::string_view phase, const std::string& seconds, const std::string& bytes,
                 double throughput, bool is_best);

  struct CloseFile {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };

  const Options options_;
  HalvingSearch threshold_search_;
  HalvingSearch cycle_;          // Starts once threshold_search_ has settled.
  HalvingSearch routes_search_;  // Starts once cycle_ has settled, if options_ say so.
  std::int64_t threshold_bytes_;
  std::int64_t cycle_us_;
  std::int64_t routes_ = 0;
  bool started_ = false;
  std::unordered_set<std::uint64_t> step_keys_;  // Ops of the current step.
  std::chrono::steady_clock::time_point sample_start_;
  std::uint64_t sample_bytes_ = 0;
  int sample_steps_ = 0;  // Completed steps of the current sample.
  int steps_ = 0;
  int samples_ = 0;  // Completed, warm-up included.
  std::unique_ptr<std::FILE, CloseFile> log_;
};

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// The autotuner's search over one setting (the fusion threshold, then the cycle time): which
// value each sample measures, and which one it settles on. A pure state machine fed with
// measured throughputs, so that unit tests drive it with closed-form functions; Autotuner
// (autotune.h) feeds it the job's.
//
// Note [Autotune search]
// What is tuned first: TUTTI_FUSION_THRESHOLD, which is also the piece size a large tensor is
// reduced in (HostMover). Its effect on P1 is one valley over a log scale (an Intel VM: best
// near 1 MiB, 2-4 MiB about 5 % slower, 8 MiB 1.4x, 64 MiB 4x; an AMD VM: flat from 1 to
// 8 MiB, much worse at 64 MiB), and one sample (a few steps of the running job) is noisy on a
// shared 2-core VM: several % between samples, samples twice as slow while another process
// runs, and load that changes over minutes.
// The search is successive halving over a fixed grid, measured in interleaved rounds:
//  1. The grid: the powers of two from 64 KiB to 64 MiB (11 thresholds), plus the threshold
//     the job started with if TUTTI_FUSION_THRESHOLD was set (a setting the user chose is
//     never lost to the search). One round: every candidate measured once, in a spread order
//     (64K, 2M, 64M, 1M, 32M, 512K, ...: neighbours in time are far apart on the grid), so a
//     burst of load over a few samples cannot knock out a whole region of the valley.
//  2. The 5 with the highest median throughput so far: 2 rounds.
//  3. The best 3 of those: every remaining whole round of the budget.
//  4. Settle on the highest median among the last 3, and stay there.
// Each sample's throughput counts relative to the median of its round, so that load which
// changes between rounds (another process starting, as on the shared development VM) cancels
// out; a candidate's score is the median of these ratios over all its rounds, so one sample
// slowed by another process does not decide. The candidates still in the race have been
// through the same rounds, so their scores compare. A round visits its candidates in an order
// rotated by one each round, so that a load change within a round does not always hit the
// same ones, and no candidate always inherits the caches of the same predecessor.
// Why not Horovod's Bayesian optimisation (a Gaussian process over the knobs, each next
// sample where expected improvement is highest): on one dimension of eleven sensible points
// it saves nothing over the first round, which it too must spend before its fit means
// anything, and it samples one candidate at a time in sequence, so load that changes between
// samples reads as a property of the threshold. On closed-form copies of the two machines'
// valleys with simulated noise it settled within 5 % of the optimum as often or less often
// than this search, and clearly less often on the Intel valley, whose runner-up is only 5.4 %
// slower; the hidden test "[.comparison]" in test/unit/core/autotune_test.cc prints both.
// Budget: `max_samples` (TUTTI_AUTOTUNE_BAYES_OPT_MAX_SAMPLES) bounds the samples measured;
// 30 (the default) is 11 + 2 x 5 + 3 x 3. A smaller budget shortens the rounds of step 3,
// then skips step 2, then cuts step 1 short (settling on the best measured).
// The same search, given three cycle times and 9 samples, is the second stage: with 5 or
// fewer candidates step 2 is skipped, so that is one round of all, then 2 more.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace tutti::core {

// Not thread-safe; the coordinator's communication thread owns it.
class HalvingSearch {
 public:
  struct Options {
    // The values to choose from, ascending; empty: threshold_grid().
    std::vector<std::int64_t> candidates{};
    std::int64_t start = 0;           // The value the job runs with before the search.
    bool start_is_candidate = false;  // The user set it: measure it too.
    int max_samples = 30;             // At least 1.
  };
  enum class Phase { Search, Settled };

  // The fusion thresholds of step 1 of Note [Autotune search]: 64 KiB, 128 KiB, ... 64 MiB.
  static constexpr std::int64_t kMinBytes = std::int64_t{64} << 10;
  static constexpr std::int64_t kMaxBytes = std::int64_t{64} << 20;
  static std::vector<std::int64_t> threshold_grid();

  explicit HalvingSearch(const Options& options);

  Phase phase() const { return phase_; }
  // Which step of Note [Autotune search] the next sample belongs to (1, 2, 3); 4 once settled.
  int stage() const { return stage_; }
  // The value the next sample measures; once settled, the chosen one.
  std::int64_t next() const;
  // The throughput (any unit, larger is better) of a sample taken at next(). Requires
  // phase() == Search.
  void record(double throughput);
  // The candidate still in the race with the highest score (median relative throughput) over
  // its completed rounds (before the first round completes: the highest throughput so far; the
  // start before any sample); once settled, the chosen one.
  std::int64_t best() const;
  // The median of best()'s measured throughputs, in the unit record() was given (0 before any).
  double best_median() const;
  int samples() const { return samples_; }

 private:
  // Starts the next stage with the `keep` best candidates for `rounds` rounds, or settles.
  void next_stage();
  // Schedules `rounds` rounds over candidates_, truncated to the budget left.
  void schedule(int rounds);
  // Turns the finished round's throughputs into scores: each over the round's median.
  void close_round();

  const int max_samples_;
  const std::int64_t start_;
  Phase phase_ = Phase::Search;
  int stage_ = 1;
  std::vector<std::int64_t> candidates_;  // Still in the race, best first after step 1.
  std::vector<std::int64_t> queue_;       // The thresholds still to measure in this stage.
  std::size_t position_ = 0;              // Into queue_.
  std::size_t round_size_ = 0;            // Candidates per round this stage.
  std::vector<std::pair<std::int64_t, double>> round_;  // The current round's samples.
  std::map<std::int64_t, std::vector<double>> scores_;  // Relative, by threshold.
  std::map<std::int64_t, std::vector<double>> raw_;     // As recorded, by threshold.
  int samples_ = 0;
};

// The median of `values` (the mean of the middle two for an even count); 0 when empty.
double median_of(std::vector<double> values);

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// See Note [Autotune search] in autotune_search.h.
#include "src/core/tuning/autotune_search.h"

#include <algorithm>
#include <numeric>

#include "src/common/check.h"

namespace tutti::core {
namespace {

// Step 2 of Note [Autotune search]: how many stay, for how many rounds; step 3: how many stay.
constexpr std::size_t kSecondKeep = 5;
constexpr int kSecondRounds = 2;
constexpr std::size_t kFinalKeep = 3;

}  // namespace

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::vector<std::int64_t> HalvingSearch::threshold_grid() {
  std::vector<std::int64_t> grid;
  for (std::int64_t bytes = kMinBytes; bytes <= kMaxBytes; bytes *= 2) grid.push_back(bytes);
  return grid;
}

HalvingSearch::HalvingSearch(const Options& options)
    : max_samples_(options.max_samples), start_(options.start) {
  TUTTI_CHECK(options.max_samples >= 1, "the autotune budget must be at least one sample, not ",
              options.max_samples);
  candidates_ = options.candidates.empty() ? threshold_grid() : options.candidates;
  if (options.start_is_candidate &&
      std::find(candidates_.begin(), candidates_.end(), start_) == candidates_.end()) {
    candidates_.insert(std::upper_bound(candidates_.begin(), candidates_.end(), start_), start_);
  }
  // Step 1's spread order: i * k mod n for the largest k <= n / 2 prime to n, so consecutive
  // samples lie about half the grid apart and every candidate comes once.
  const std::size_t n = candidates_.size();
  std::size_t k = std::max<std::size_t>(1, n / 2);
  while (k > 1 && std::gcd(k, n) != 1) --k;
  std::vector<std::int64_t> spread;
  for (std::size_t i = 0; i < n; ++i) spread.push_back(candidates_[i * k % n]);
  candidates_ = std::move(spread);
  schedule(1);
}

void HalvingSearch::schedule(int rounds) {
  queue_.clear();
  position_ = 0;
  const std::size_t n = candidates_.size();
  round_size_ = n;
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < n; ++i)
      queue_.push_back(candidates_[(i + static_cast<std::size_t>(r)) % n]);
  }
  queue_.resize(std::min(queue_.size(), static_cast<std::size_t>(max_samples_ - samples_)));
}

std::int64_t HalvingSearch::next() const {
  return phase_ == Phase::Settled ? best() : queue_[position_];
}

void HalvingSearch::record(double throughput) {
  TUTTI_CHECK(phase_ == Phase::Search, "the autotune search recorded a sample after settling");
  round_.emplace_back(queue_[position_], throughput);
  raw_[queue_[position_]].push_back(throughput);
  ++position_;
  ++samples_;
  // The budget may end a round early: its samples still count, against their own median.
  if (round_.size() == round_size_ || position_ == queue_.size()) close_round();
  if (position_ == queue_.size()) next_stage();
}

void HalvingSearch::close_round() {
  std::vector<double> values;
  for (const auto& [bytes, throughput] : round_) values.push_back(throughput);
  const double median = median_of(std::move(values));
  for (const auto& [bytes, throughput] : round_)
    scores_[bytes].push_back(median > 0 ? throughput / median : throughput);
  round_.clear();
}

void HalvingSearch::next_stage() {
  // Only measured candidates stay (step 1 may have been cut short by the budget), best first;
  // ties go to the smaller value.
  std::erase_if(candidates_, [&](std::int64_t value) { return !scores_.contains(value); });
  std::sort(candidates_.begin(), candidates_.end(), [&](std::int64_t a, std::int64_t b) {
    const double ma = median_of(scores_.at(a));
    const double mb = median_of(scores_.at(b));
    return ma != mb ? ma > mb : a < b;
  });
  const int left = max_samples_ - samples_;
  if (stage_ == 1 && candidates_.size() > kSecondKeep &&
      left >= kSecondRounds * static_cast<int>(kSecondKeep) + static_cast<int>(kFinalKeep)) {
    stage_ = 2;
    candidates_.resize(kSecondKeep);
    schedule(kSecondRounds);
    return;
  }
  if (stage_ < 3 && candidates_.size() > 1) {
    candidates_.resize(std::min(candidates_.size(), kFinalKeep));
    const int rounds = left / static_cast<int>(candidates_.size());
    if (rounds > 0) {
      stage_ = 3;
      schedule(rounds);
      return;
    }
  }
  stage_ = 4;
  phase_ = Phase::Settled;
  candidates_.resize(std::min<std::size_t>(candidates_.size(), 1));
  queue_.clear();
  position_ = 0;
}

std::int64_t HalvingSearch::best() const {
  // Before the first round completes, the raw throughputs so far are all there is.
  const auto& scores = scores_.empty() ? raw_ : scores_;
  std::int64_t best = -1;
  double best_median = 0;
  for (std::int64_t bytes : candidates_) {
    auto it = scores.find(bytes);
    if (it == scores.end()) continue;
    const double median = median_of(it->second);
    if (best < 0 || median > best_median || (median == best_median && bytes < best)) {
      best = bytes;
      best_median = median;
    }
  }
  return best < 0 ? start_ : best;
}

double HalvingSearch::best_median() const {
  auto it = raw_.find(best());
  return it == raw_.end() ? 0 : median_of(it->second);
}

}  // namespace tutti::core

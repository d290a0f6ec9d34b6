// SPDX-License-Identifier: Apache-2.0
// PeriodicModelAverager and HierarchicalModelAverager (tutti/nn/model_averaging.h): one grouped
// allreduce of the parameters' values at the steps the schedule picks.
#include "tutti/nn/model_averaging.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/nn/tensor_math.h"
#include "tutti/collectives.h"

namespace tutti::nn {
namespace {

// The parameters' values, each Variable once. Throws InvalidArgument for an empty Variable.
std::vector<TensorView> distinct_values(const NamedParameters& parameters, const char* who) {
  std::vector<TensorView> values;
  std::unordered_set<const void*> seen;
  for (const auto& [name, variable] : parameters) {
    if (!variable.defined()) {
      detail::throw_invalid_argument(who, ": parameter '", name, "' is an empty nn::Variable");
    }
    const Tensor& value = variable.value();
    if (seen.insert(value.data()).second || value.num_elements() == 0) values.push_back(value);
  }
  return values;
}

// The blocking average of `values` (float32, as every Variable) over the members of `set` that
// have not joined, as one unit. A joined member adds zeros and Average divides by the set's
// size, so the group carries a 1 from each member: its average is the share of members still
// training, and the values are rescaled when some have joined (before, they shrank by that
// share: (n - 1) / n with one member joined). All training: the plain Average, bit for bit.
void average(std::vector<TensorView> values, const ProcessSet& set, const char* who) {
  if (values.empty()) return;
  float share = 1.0f;
  values.emplace_back(&share, Shape{1});
  grouped_allreduce(values, std::string(who) + "." + std::to_string(set.id()),
                    {.op = ReduceOp::Average, .process_set = set});
  values.pop_back();
  const int members = set.size();
  const auto training = static_cast<int>(std::lround(double(share) * members));
  if (training >= members || training < 1) return;
  const double rescale = double(members) / training;
  for (const TensorView& value : values) {
    float* data = static_cast<float*>(value.data());
    for (std::int64_t i = 0; i < value.num_elements(); ++i) {
      data[i] = static_cast<float>(data[i] * rescale);
    }
  }
}

// The largest `step` among the members of `set` (Max over the set; blocking). A joined member
// adds zero, below every step, which is never negative.
std::int64_t largest_step(std::int64_t step, const ProcessSet& set, const char* who) {
  allreduce(TensorView(&step, {}), std::string(who) + "." + std::to_string(set.id()) + ".step",
            {.op = ReduceOp::Max, .process_set = set});
  return step;
}

void check_warmup(int warmup_steps, const char* who) {
  if (warmup_steps < 0) {
    detail::throw_invalid_argument(who, ": warmup_steps must be >= 0, got ", warmup_steps);
  }
}

void check_member(const ProcessSet& set, const char* who) {
  if (!set.included()) {
    detail::throw_invalid_argument(who, ": this rank is not a member of process set ", set.id());
  }
}

}  // namespace

PeriodicModelAverager::PeriodicModelAverager(int period, int warmup_steps, ProcessSet process_set)
    : period_(period), warmup_steps_(warmup_steps), process_set_(std::move(process_set)) {
  const char* who = "PeriodicModelAverager";
  if (period < 1) detail::throw_invalid_argument(who, ": period must be >= 1, got ", period);
  check_warmup(warmup_steps, who);
  check_member(process_set_, who);
}

void PeriodicModelAverager::average_parameters(const NamedParameters& parameters) {
  const char* who = "PeriodicModelAverager";
  std::vector<TensorView> values = distinct_values(parameters, who);
  const bool due = step_ >= warmup_steps_ && (step_ - warmup_steps_) % period_ == 0;
  ++step_;
  if (!due) return;
  ++averages_;
  average(std::move(values), process_set_, who);
}

std::int64_t PeriodicModelAverager::synchronize_step() {
  step_ = largest_step(step_, process_set_, "PeriodicModelAverager");
  return step_;
}

HierarchicalModelAverager::HierarchicalModelAverager(std::map<int, ProcessSet> period_to_set,
                                                     int warmup_steps)
    : period_to_set_(std::move(period_to_set)), warmup_steps_(warmup_steps) {
  const char* who = "HierarchicalModelAverager";
  if (period_to_set_.empty()) detail::throw_invalid_argument(who, ": no period and set given");
  check_warmup(warmup_steps, who);
  std::vector<int> smaller;  // The ranks of the previous (smaller) period's set; sorted.
  int smaller_period = 0;
  for (const auto& [period, set] : period_to_set_) {
    if (period < 1) detail::throw_invalid_argument(who, ": periods must be >= 1, got ", period);
    check_member(set, who);
    std::vector<int> ranks = set.ranks();
    if (!std::includes(ranks.begin(), ranks.end(), smaller.begin(), smaller.end())) {
      detail::throw_invalid_argument(who, ": the sets do not nest: the set of period ",
                                     smaller_period, " has ranks outside the set of period ",
                                     period);
    }
    smaller = std::move(ranks);
    smaller_period = period;
  }
}

void HierarchicalModelAverager::average_parameters(const NamedParameters& parameters) {
  const char* who = "HierarchicalModelAverager";
  std::vector<TensorView> values = distinct_values(parameters, who);
  const ProcessSet* set = nullptr;
  if (step_ >= warmup_steps_) {
    for (auto it = period_to_set_.rbegin(); it != period_to_set_.rend(); ++it) {
      if (step_ % it->first == 0) {
        set = &it->second;
        break;
      }
    }
  }
  ++step_;
  if (set == nullptr) return;
  ++averages_;
  average(std::move(values), *set, who);
}

std::int64_t HierarchicalModelAverager::synchronize_step() {
  // The sets nest, so the largest period's holds every member of every other.
  step_ = largest_step(step_, period_to_set_.rbegin()->second, "HierarchicalModelAverager");
  return step_;
}

}  // namespace tutti::nn

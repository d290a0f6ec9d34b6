// SPDX-License-Identifier: Apache-2.0
// ZeroRedundancyOptimizer (tutti/optim/zero.h): sharding, step() and its bucketed collectives
// (Note [ZeRO layout] in optimizers/zero_layout.h). The state dict is in zero_state.cc.
#include "tutti/optim/zero.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "optimizers/optim_util.h"
#include "optimizers/zero_layout.h"
#include "tutti/collectives.h"

namespace tutti::optim {
namespace internal {

ZeroLayout make_zero_layout(const std::vector<std::int64_t>& counts,
                            const std::vector<bool>& trainable, int size) {
  const std::size_t n = counts.size();
  ZeroLayout layout;
  layout.counts = counts;
  layout.owner.assign(n, -1);
  layout.offset.assign(n, 0);
  layout.shards.resize(static_cast<std::size_t>(size));
  layout.shard_elements.assign(static_cast<std::size_t>(size), 0);
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i) {
    if (trainable[i]) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return counts[a] > counts[b]; });
  for (std::size_t i : order) {
    const auto lightest =
        std::min_element(layout.shard_elements.begin(), layout.shard_elements.end());
    layout.owner[i] = static_cast<int>(lightest - layout.shard_elements.begin());
    *lightest += counts[i];
  }
  // Each shard in parameter order, and the offsets within it.
  std::fill(layout.shard_elements.begin(), layout.shard_elements.end(), 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (layout.owner[i] < 0) continue;
    const auto r = static_cast<std::size_t>(layout.owner[i]);
    layout.shards[r].push_back(i);
    layout.offset[i] = layout.shard_elements[r];
    layout.shard_elements[r] += counts[i];
  }
  return layout;
}

}  // namespace internal

namespace {

constexpr double kBytesPerMb = 1024.0 * 1024.0;

std::vector<nn::Variable> variables_of(const nn::NamedParameters& parameters) {
  std::vector<nn::Variable> variables;
  for (const auto& [name, variable] : parameters) variables.push_back(variable);
  return variables;
}

float* floats_of(const Tensor& t) { return static_cast<float*>(t.data()); }

// Waits for `handles` (ignoring their errors) and rethrows the exception being handled: what
// a failed submission does, so that no buffer goes away under the runtime.
[[noreturn]] void drain_and_rethrow(std::vector<Handle>& handles) {
  try {
    wait_all(handles);
  } catch (...) {  // The submission error is the one to report.
  }
  throw;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(nn::NamedParameters parameters, Factory make_local,
                                                 ZeroOptions options)
    : Optimizer(variables_of(parameters)), options_(std::move(options)) {
  if (!make_local) detail::throw_invalid_argument(internal::kWho, ": the factory is empty");
  if (!(options_.bucket_cap_mb > 0) || !std::isfinite(options_.bucket_cap_mb)) {
    detail::throw_invalid_argument(
        internal::kWho, ": bucket_cap_mb must be a positive number, got ", options_.bucket_cap_mb);
  }
  if (!options_.process_set.included()) {
    detail::throw_invalid_argument(internal::kWho, ": this rank is not a member of process set ",
                                   options_.process_set.id());
  }
  std::set<std::string> seen_names;
  std::set<const Tensor*> seen_values;
  std::vector<std::int64_t> counts;
  std::vector<bool> trainable;
  for (const auto& [name, variable] : parameters) {
    if (!seen_names.insert(name).second) {
      detail::throw_invalid_argument(internal::kWho, ": parameter name '", name,
                                     "' appears more than once");
    }
    if (!seen_values.insert(&variable.value()).second) {
      detail::throw_invalid_argument(internal::kWho, ": parameter '", name,
                                     "' is a Variable listed before under another name");
    }
    names_.push_back(name);
    counts.push_back(variable.value().num_elements());
    trainable.push_back(internal::trainable(variable));
  }
  layout_ = std::make_shared<const Layout>(
      internal::make_zero_layout(counts, trainable, options_.process_set.size()));

  std::vector<nn::Variable> shard;
  for (std::size_t i : layout_->shards[static_cast<std::size_t>(options_.process_set.rank())]) {
    shard.push_back(Optimizer::parameters()[i]);
  }
  local_ = make_local(shard);
  if (!local_)
    detail::throw_invalid_argument(internal::kWho, ": the factory returned no optimizer");
  const std::vector<nn::Variable>& made = local_->parameters();
  bool same = made.size() == shard.size();
  for (std::size_t j = 0; same && j < shard.size(); ++j) {
    same = &made[j].value() == &shard[j].value();
  }
  if (!same) {
    detail::throw_invalid_argument(internal::kWho,
                                   ": the factory must return an optimizer over exactly the "
                                   "parameters it is given, in that order");
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

std::int64_t ZeroRedundancyOptimizer::bucket_elements() const {
  return std::max<std::int64_t>(
      1, static_cast<std::int64_t>(options_.bucket_cap_mb * kBytesPerMb / sizeof(float)));
}

void ZeroRedundancyOptimizer::step() {
  if (options_.shard_gradients) reduce_scatter_gradients();
  local_->step();
  consolidated_to_.reset();
  consolidated_.reset();
  allgather_parameters();
}

// Stage 2: bucket b is the N x width matrix of Note [ZeRO layout]; row r carries rank r's
// gradients, and the reduce-scatter leaves row (set rank) r's average on rank r.
void ZeroRedundancyOptimizer::reduce_scatter_gradients() {
  const ProcessSet& set = options_.process_set;
  const int size = set.size();
  if (size == 1) return;
  const Layout& layout = *layout_;
  const std::vector<nn::Variable>& params = parameters();
  const std::int64_t bucket = bucket_elements();
  const std::int64_t widest = layout.largest_shard();
  std::vector<Handle> handles;
  std::vector<Tensor> inputs;  // Alive until the handles are done.
  try {
    for (std::int64_t begin = 0; begin < widest; begin += bucket) {
      const std::int64_t width = std::min(bucket, widest - begin);
      Tensor input(DataType::Float32, {size, width});
      for (int r = 0; r < size; ++r) {
        float* row = floats_of(input) + static_cast<std::int64_t>(r) * width;
        internal::for_each_piece(
            layout, r, begin, begin + width,
            [&](std::size_t i, std::int64_t at, std::int64_t to, std::int64_t n) {
              std::copy_n(floats_of(params[i].grad()) + at, n, row + to);
            });
      }
      handles.push_back(reducescatter_async(
          input, std::string(internal::kWho) + ".reducescatter." + std::to_string(handles.size()),
          {.op = ReduceOp::Average, .process_set = set}));
      inputs.push_back(std::move(input));
    }
  } catch (...) {
    drain_and_rethrow(handles);
  }
  wait_all(handles);
  const int me = set.rank();
  for (std::size_t b = 0; b < handles.size(); ++b) {
    const std::int64_t begin = static_cast<std::int64_t>(b) * bucket;
    const float* row = floats_of(handles[b].output());
    internal::for_each_piece(layout, me, begin, begin + bucket,
                             [&](std::size_t i, std::int64_t at, std::int64_t to, std::int64_t n) {
                               std::copy_n(row + to, n, floats_of(params[i].grad()) + at);
                             });
  }
}

// Bucket b gathers every member's elements [b·B, (b+1)·B) of its shard (Note [ZeRO layout]).
void ZeroRedundancyOptimizer::allgather_parameters() {
  const ProcessSet& set = options_.process_set;
  const int size = set.size();
  if (size == 1) return;
  const Layout& layout = *layout_;
  const std::vector<nn::Variable>& params = parameters();
  const std::int64_t bucket = bucket_elements();
  const int me = set.rank();
  std::vector<Handle> handles;
  std::vector<Tensor> inputs;
  try {
    for (std::int64_t begin = 0; begin < layout.largest_shard(); begin += bucket) {
      Tensor input(DataType::Float32, {layout.piece(me, begin, bucket)});
      internal::for_each_piece(
          layout, me, begin, begin + bucket,
          [&](std::size_t i, std::int64_t at, std::int64_t to, std::int64_t n) {
            std::copy_n(floats_of(params[i].value()) + at, n, floats_of(input) + to);
          });
      handles.push_back(allgather_async(
          input, std::string(internal::kWho) + ".allgather." + std::to_string(handles.size()),
          set));
      inputs.push_back(std::move(input));
    }
  } catch (...) {
    drain_and_rethrow(handles);
  }
  wait_all(handles);
  for (std::size_t b = 0; b < handles.size(); ++b) {
    // A member that has joined (tutti::join()) sends no rows: the shards cannot be put back.
    std::int64_t expected = 0;
    for (int r = 0; r < size; ++r)
      expected += layout.piece(r, static_cast<std::int64_t>(b) * bucket, bucket);
    if (handles[b].output().num_elements() != expected) {
      detail::throw_invalid_argument(internal::kWho, "::step: the allgather of bucket ", b,
                                     " returned ", handles[b].output().num_elements(),
                                     " elements, not ", expected,
                                     "; a member has joined (tutti::join() is not "
                                     "supported)");
    }
  }
  for (std::size_t b = 0; b < handles.size(); ++b) {
    const std::int64_t begin = static_cast<std::int64_t>(b) * bucket;
    const float* gathered = floats_of(handles[b].output());
    for (int r = 0; r < size; ++r) {
      if (r != me) {
        internal::for_each_piece(
            layout, r, begin, begin + bucket,
            [&](std::size_t i, std::int64_t at, std::int64_t to, std::int64_t n) {
              std::copy_n(gathered + to, n, floats_of(params[i].value()) + at);
            });
      }
      gathered += layout.piece(r, begin, bucket);
    }
  }
}

std::vector<std::string> ZeroRedundancyOptimizer::owned_parameters() const {
  std::vector<std::string> names;
  for (std::size_t i : layout_->shards[static_cast<std::size_t>(options_.process_set.rank())]) {
    names.push_back(names_[i]);
  }
  return names;
}

}  // namespace tutti::optim

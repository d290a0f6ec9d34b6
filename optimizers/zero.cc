// SPDX-License-Identifier: Apache-2.0
// ZeroRedundancyOptimizer (tutti/optim/zero.h): sharding (Note [ZeRO layout] in
// optimizers/zero_layout.h), step() and its collectives. The state dict is in zero_state.cc.
#include "tutti/optim/zero.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
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
  // Each shard in parameter order.
  for (std::size_t i = 0; i < n; ++i) {
    if (layout.owner[i] >= 0) layout.shards[static_cast<std::size_t>(layout.owner[i])].push_back(i);
  }
  return layout;
}

Handle count_members(std::int32_t& live, const ProcessSet& set, const char* what) {
  live = 1;
  return allreduce_async(TensorView(&live, {}), detail::str_cat(kWho, ".", what, ".members"),
                         {.op = ReduceOp::Sum, .process_set = set});
}

void require_every_member(std::int32_t live, const ProcessSet& set, const char* where) {
  if (live != set.size()) {
    detail::throw_invalid_argument(kWho, "::", where, ": ", set.size() - live, " of ", set.size(),
                                   " members have joined (tutti::join() is not supported)");
  }
}

}  // namespace internal

namespace {

std::vector<nn::Variable> variables_of(const nn::NamedParameters& parameters) {
  std::vector<nn::Variable> variables;
  for (const auto& [name, variable] : parameters) variables.push_back(variable);
  return variables;
}

// Starts one collective on elements [at, at + n) of parameter `index`, whose owner has global
// rank `root`, named `name`.
using PieceOp = std::function<Handle(std::size_t index, std::int64_t at, std::int64_t n, int root,
                                     std::string name)>;

// Note [ZeRO's collectives]
// Each parameter (in pieces of at most bucket_cap_mb) goes to or from its owner in place: stage
// 2's gradients by a reduce to the owner (Average), the new values by a broadcast from it. The
// runtime reads and writes the parameters' own memory, fuses the reduces by root, and every op
// of a step is in flight at once. Staging each shard in a bucketed reduce-scatter and allgather
// instead copied every element in and out of fresh buffers the size of the model on each step:
// on the ResNet-50 shapes at 2 ranks, stages 1 and 2 took 1.09-1.43x DistributedOptimizer's
// step that way, and take 0.68-0.77x in place (P13, README).
//
// A member that joined (tutti::join()) fails the ops rooted at it, and one that owns no element
// roots none, so a step counts the members with a one-element allreduce (a joined member
// contributes zero) and throws InvalidArgument on the others when one is missing, before this
// rank's shard or optimizer state changes: stage 2 beside its reduces (which change no
// parameter), stage 1 alone before the local step. Stage 1 counted beside its broadcasts
// before, and its members had stepped their shards and optimizer state when the broadcasts
// rooted at the joined member failed; the step threw with the parameters half updated.
//
// Note [Unusable gradients in a ZeRO step]
// The built-in rules refuse a grad() that is not a float32 CPU tensor of its parameter's shape,
// changing nothing (tutti/optim/optimizer.h). Stage 2 reduced such a gradient as it was: an
// empty or short one threw at its reduce's submission on its rank, whose later reduces never
// started, and the other members waited in theirs until the stall limit; a float64 one failed
// its reduce everywhere with a Mismatch. Stage 1's local step refused it on its rank only, after
// the other members had stepped their shards. Now each member finds the first gradient the step
// cannot use (stage 2: of any trainable parameter, each is reduced; stage 1: of its shard, which
// its local step reads) before it submits anything, stage 2 reduces zeros in its place, so
// that every member starts the same collectives, and the step's count of the members carries
// it (StepCount), so that every member throws InvalidArgument, naming the parameter and the
// rank, before any local step: no parameter or optimizer state changes on any member. As after
// any failed stage-2 step, the owners' grad() may hold the reduced averages.

// The step's count of the members (slot 0: each member adds 1, a joined one 0) and, in slot
// 1 + r, set rank r's first unusable gradient (parameter index + 1; 0: none). One allreduce;
// check() once it is done throws what it found, joined members first.
class StepCount {
 public:
  StepCount(const ProcessSet& set, const std::vector<std::string>& names,
            const std::vector<nn::Variable>& parameters, std::optional<std::size_t> unusable)
      : set_(set),
        names_(names),
        parameters_(parameters),
        unusable_(unusable),
        slots_(static_cast<std::size_t>(set.size()) + 1, 0) {
    slots_[0] = 1;
    if (unusable) {
      slots_[static_cast<std::size_t>(set.rank()) + 1] = static_cast<std::int32_t>(*unusable + 1);
    }
  }
  StepCount(const StepCount&) = delete;
  StepCount& operator=(const StepCount&) = delete;

  // Collective over the set; the slots must outlive the handle.
  Handle start(const char* what) {
    return allreduce_async(TensorView(slots_.data(), {static_cast<std::int64_t>(slots_.size())}),
                           detail::str_cat(internal::kWho, ".", what, ".members"),
                           {.op = ReduceOp::Sum, .process_set = set_});
  }

  void check() const {
    internal::require_every_member(slots_[0], set_, "step");
    std::string which;
    for (std::size_t r = 0; r + 1 < slots_.size(); ++r) {
      const std::int32_t slot = slots_[r + 1];
      if (slot <= 0 || static_cast<std::size_t>(slot) > names_.size()) continue;
      which += detail::str_cat(which.empty() ? "" : ", ", "'",
                               names_[static_cast<std::size_t>(slot - 1)], "' on rank ",
                               set_.ranks()[r]);
    }
    if (which.empty()) return;
    std::string here;
    if (unusable_) {
      const nn::Variable& p = parameters_[*unusable_];
      const Tensor& grad = p.grad();
      here = detail::str_cat(
          " (here: ",
          grad.data() == nullptr
              ? std::string("an empty tensor")
              : detail::str_cat(to_string(grad.dtype()), detail::shape_string(grad.shape())),
          " for ", detail::shape_string(p.value().shape()),
          grad.data() == nullptr
              ? "; frozen with set_requires_grad(false) after the optimizer was built?"
              : "",
          ")");
    }
    detail::throw_invalid_argument(
        internal::kWho, "::step: the gradient of ", which,
        " is not a float32 CPU tensor of the parameter's shape", here,
        "; no member stepped: no parameter or optimizer state changed (zero_grad() replaces it)");
  }

 private:
  const ProcessSet& set_;
  const std::vector<std::string>& names_;
  const std::vector<nn::Variable>& parameters_;
  std::optional<std::size_t> unusable_;
  std::vector<std::int32_t> slots_;
};

// The first parameter whose grad() the step cannot use on this rank (Note [Unusable gradients
// in a ZeRO step]): stage 2 reduces every trainable one, stage 1 steps `rank`'s shard.
std::optional<std::size_t> first_unusable(const internal::ZeroLayout& layout,
                                          const std::vector<nn::Variable>& parameters, bool stage2,
                                          int rank) {
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const bool read = stage2 ? layout.owner[i] >= 0 : layout.owner[i] == rank;
    if (read && !internal::usable_gradient(parameters[i])) return i;
  }
  return std::nullopt;
}

// Runs `start` on every piece (at most `bucket` elements) of every owned parameter, all in
// flight at once, and waits; `what` names the ops. With `count`, the step's count runs beside
// them, and what it finds is the error reported (the pieces rooted at a joined member fail with
// a message of their own).
void run_per_piece(const internal::ZeroLayout& layout, const ProcessSet& set, std::int64_t bucket,
                   const char* what, const PieceOp& start, StepCount* count) {
  if (set.size() == 1) return;
  const std::string prefix = detail::str_cat(internal::kWho, ".", what, ".");
  std::vector<Handle> handles;
  try {
    if (count != nullptr) handles.push_back(count->start(what));
    for (std::size_t i = 0; i < layout.counts.size(); ++i) {
      if (layout.owner[i] < 0) continue;
      const int root = set.ranks()[static_cast<std::size_t>(layout.owner[i])];
      for (std::int64_t at = 0; at < layout.counts[i]; at += bucket) {
        const std::int64_t n = std::min(bucket, layout.counts[i] - at);
        handles.push_back(start(i, at, n, root, detail::str_cat(prefix, i, ".", at / bucket)));
      }
    }
  } catch (...) {
    internal::drain_and_rethrow(handles);
  }
  std::exception_ptr count_error, piece_error;
  for (std::size_t h = 0; h < handles.size(); ++h) {
    try {
      handles[h].wait();
    } catch (...) {
      std::exception_ptr& error = count != nullptr && h == 0 ? count_error : piece_error;
      if (!error) error = std::current_exception();
    }
  }
  // A missing member explains the pieces' errors.
  if (count_error) std::rethrow_exception(count_error);
  if (count != nullptr) count->check();
  if (piece_error) std::rethrow_exception(piece_error);
}

// Stage 2: each gradient to its owner (Average), beside the step's count; zeros stand in for
// this rank's unusable gradients (Note [Unusable gradients in a ZeRO step]).
void reduce_gradients(const internal::ZeroLayout& layout, const ProcessSet& set,
                      const std::vector<nn::Variable>& params, std::int64_t bucket,
                      StepCount& count) {
  std::vector<Tensor> sources;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const bool usable = layout.owner[i] < 0 || internal::usable_gradient(params[i]);
    sources.push_back(usable ? params[i].grad()
                             : Tensor(DataType::Float32, params[i].value().shape()));
  }
  run_per_piece(
      layout, set, bucket, "reduce",
      [&](std::size_t i, std::int64_t at, std::int64_t n, int root, std::string name) {
        return reduce_async(sources[i].slice(at, {n}), root, std::move(name),
                            {.op = ReduceOp::Average, .process_set = set});
      },
      &count);
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
  const std::weak_ptr<std::atomic<bool>> failed = pass_failed_;
  for (const nn::Variable& p : Optimizer::parameters()) {
    if (!internal::trainable(p)) continue;
    nn::Variable handle = p;
    handle.register_failed_pass_hook([failed](nn::Variable&) {
      if (const std::shared_ptr<std::atomic<bool>> flag = failed.lock()) flag->store(true);
    });
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
  return internal::zero_bucket_elements(options_.bucket_cap_mb);
}

// A local step that throws (a refused gradient, an exception of the caller's own optimizer)
// must not keep this rank from the broadcasts rooted at it: the other members wait in them, until
// the stall limit. So it still broadcasts its shard, as the failed local step left it (for the
// built-in rules: not updated), and then rethrows the local error, which is the one to report.
void ZeroRedundancyOptimizer::step() {
  pass_failed_->store(false);
  prepare_step();
  std::exception_ptr local_error;
  try {
    local_->step();
  } catch (...) {
    local_error = std::current_exception();
  }
  consolidated_to_.reset();
  consolidated_.reset();
  if (!local_error) {
    broadcast_parameters();
    return;
  }
  try {
    broadcast_parameters();
  } catch (...) {  // The local error is the one to report.
  }
  std::rethrow_exception(local_error);
}

// Note [A rank that skips a ZeRO step]
// step() is collective: every member's reduces and broadcasts wait for the others'. A rank
// whose backward() threw usually goes on to its next batch (`catch { zero_grad(); continue; }`)
// without step(); its next step() would then pair with the others' current one under the same
// op names, and every later step would mix two (the same skew Note [A pass that failed] in
// optimizers/reduction_rounds.h prevents for DistributedOptimizer, which also refuses that
// rank's step()). So the failed-pass hooks mark the pass, and zero_grad() makes this rank's part
// of the step it skips: the reduces with its gradients as zeros (stage 2) and the broadcasts of
// its shard as it is. The members' parameters stay equal; this rank's shard misses that step's
// update.
void ZeroRedundancyOptimizer::skip_step() {
  Optimizer::zero_grad();
  prepare_step();
  consolidated_to_.reset();
  consolidated_.reset();
  broadcast_parameters();
}

void ZeroRedundancyOptimizer::zero_grad() {
  if (pass_failed_->exchange(false)) skip_step();
  Optimizer::zero_grad();
}

// Note [ZeRO layouts compared]
// Every member must list the same parameters, names and sizes in the same order: the layout
// gives each an owner, and a step's reduces and broadcasts are named and rooted after it. A
// member with a parameter more or fewer (a model built differently on one rank) met the others'
// collectives under other names or roots: a Mismatch where a root differed, but where the
// layouts agreed but for the extra parameter, nothing noticed in time (four parameters of 1,000
// floats on both of 2 ranks and one more of 1 float on rank 1: at stage 1 rank 0 stepped and
// went on while rank 1 waited in the extra broadcast until rank 0 shut down; at stage 2 both
// stopped with Stalled at the stall limit). So the first step (or consolidate_state_dict())
// compares each member's parameter count and a hash of its names and sizes, gathered in one
// small allreduce (each member writes its own slots, a joined member none), and every member
// throws the same InvalidArgument where they differ. Once per optimizer: the lists are fixed at
// construction.
void ZeroRedundancyOptimizer::check_layout() {
  const ProcessSet& set = options_.process_set;
  if (layout_checked_ || set.size() == 1) return;
  // A hash of the names and element counts, kept to 31 bits: the allreduce sums int32 slots.
  std::uint64_t hash = detail::kFnv1aBasis;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    // With its '\0': "ab","c" differs from "a","bc".
    hash = detail::fnv1a(hash, names_[i].data(), names_[i].size() + 1);
    const std::int64_t count = parameters()[i].value().num_elements();
    hash = detail::fnv1a(hash, &count, sizeof count);
  }
  const auto members = static_cast<std::size_t>(set.size());
  const auto me = static_cast<std::size_t>(set.rank());
  std::vector<std::int32_t> slots(1 + 2 * members, 0);  // Members, then (count, hash) each.
  slots[0] = 1;
  slots[1 + 2 * me] = static_cast<std::int32_t>(names_.size());
  slots[2 + 2 * me] = static_cast<std::int32_t>(hash & 0x7fffffffu);
  allreduce_async(TensorView(slots.data(), {static_cast<std::int64_t>(slots.size())}),
                  detail::str_cat(internal::kWho, ".layout"),
                  {.op = ReduceOp::Sum, .process_set = set})
      .wait();
  if (slots[0] != set.size()) return;  // A member has joined: the step's count says so.
  std::string counts;
  bool differ = false;
  for (std::size_t r = 0; r < members; ++r) {
    differ =
        differ || slots[1 + 2 * r] != slots[1 + 2 * me] || slots[2 + 2 * r] != slots[2 + 2 * me];
    counts += detail::str_cat(r == 0 ? "" : ", ", "rank ", set.ranks()[r], ": ", slots[1 + 2 * r]);
  }
  if (differ) {
    detail::throw_invalid_argument(
        internal::kWho, ": the members list different parameters (", counts,
        " parameters; where the counts agree, their names or sizes differ); every member must "
        "pass the same parameters in the same order");
  }
  layout_checked_ = true;
}

void ZeroRedundancyOptimizer::prepare_step() {
  check_layout();
  const ProcessSet& set = options_.process_set;
  StepCount count(set, names_, parameters(),
                  first_unusable(*layout_, parameters(), options_.shard_gradients, set.rank()));
  if (set.size() == 1) {
    count.check();  // This rank's own slots.
    return;
  }
  if (options_.shard_gradients) {
    reduce_gradients(*layout_, set, parameters(), bucket_elements(), count);
    return;
  }
  Handle handle = count.start("step");
  handle.wait();
  count.check();
}

void ZeroRedundancyOptimizer::broadcast_parameters() {
  const ProcessSet& set = options_.process_set;
  const std::vector<nn::Variable>& params = parameters();
  run_per_piece(
      *layout_, set, bucket_elements(), "broadcast",
      [&](std::size_t i, std::int64_t at, std::int64_t n, int root, std::string name) {
        return broadcast_async(params[i].value().slice(at, {n}), root, std::move(name), set);
      },
      /*count=*/nullptr);  // prepare_step() counted.
}

std::vector<std::string> ZeroRedundancyOptimizer::owned_parameters() const {
  std::vector<std::string> names;
  for (std::size_t i : layout_->shards[static_cast<std::size_t>(options_.process_set.rank())]) {
    names.push_back(names_[i]);
  }
  return names;
}

}  // namespace tutti::optim

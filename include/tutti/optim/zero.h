// SPDX-License-Identifier: Apache-2.0
// ZeroRedundancyOptimizer (torch.distributed.optim.ZeroRedundancyOptimizer; ZeRO stages 1 and
// 2 of Rajbhandari et al.): each rank of a process set keeps the optimizer state of its shard
// of the parameters only, steps that shard, and broadcasts its updated values to the others, so
// the optimizer's memory per rank drops to about 1/N.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/nn/variable.h"
#include "tutti/optim/optimizer.h"
#include "tutti/process_set.h"

namespace tutti::optim {

struct ZeroOptions {
  // false (stage 1): the gradients arrive averaged, from nn::DistributedDataParallel or an
  // enclosing DistributedOptimizer. true (stage 2): the model is not wrapped; step() averages
  // the local gradients itself with a reduce of each parameter's gradient to its owner only:
  // half an allreduce's bytes, so a step moves what one gradient allreduce would.
  // Gradient memory is not sharded: autograd still accumulates every parameter's full grad().
  bool shard_gradients = false;
  // The ranks that share the optimizer state. Every member constructs the optimizer; a rank
  // outside the set gets InvalidArgument.
  ProcessSet process_set = ProcessSet::global();
  // Tutti addition: the most elements one collective of step() moves, in MiB of float32; a
  // parameter larger than that goes to or from its owner in several. Every collective of a
  // step is in flight at once. Must be positive and finite; a cap above 2^44 MiB (2^62
  // elements) counts as that, and one under a float as one element.
  double bucket_cap_mb = 25;
};

// Wraps a local optimizer over each rank's shard of the parameters:
//
//   nn::DistributedDataParallel ddp(model);                        // averages the gradients
//   optim::ZeroRedundancyOptimizer zero(ddp.named_parameters(),
//       [](std::vector<nn::Variable> shard) {
//         return std::make_unique<optim::Adam>(std::move(shard), optim::AdamOptions{.lr = 1e-3});
//       });
//   for (each batch) { zero.zero_grad(); loss(ddp.forward(x)).backward(); zero.step(); }
//
// Sharding: the parameters that require grad are assigned to the N members greedily, largest
// first, each to the member with the fewest elements so far (PyTorch's rule; ties to the
// lower set rank, equal sizes in parameter order), so every member owns about 1/N of the
// elements; each shard keeps parameter order. owned_parameters() lists this rank's.
// `make_local` builds the local optimizer over this rank's shard (possibly empty, when there
// are more members than parameters): any Optimizer works, and its state_dict() names state by
// index within the shard; this class translates to and from the index among all parameters.
//
// Results equal those of `make_local` over all parameters stepped with the averaged gradients
// (to float rounding), on every member: each member updates its shard, and step() then
// broadcasts each parameter's new value from its owner into every member's parameter.
//
// Collective over the set: step() and consolidate_state_dict() communicate (and zero_grad()
// after a backward() that threw on this rank, see there); every member calls them in the same
// order, and none may have joined (tutti::join(): a joined member's shard could not be updated
// or gathered; step() and consolidate_state_dict() then throw InvalidArgument). Their ops are
// named "ZeroRedundancyOptimizer.<what>.<...>" in the set, so two of these optimizers over one
// set must not step concurrently. Not thread-safe. The optimizer does not broadcast the initial
// parameters: the members must start equal (DDP's constructor or optim::broadcast_parameters() sees
// to that).
class TUTTI_API ZeroRedundancyOptimizer : public Optimizer {
 public:
  using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<nn::Variable>)>;

  // Shards `parameters` (see above) and calls `make_local` with this rank's shard. Does not
  // communicate. Throws InvalidArgument for an empty or repeated Variable, a repeated name, a
  // null factory or a factory that returns null or an optimizer over other parameters, a
  // non-positive bucket_cap_mb, or a rank outside the set.
  ZeroRedundancyOptimizer(nn::NamedParameters parameters, Factory make_local,
                          ZeroOptions options = {});
  ~ZeroRedundancyOptimizer() override;
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  // Stage 2 first reduces the gradients (Average) to their owners, who find the set's average
  // in grad() afterwards (the other parameters' grad() keep this rank's own). Then the local
  // optimizer steps the shard and each owner broadcasts the new values into every member's
  // parameters, in place. Collective, blocking. Errors of the collectives are rethrown (a
  // failed reduce leaves every parameter unchanged). With a member joined it throws
  // InvalidArgument ("<k> of <n> members have joined") before any parameter or optimizer state
  // changes, in both stages. At set size 1 nothing is sent.
  // Tutti addition: a grad() the step reads (stage 2: of every trainable parameter, each is
  // reduced; stage 1: of this member's shard) that is not a float32 CPU tensor of its
  // parameter's shape makes every member throw InvalidArgument, naming the parameter and the
  // rank that had it, before any parameter or optimizer state changes on any member (stage 2
  // reduces zeros in its place, so that no member waits; the owners' grad() may then hold
  // averages, as after any failed step: compute the gradients again before the next step()).
  // Tutti addition: if the local optimizer's step() throws on a member, that member still
  // broadcasts its shard (as the local step left it; not updated by the built-in rules, which
  // change nothing when they throw) and then rethrows the local optimizer's exception; the
  // other members' step() completes, with that shard not updated, and the parameters stay
  // equal on every member.
  void step() override;
  // Zeroes the gradients (Optimizer::zero_grad()). Tutti addition: after a backward() that threw
  // on this rank since the last step() (the parameters' failed-pass hooks tell it), it first
  // takes part in the step this rank is skipping, so that the other members' step() is not
  // left waiting for it and theirs is not paired with this rank's next one: stage 2's reduces
  // with this rank's gradients as zeros, and the broadcasts of its shard's values, not updated.
  // Collective, blocking, in that case only. A step() after such a backward() is a normal step
  // (with DDP the gradients hold the other ranks' averages).
  void zero_grad() override;

  // Gathers every member's optimizer state to the member whose global rank is `to`, where
  // state_dict() then returns it in the unsharded layout: what the local optimizer type over all
  // parameters would return (tensors keyed "<index among all parameters>.<name>", ordered by
  // parameter; scalars, e.g. the learning rate and step count, from set rank 0's). Collective
  // over the set, blocking. Throws InvalidArgument for a `to` outside the set, and on every
  // member still training when a member has joined (tutti::join(): its shard cannot be
  // gathered), naming the count; no consolidation then stands.
  void consolidate_state_dict(int to = 0);
  // On the member that consolidated, after consolidate_state_dict() and before the next step()
  // or load_state_dict(): the consolidated state. Elsewhere, or without a consolidation since
  // the last step, InvalidArgument.
  StateDict state_dict() const override;
  // Loads a state in the unsharded layout (a consolidated state_dict(), possibly saved at
  // another set size, or an unsharded optimizer's): each member keeps the tensors of its own
  // parameters and every scalar. Local: every member must load the same state. Throws
  // InvalidArgument, leaving the state unchanged: on every member for a malformed key or an
  // index out of range or of a parameter without a gradient; on the member that owns the
  // parameter for what the local optimizer's load_state_dict() refuses (a tensor of the wrong
  // shape or dtype, an unknown name); on every member for a scalar it refuses.
  void load_state_dict(const StateDict& state) override;

  // The names of the parameters this rank updates, in parameter order.
  std::vector<std::string> owned_parameters() const;

  // Tutti addition: the local optimizer over this rank's shard (e.g. for a learning-rate
  // schedule: set it on every member alike, as the unsharded optimizer would be set).
  Optimizer& local_optimizer() const { return *local_; }
  // Tutti addition: the set it shards over (ZeroOptions::process_set).
  const ProcessSet& process_set() const { return options_.process_set; }

 private:
  struct Layout;  // Note [ZeRO layout] in optimizers/zero_layout.h.

  std::int64_t bucket_elements() const;
  // The collectives of a step (or of one skipped, see zero_grad()) before the local step:
  // stage 2's reduces of the gradients to their owners beside the step's count, stage 1's count
  // alone. Throws InvalidArgument when a member has joined or a member's gradient cannot be
  // used, before anything is stepped (Notes [ZeRO's collectives] and [Unusable gradients in a
  // ZeRO step] in optimizers/zero.cc).
  void prepare_step();
  void broadcast_parameters();
  void skip_step();
  // Once, before the first collective of a step or consolidate_state_dict(): InvalidArgument on
  // every member unless all list the same parameters (Note [ZeRO layouts compared] in
  // optimizers/zero.cc).
  void check_layout();

  std::vector<std::string> names_;
  ZeroOptions options_;
  std::shared_ptr<const Layout> layout_;
  std::unique_ptr<Optimizer> local_;
  // After consolidate_state_dict(): the global rank it gathered to, and on that rank the state.
  std::optional<int> consolidated_to_;
  std::optional<StateDict> consolidated_;
  // Set by the parameters' failed-pass hooks, which hold it weakly; see zero_grad().
  std::shared_ptr<std::atomic<bool>> pass_failed_ = std::make_shared<std::atomic<bool>>(false);
  bool layout_checked_ = false;  // check_layout() found the members' lists equal.
};

}  // namespace tutti::optim

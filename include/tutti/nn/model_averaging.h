// SPDX-License-Identifier: Apache-2.0
// Model averaging for local SGD (torch.distributed.algorithms.model_averaging): every rank
// trains its own replica without averaging gradients, and every `period` steps the parameters
// themselves are averaged across a process set. PeriodicModelAverager averages over one set;
// HierarchicalModelAverager over nested sets at different periods (e.g. often within a host,
// rarely across hosts), PyTorch's post-local SGD with hierarchy.
#pragma once

#include <cstdint>
#include <map>

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/process_set.h"

namespace tutti::nn {

// Averages parameters every `period` steps after `warmup_steps` (PyTorch's
// PeriodicModelAverager):
//
//   nn::PeriodicModelAverager averager(/*period=*/4, /*warmup_steps=*/100);
//   for (each batch) {
//     sgd.zero_grad();
//     nn::cross_entropy(model->forward(x), y).backward();   // local: no DDP, or DDP with a
//     sgd.step();                                            // local hook for post-local SGD
//     averager.average_parameters(model->named_parameters());
//   }
//
// With period 1 and plain SGD this is synchronous data parallelism (the average of the ranks'
// updates is the update of the averaged gradient), at the cost of one parameter allreduce per
// step instead of a gradient allreduce; with period k the allreduces drop k-fold, and the
// replicas drift apart between averages. Averaging is not done during warm-up, so that the
// replicas, started equal (broadcast or DDP), stay equal there only if something else keeps
// them so (DDP's gradient averaging, as in PyTorch's post-local SGD).
//
// Uneven inputs: the schedule follows each member's own step(), the calls it made. A member
// that runs out of data and joins (tutti::join()) makes fewer calls than the others, so after
// the join its step() is behind theirs, and in the next epoch the members would average at
// different calls: the averages pair different iterations of different members, silently (the
// ops have one name), and the members can end an epoch with different numbers of averages.
// After tutti::join() returns, call synchronize_step() on every member before training on:
//
//   for (each epoch) {
//     for (each of this rank's batches) { ...; averager.average_parameters(params); }
//     tutti::join();
//     averager.synchronize_step();   // every member now at the largest step() of the set
//   }
class TUTTI_API PeriodicModelAverager {
 public:
  // Throws InvalidArgument for period < 1, warmup_steps < 0, or a set without this rank.
  // Local: does not communicate.
  PeriodicModelAverager(int period, int warmup_steps = 0,
                        ProcessSet process_set = ProcessSet::global());

  // Call after every optimizer step. When step() >= warmup_steps and (step() - warmup_steps) is
  // a multiple of the period, replaces every parameter's value by its average over the set
  // (one blocking grouped allreduce, Average, named "PeriodicModelAverager.<set id>"); then
  // increments step(). Collective over the set at those steps: every member calls it at every
  // step with parameters of the same shapes in the same order. A Variable listed twice is
  // averaged once. While members have joined (tutti::join()), the average is over the members
  // still calling (a joined member's values are not in it, and not changed). Throws
  // InvalidArgument for an empty Variable (step() unchanged) and rethrows the allreduce's errors
  // (step() advanced, as on the other members).
  void average_parameters(const NamedParameters& parameters);

  // Calls of average_parameters() so far (or the set's largest, see synchronize_step()).
  std::int64_t step() const { return step_; }
  // Tutti addition: how many of them averaged (communicated).
  std::int64_t num_averages() const { return averages_; }

  // Tutti addition: sets step() to the largest step() among the members of the set and returns
  // it, so that every member averages at the same calls again, e.g. after tutti::join() (see
  // above). Collective over the set, blocking: one allreduce (Max) named
  // "PeriodicModelAverager.<set id>.step"; every member calls it, and none has joined (a joined
  // member's step() would not be in the maximum, and it would keep its own). Rethrows the
  // allreduce's errors, step() unchanged.
  std::int64_t synchronize_step();

 private:
  int period_;
  int warmup_steps_;
  ProcessSet process_set_;
  std::int64_t step_ = 0;
  std::int64_t averages_ = 0;
};

// Averages over one of several nested process sets per step (PyTorch's
// HierarchicalModelAverager): at each step past warm-up, over the set of the largest period that
// divides step(), if any. E.g. on 2 hosts of 4 ranks, {2: this host's set, 8: the global set}
// averages within the host every 2 steps and globally every 8 (then not also within the host).
// Each rank passes the sets it belongs to: members of one host's set pass that set, those of
// the other host theirs (process sets are made on every rank, see add_process_set()). After a
// tutti::join(), call synchronize_step() on every member, as for PeriodicModelAverager.
class TUTTI_API HierarchicalModelAverager {
 public:
  // Throws InvalidArgument for an empty map, a period < 1, warmup_steps < 0, a set without this
  // rank, or sets that do not nest (the set of a smaller period must be a subset of the set of
  // every larger period). Local: does not communicate.
  explicit HierarchicalModelAverager(std::map<int, ProcessSet> period_to_set, int warmup_steps = 0);

  // Call after every optimizer step. When step() >= warmup_steps and some period divides
  // step(), averages the parameters over the set of the largest such period (blocking, named
  // "HierarchicalModelAverager.<set id>", collective over that set); then increments step().
  // Joined members and errors as PeriodicModelAverager's.
  void average_parameters(const NamedParameters& parameters);

  std::int64_t step() const { return step_; }
  // Tutti addition: how many calls averaged, over any set.
  std::int64_t num_averages() const { return averages_; }
  // Tutti addition: as PeriodicModelAverager's, over the set of the largest period (which holds
  // every other), named "HierarchicalModelAverager.<set id>.step". Collective over that set.
  std::int64_t synchronize_step();

 private:
  std::map<int, ProcessSet> period_to_set_;
  int warmup_steps_;
  std::int64_t step_ = 0;
  std::int64_t averages_ = 0;
};

}  // namespace tutti::nn

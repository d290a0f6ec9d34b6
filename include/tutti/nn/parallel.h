// SPDX-License-Identifier: Apache-2.0
// Data-parallel modules (API.md, "Data-parallel modules"): DistributedDataParallel, whose
// gradient buckets are averaged across ranks during backward(); SyncBatchNorm, batch
// statistics over every rank's batch; and DataParallel, one module's forward and backward split
// over threads of one process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tutti/collectives.h"
#include "tutti/export.h"
#include "tutti/nn/comm_hooks.h"
#include "tutti/nn/module.h"
#include "tutti/nn/variable.h"
#include "tutti/process_set.h"

namespace tutti::nn {

namespace detail {
class Reducer;
class BatchNormSync;
}  // namespace detail

struct DistributedDataParallelOptions {
  // Gradient bytes per bucket (MiB, as PyTorch's bucket_cap_mb) after the first. Larger
  // buckets mean fewer, larger allreduces that start later in backward(); smaller ones start
  // earlier and cost more per byte. A bucket closes once it reaches the cap, so a parameter
  // larger than the cap gets a bucket of its own. Must be positive.
  double bucket_cap_mb = 25;
  // Before every forward() in training mode, the root's buffers (BatchNorm's running
  // statistics) are broadcast to the other members, so that all ranks evaluate one model.
  // While the root has joined (see DistributedDataParallel) the buffers stay as they are. Costs
  // one blocking broadcast per buffer per step.
  bool broadcast_buffers = true;
  // false (default): every parameter must receive a gradient in every synchronized backward();
  // one that does not makes backward() throw InvalidArgument naming it. true: after each
  // forward() the graph is walked to find the parameters it does not reach; they count as ready
  // at once and contribute their current grad() (zero after zero_grad()). The walk costs a
  // little per step, and buckets are then never rebuilt (the used set may change every step).
  bool find_unused_parameters = false;
  // false: a bucket's gradients are averaged where they are, as one grouped allreduce started
  // when the bucket's last one is ready (with compression or a comm hook: copied into the
  // bucket and the average copied back when backward() ends); a grad() that is absent, or not
  // float32 of its parameter's size, counts as zeros (the latter also throws InvalidArgument
  // from backward()). true: every parameter's grad() is a view of its bucket (Tensor::slice),
  // so no copy happens in any mode and the gradients take no extra memory. grad() must then keep
  // pointing into the bucket: zero it in place (Optimizer::zero_grad() does); a grad() replaced
  // by another float32 tensor of its size is copied back into the bucket and re-pointed at the
  // next forward(); one of another dtype or size is dropped (the bucket's values stay) and
  // backward() throws InvalidArgument naming it, after the reductions.
  bool gradient_as_bucket_view = false;
  // How buckets travel (tutti::Compression): FP16/BF16 send 2-byte copies, reduced in float32
  // and converted back; precision drops accordingly.
  Compression compression = Compression::None;
  // Global rank whose parameters and buffers everyone starts from (and whose buffers are
  // broadcast); must be a member of process_set.
  int root_rank = 0;
  // The ranks that train together. The constructor throws InvalidArgument on a rank outside it.
  ProcessSet process_set = ProcessSet::global();
  // Tutti addition: the cap of the first bucket (the last layers' gradients, first ready), in
  // MiB. PyTorch keeps it at 1 MiB so that communication starts early; must be positive.
  double first_bucket_mb = 1;
};

// Wraps `module` for data-parallel training (torch.nn.parallel.DistributedDataParallel): every
// member of the process set runs the same training loop on its share of the data, with a plain
// optimizer over ddp.named_parameters(), and when loss.backward() returns, every parameter's
// grad() holds the average over the set of the members' gradients.
//
//   nn::DistributedDataParallel ddp(model);                  // collective: root's weights
//   optim::SGD sgd(parameters_of(ddp), {.lr = 0.1});
//   for (each batch) {
//     sgd.zero_grad();
//     nn::cross_entropy(ddp.forward(images), labels).backward();   // averages, mid-backward
//     sgd.step();
//   }
//
// How it works: the parameters are grouped into buckets, in reverse registration order (the
// order backward() usually produces them), the first bucket up to first_bucket_mb, the others
// up to bucket_cap_mb. Each parameter's grad hook marks it ready; the moment a bucket's last
// gradient is final, the bucket starts its reduction (Average) under the name
// "DistributedDataParallel.<root_rank>.<id>.bucket.<b>" while backward() goes on: one grouped
// allreduce of its gradients in place, or, with gradient_as_bucket_view, compression or a comm
// hook, of the bucket (one contiguous float32 buffer). When the backward pass has propagated
// every gradient (the engine's "backward finished" callback), DDP waits for the buckets (and
// writes the averages of the buffers into grad()), before backward() returns. After the first
// synchronized backward() the buckets are rebuilt once in the order the gradients became ready,
// taking the root's order on every rank (one blocking broadcast), unless find_unused_parameters
// is set.
//
// Which backward() passes synchronize: those through the output of a forward() called outside
// no_sync(); the decision is taken at forward() (as PyTorch does). A backward() that does not
// reach a DDP output (e.g. through module() called directly) only accumulates locally.
//
// Collective: every member must construct its DDPs in the same order, and run the same number
// of synchronized forward/backward passes, or use tutti::join(): while a member has joined, the
// others' bucket allreduces see zeros from it (the average still divides by the set size, as
// allreduce does) and buffers are broadcast unless the root has joined. The one-time bucket
// rebuild takes place in the first synchronized backward() that no member has joined (a member
// with no batch in the first epoch rebuilds with the others in the next).
//
// Errors: a parameter without a gradient (find_unused_parameters = false) makes backward()
// throw InvalidArgument naming it and the option, after the bucket reductions completed (so no
// member hangs; the other members' averages then include this rank's current grad()). Errors
// of the reductions (Mismatch, ShutDown, ...) are thrown by backward() after every bucket was
// waited for. The same holds at size 1. A backward() that throws on one rank (a grad hook, a
// grad() replaced by a tensor of another shape) still sends every bucket, with this rank's
// current grad()s, before its exception propagates, so the members stay on the same step (the
// others' averages include what this rank had). A comm hook, or its future, that fails may
// leave collectives the other members wait in (the stall inspector fails them): the DDP then
// throws InvalidArgument from every later forward() on this rank, saying why.
//
// Threads: forward() and backward() on one thread at a time (the application's); not
// combinable with concurrent backward passes over the same parameters.
class TUTTI_API DistributedDataParallel : public Module {
 public:
  // Collective over options.process_set: broadcasts the root's parameters and buffers into
  // every member's (blocking), then registers a grad hook on every parameter. Parameters are
  // named "module.<name>" (the child is called "module"); a Variable registered twice counts
  // once. Throws InvalidArgument for a null module, bad options, a root outside the set, or a
  // rank outside the set; the runtime's errors (NotInitialized, ...) propagate.
  explicit DistributedDataParallel(std::shared_ptr<Module> module,
                                   DistributedDataParallelOptions options = {});
  // Waits for reductions still in flight (ignoring their errors); the hooks stay registered on
  // the parameters but do nothing afterwards.
  ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // In training mode with broadcast_buffers, first broadcasts the root's buffers (collective);
  // while a member of the set has joined (tutti::join()), every member keeps its own instead.
  // Then module().forward(input), recorded so that its backward() averages the gradients
  // (unless inside no_sync()).
  Variable forward(const Variable& input) override;
  // The wrapped module.
  Module& module() const { return *module_; }

  // While a guard returned by no_sync() is alive, forward() records passes whose backward()
  // does not communicate: gradients accumulate locally in grad(), and the first synchronized
  // backward() afterwards averages the accumulated sums. Guards nest; must not outlive the DDP.
  class NoSync;
  [[nodiscard]] NoSync no_sync();

  // Replaces the averaging of every bucket by `hook` (tutti/nn/comm_hooks.h): in each
  // synchronized backward pass, the moment a bucket's gradients are ready it is handed to the
  // hook, whose future's result (float32, the bucket's size) becomes the bucket's gradients when
  // backward() ends, in place of the average. Everything else stays: buckets, their rebuild,
  // no_sync(), gradient_as_bucket_view, join (bucket 0's join flag then travels as its own
  // one-element allreduce, so a joined member still contributes zeros to the hook's allreduces
  // and is noticed by the buffer broadcasts).
  // Once, before the first forward(), on every member, with the same hook (same kind and
  // options). Local: does not communicate. Throws InvalidArgument for an empty hook, a second
  // call, a call after forward(), or with DistributedDataParallelOptions::compression set (use
  // hooks::fp16_compress() instead).
  void register_comm_hook(CommHook hook);

  // Test-only: the parameter names ("module.<name>") of each bucket, in bucket order.
  std::vector<std::vector<std::string>> bucket_names_for_testing() const;
  // Test-only: how many buckets have started their allreduce in the current (or last)
  // synchronized backward pass.
  int buckets_started_for_testing() const;

 private:
  void broadcast_buffers();

  std::shared_ptr<Module> module_;
  DistributedDataParallelOptions options_;
  std::int64_t id_ = 0;  // The root's instance number: names this DDP's ops on every rank.
  std::shared_ptr<detail::Reducer> reducer_;  // Shared (weakly) with the hooks.
  int no_sync_depth_ = 0;
};

// RAII guard: see DistributedDataParallel::no_sync(). Movable, not copyable.
class DistributedDataParallel::NoSync {
 public:
  NoSync(NoSync&& other) noexcept : ddp_(other.ddp_) { other.ddp_ = nullptr; }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;
  NoSync& operator=(NoSync&&) = delete;
  ~NoSync() {
    if (ddp_ != nullptr) --ddp_->no_sync_depth_;
  }

 private:
  friend class DistributedDataParallel;
  explicit NoSync(DistributedDataParallel* ddp) : ddp_(ddp) { ++ddp_->no_sync_depth_; }

  DistributedDataParallel* ddp_;
};

inline DistributedDataParallel::NoSync DistributedDataParallel::no_sync() { return NoSync(this); }

// Batch normalization whose training-mode statistics cover every member's batch
// (torch.nn.SyncBatchNorm): per forward, one blocking allreduce (Sum, float64) of the
// per-channel sums, sums of squares and the element count over `process_set`; the mean and
// biased variance of the whole set's batch normalize, and the running statistics (unbiased
// variance, momentum 0.1) are updated identically on every member. backward() reduces the
// per-channel sums of the output gradient and of its product with the normalized input in one
// more blocking allreduce, so the input gradient accounts for every member's batch; the weight
// and bias gradients are this rank's own contribution, to be averaged by DDP or the
// DistributedOptimizer (as in PyTorch). In evaluation mode it uses the running statistics like
// BatchNorm and does not communicate.
//
// Same parameters ("weight" ones, "bias" zeros), buffers ("running_mean" zeros, "running_var"
// ones), defaults (eps 1e-5, momentum 0.1) and names as BatchNorm1d/2d. Input [n, features],
// [n, features, l] or [n, features, h, w]; n may differ per rank (also 0) as long as the set
// holds more than one value per channel (else InvalidArgument, on every member).
//
// Collective in training mode: the allreduces are named "SyncBatchNorm.<k>", k numbering the
// SyncBatchNorm layers (and converted ones) in the order this process created them, so every
// member must create the same layers in the same order and run the same forward and backward
// passes through them (tutti::join() is fine: joined members contribute nothing). A rank
// outside the set gets InvalidArgument from a training-mode forward. Not for use under
// DataParallel (its threads would issue the collectives in racing order).
class TUTTI_API SyncBatchNorm : public Module {
 public:
  // Throws InvalidArgument for a non-positive feature count. Does not communicate.
  explicit SyncBatchNorm(std::int64_t features, ProcessSet process_set = ProcessSet::global());

  Variable forward(const Variable& input) override;

 private:
  std::int64_t features_;
  Variable weight_;
  Variable bias_;
  Variable running_mean_;
  Variable running_var_;
  std::shared_ptr<const detail::BatchNormSync> sync_;
};

// Makes every BatchNorm1d and BatchNorm2d of `module` (the module itself, and all registered
// descendants, recursively) normalize as a SyncBatchNorm over `process_set`, keeping their
// parameters, buffers, names and evaluation behaviour, and returns `module`.
// Tutti converts in place, where PyTorch builds replacement modules: a C++ module usually calls
// its layers through its own typed pointers (std::shared_ptr<BatchNorm2d> bn_), which a
// replacement registered under the same name would not reach, whereas the converted layer is
// the very object those pointers hold. Layers are numbered for their op names as if created
// now, in registration order (see SyncBatchNorm). Converting a layer again moves it to the new
// set. Local; throws InvalidArgument for a null module.
TUTTI_API std::shared_ptr<Module> convert_sync_batchnorm(
    std::shared_ptr<Module> module, ProcessSet process_set = ProcessSet::global());

// Single-process data parallelism over threads (torch.nn.DataParallel, with threads in place of
// devices): forward() splits the input along dim 0 into min(num_threads, rows) parts of nearly
// equal size (numpy's array_split: the first rows % parts parts one row larger), runs
// module().forward() on each part in its own thread (part 0 on the calling thread; the
// parameters are shared, not copied) and concatenates the outputs along dim 0. The result is
// one recorded operation: its backward runs each part's backward in its own thread, each
// summing its gradients privately (no hook fires and nothing is written meanwhile), then adds
// the parts' sums into the parameters' grad() as one contribution, so hooks fire once per
// backward pass (after all parts) and the DistributedOptimizer composes with it. Outputs and
// gradients equal one forward over the whole batch, to float rounding, for modules without
// batch statistics; BatchNorm normalizes each part with its own statistics and updates its
// running statistics once per part, and Dropout's masks depend on thread scheduling.
//
// The module's forward must be safe to run on several threads at once: the built-in layers
// are (README, "Threads in nn"; Note [Thread safety of nn] in src/nn/variable.cc);
// SyncBatchNorm and DDP are not. Outputs must be [parts rows, ...] with equal trailing dimensions.
// Parameters are named "module.<name>". Exceptions from a thread are rethrown (the first) after all
// threads have finished.
class TUTTI_API DataParallel : public Module {
 public:
  // Throws InvalidArgument for a null module or num_threads < 1.
  DataParallel(std::shared_ptr<Module> module, int num_threads);

  // Throws InvalidArgument for a 0-d input or outputs that cannot be concatenated.
  Variable forward(const Variable& input) override;
  Module& module() const { return *module_; }

 private:
  std::shared_ptr<Module> module_;
  int num_threads_;
};

}  // namespace tutti::nn

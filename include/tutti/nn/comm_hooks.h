// SPDX-License-Identifier: Apache-2.0
// DistributedDataParallel's communication hooks (torch.distributed's DDP comm hooks): a hook
// takes one gradient bucket and returns a future of the reduced bucket, replacing DDP's own
// allreduce of it. Built-ins: plain allreduce, fp16/bf16 compression (wrapping another hook),
// and PowerSGD low-rank compression with error feedback. Register one with
// DistributedDataParallel::register_comm_hook() (tutti/nn/parallel.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tutti/collectives.h"
#include "tutti/export.h"
#include "tutti/process_set.h"
#include "tutti/tensor.h"

namespace tutti::nn {

// One gradient bucket of a DistributedDataParallel, as a hook sees it.
//
// `buffer` is the bucket: every member's gradient, flattened and concatenated in bucket order,
// one contiguous tensor of `buffer.num_elements()` elements (float32 from DDP; float16 or
// bfloat16 inside fp16_compress / bf16_compress). `gradients[i]` is a view of `buffer` (shares
// its memory) with the shape of parameter `names[i]` (DDP's names, "module.<name>"); writing
// either writes both. A hook may reduce `buffer` in place and return it, or return another
// tensor of the same dtype and element count.
struct GradBucket {
  int index = 0;                   // The bucket's position in DDP's bucket list.
  Tensor buffer;                   // The flattened gradients.
  std::vector<std::string> names;  // Per member parameter, in bucket order.
  std::vector<Tensor> gradients;   // Per member: a view of `buffer` shaped like the parameter.
  // True for the last bucket this rank hands to the hook in the current backward pass: every
  // other bucket of the pass has been handed over before it (PyTorch's is_last(); hooks that
  // count iterations, like PowerSGD, advance on it). Buckets are handed over in the order they
  // become ready, so which bucket is last may differ between ranks; what the hooks of one pass
  // see before it does not.
  bool is_last = false;
  // The DDP's process set: the ranks whose gradients the bucket is averaged over.
  ProcessSet process_set = ProcessSet::global();
  // The bucket's op name, "DistributedDataParallel.<root_rank>.<id>.bucket.<index>": identical on
  // every rank and unique among the ops in flight. A hook names its collectives with it (as is,
  // or plus a suffix of its own), so that they match across ranks whatever the order.
  std::string op_name;
  // Tutti addition: the number of this synchronized pass in the set, from 0: the most passes of
  // the set that any member of this pass has seen completed. Identical on every member of the
  // pass, also after a tutti::join(), where a member that joined early has run fewer passes of
  // its own than the others: hooks that change what they send with the iteration (PowerSGD's
  // start_powerSGD_iter) decide from it, never from a count of their own calls. Every bucket of
  // a pass has the same number. (Note [Set-wide pass numbers] in src/nn/parallel/reducer.h.)
  std::int64_t pass_index = 0;
  // Tutti addition: whether a member of this pass missed passes of the set since its previous
  // one (it had joined while the others trained). State a hook keeps from pass to pass and must
  // be the same on every member (PowerSGD's warm-start factors) differs on that member then, so
  // the hook starts that state afresh, on every member alike. The same on every member.
  bool resumed = false;
};

// The future of a hook's result: a tensor that is ready now, or once collectives complete,
// possibly after continuations that run further computation and collectives in between.
//
// Continuations run on the thread that calls poll() or wait() (DDP: the thread running
// backward(); it polls the buckets in flight whenever it starts another, so a chain moves on
// while backward() goes on). A CommFuture is a shared handle: copies refer to the same result.
// Not thread-safe: use a future (and its copies) from one thread at a time.
class TUTTI_API CommFuture {
 public:
  // An empty future; valid() is false and wait() throws InvalidArgument.
  CommFuture() = default;
  // A future whose result is already there.
  static CommFuture ready(Tensor result);
  // A future whose result is `result` once `handle` is done, e.g. a tensor reduced in place by
  // allreduce_async(result, ...). The handle's error, if any, is wait()'s.
  CommFuture(Handle handle, Tensor result);

  // A future of what `next` makes of this one's result, run once the result is ready. `next`
  // takes the result (a const Tensor&) and returns either a Tensor (the final result) or a
  // CommFuture (more communication: the chain continues with it). An error of this future skips
  // `next` and becomes the new future's; an exception thrown by `next` becomes its error.
  template <class F>
  CommFuture then(F next) const {
    using R = std::invoke_result_t<F&, const Tensor&>;
    static_assert(std::is_same_v<R, Tensor> || std::is_same_v<R, CommFuture>,
                  "CommFuture::then: the continuation must return Tensor or CommFuture");
    if constexpr (std::is_same_v<R, CommFuture>) {
      return then_future(std::function<CommFuture(const Tensor&)>(std::move(next)));
    } else {
      return then_future(
          [next = std::move(next)](const Tensor& t) mutable { return CommFuture::ready(next(t)); });
    }
  }

  bool valid() const { return state_ != nullptr; }
  // Moves the chain on as far as it goes without blocking (running continuations whose inputs
  // are ready); true once the result (or an error) is there. Never blocks, never throws.
  bool poll() const;
  // Blocks until the result is there, running the continuations; returns it or throws the
  // first error (a collective's, a continuation's). May be called again: same result or error.
  Tensor wait() const;

 private:
  struct State;  // See Note [Future chains] in src/nn/parallel/comm_hooks.cc.
  static bool advance(State& state, bool block);
  CommFuture then_future(std::function<CommFuture(const Tensor&)> next) const;

  std::shared_ptr<State> state_;
};

// A communication hook: a copyable value wrapping a function from a bucket to a CommFuture of
// its reduced gradients. Copies share the function (and the built-ins' internal state).
//
// A custom hook: the function receives a GradBucket and returns the future of a tensor with
// `bucket.buffer`'s dtype and element count, which replaces the bucket's averaged gradients.
// Collectives it starts must have names identical on every rank (use bucket.op_name) and run
// over bucket.process_set or a subset that contains this rank. For example, averaging with
// Sum and a postscale (what hooks::allreduce() does with Average):
//
//   nn::CommHook sum_then_scale([](nn::GradBucket& bucket) {
//     const double scale = 1.0 / bucket.process_set.size();
//     Handle h = allreduce_async(bucket.buffer, bucket.op_name,
//                                {.op = ReduceOp::Sum, .postscale_factor = scale,
//                                 .process_set = bucket.process_set});
//     return nn::CommFuture(h, bucket.buffer);
//   });
//   ddp.register_comm_hook(sum_then_scale);
//
// and local SGD's hook, which keeps every rank's own gradients (pair it with a
// PeriodicModelAverager): `nn::CommHook([](nn::GradBucket& b) { return
// nn::CommFuture::ready(b.buffer); })`.
//
// The function runs on the thread running backward(), while DDP holds its bucket lock: it must
// not call the DDP. It is called for every bucket of every synchronized backward pass, on every
// member of the set, with the same buckets (index, names, shapes); what it sends must therefore
// be decided from those and from state that every rank advances alike (iteration counts), never
// from the gradient values or timing alone, or ranks would start different collectives. An
// exception thrown by it, or by its future, is rethrown by backward() after every bucket was
// waited for (other ranks then wait for this rank's missing collectives until the stall
// inspector fails them), and the DDP refuses every later forward() on this rank, so that its
// next pass never pairs with the others' unfinished one.
class TUTTI_API CommHook {
 public:
  using Function = std::function<CommFuture(GradBucket& bucket)>;

  // The empty hook: DDP's own allreduce. Where a hook wraps another (fp16_compress), the empty
  // inner hook means hooks::allreduce().
  CommHook() = default;
  // A hook that calls `function`; `name` is for messages ("custom" by default). Throws
  // InvalidArgument for an empty function.
  explicit CommHook(Function function, std::string name = "custom");

  bool empty() const { return function_ == nullptr; }
  const std::string& name() const { return name_; }
  // Calls the function (InvalidArgument if empty).
  CommFuture operator()(GradBucket& bucket) const;

 private:
  std::shared_ptr<const Function> function_;
  std::string name_;
};

namespace hooks {

// Averages the bucket with allreduce_async(Average) in place, under bucket.op_name: exactly
// what DDP does without a hook. `process_set`: the global set (the default) means the DDP's own
// set (bucket.process_set); another set averages over that set instead, which must contain this
// rank (InvalidArgument from backward() otherwise), e.g. to average within a subgroup only.
TUTTI_API CommHook allreduce(ProcessSet process_set = ProcessSet::global());

// Converts the float32 bucket to float16 (bfloat16), runs `inner` on that (default: allreduce,
// which reduces in float32 and converts back), and converts the result back into the float32
// bucket. Halves the bytes of whatever `inner` sends; precision drops to float16's 11 bits
// (bfloat16's 8, with float32's range). `inner` must accept 2-byte buckets: the built-ins do
// (PowerSGD sends its factors in the bucket's type and computes in float32). Same as DDP's
// compression option, which cannot be combined with a hook.
TUTTI_API CommHook fp16_compress(CommHook inner = {});
TUTTI_API CommHook bf16_compress(CommHook inner = {});

// PowerSGD's options and counters (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.
// PowerSGDState). The options are read when the hook is made (powersgd()/batched_powersgd());
// changing them later has no effect. The counters are written by the hook after each pass.
struct PowerSGDState {
  // r: the rank of the factors P (n x r) and Q (m x r) that replace each compressed n x m
  // matrix (capped at min(n, m)). Higher r: more accurate, more bytes. At least 1.
  int matrix_approximation_rank = 1;
  // Plain allreduce for the first iterations (passes), PowerSGD from this one on: compressing
  // from the start hurts accuracy. Must be > 1 with use_error_feedback or warm_start (the
  // buckets are rebuilt after the first pass, and both keep per-bucket memory).
  int start_powerSGD_iter = 1000;  // NOLINT(readability-identifier-naming): PyTorch's name.
  // A matrix is compressed only if m·n > min_compression_rate · (m+n)·r; smaller ones (biases,
  // small layers) are averaged uncompressed, in one allreduce per bucket. >= 0.
  double min_compression_rate = 2;
  // Adds the previous iteration's compression error (per bucket) to the gradients before
  // compressing: what is lost once is sent later. Costs a bucket-sized buffer per bucket.
  bool use_error_feedback = true;
  // Starts each iteration's power iteration from the previous Q instead of fresh random values:
  // better approximations at the same rank. Costs the factors' memory per bucket. In a pass
  // where a member comes back from a join (GradBucket::resumed), every member starts afresh.
  bool warm_start = true;
  // Added to each column norm in the Gram-Schmidt orthogonalization; 0 divides by the norm
  // alone (a zero column is then left zero). >= 0.
  double orthogonalization_epsilon = 0;
  // Seeds the random initial Q, identically on every rank (a fresh draw per bucket and
  // initialization, derived from the seed, the bucket index, the pass number and the draw count
  // within the pass).
  std::uint64_t random_seed = 0;

  // Counters, written by the hook (PyTorch's names; additions to API.md's fields).
  // Completed synchronized passes of the set (GradBucket::pass_index + 1 of the last pass this
  // rank ran): a rank that joined early catches up in its next pass.
  std::int64_t iter = 0;
  // Gradient elements handed to the hook since the start of compression, and the elements it
  // sent for them (P and Q: (n+m)·r per compressed matrix; the rest as they are). Their ratio is
  // PyTorch's compression_stats().
  std::int64_t total_numel_before_compression = 0;
  std::int64_t total_numel_after_compression = 0;
};

// PowerSGD (Vogels et al., 2019; PyTorch's powerSGD_hook): before start_powerSGD_iter (counted
// in the set's synchronized passes, GradBucket::pass_index, so that every member switches in the
// same pass also after a tutti::join()), a plain allreduce. From then on, per bucket: the error
// of the previous iteration is added (error feedback); each gradient viewed as a matrix
// (n = dim 0, m = the rest: 2-D weights, conv weights as out × in·k·k, vectors as n × 1) that
// passes min_compression_rate is compressed:
//   P = M·Q (Q random, or last iteration's, orthogonalized); allreduce(Sum) all P's; orthogonalize
//   P; Q = Mᵀ·P; allreduce(Average) all Q's; M ≈ P·Qᵀ,
// the others are averaged uncompressed; this rank's own error M - P·(Mᵀ·P)ᵀ is kept for the
// next iteration. Three allreduces per bucket (uncompressed, P's, Q's), named bucket.op_name +
// ".powersgd.u", ".p", ".q". At full rank (r = min(n, m)) the result equals allreduce's, to
// float rounding, also after a tutti::join() with error feedback (a matrix with more rows than
// columns is then compressed as its transpose: README, PowerSGD).
// Throws InvalidArgument for a null state, a rank < 1, a negative or NaN rate or epsilon, or
// start_powerSGD_iter <= 1 with use_error_feedback or warm_start.
TUTTI_API CommHook powersgd(std::shared_ptr<PowerSGDState> state);

// PowerSGD over the whole bucket at once (PyTorch's batched_powerSGD_hook): the flat bucket,
// zero-padded to s² elements with s = ceil(sqrt(count)), is one s × s matrix compressed to rank
// r, so every bucket sends 2·s·r elements. Cheaper to compute and coarser than powersgd();
// min_compression_rate does not apply. Two allreduces per bucket (".powersgd.p", ".q").
TUTTI_API CommHook batched_powersgd(std::shared_ptr<PowerSGDState> state);

}  // namespace hooks
}  // namespace tutti::nn

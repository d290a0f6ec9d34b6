// SPDX-License-Identifier: Apache-2.0
// DistributedDataParallel's gradient buckets and the per-backward-pass protocol that averages
// them across ranks (PyTorch's Reducer). Private to src/nn.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/common/mutex.h"
#include "src/common/thread_annotations.h"
#include "src/nn/autograd.h"
#include "tutti/collectives.h"
#include "tutti/nn/comm_hooks.h"
#include "tutti/nn/variable.h"
#include "tutti/process_set.h"

namespace tutti::nn::detail {

// Note [DDP reduction passes]
// A synchronized pass runs from the backward of a DDP output to the end of that backward():
//  1. DDP::forward() wraps the module's output in an identity operation. Its backward runs
//     before any parameter's (they are upstream of it), and calls start_pass(): it queues
//     finish_pass() as a backward callback (Note [Backward callbacks] in src/nn/variable.cc),
//     resets every bucket's pending count and, with find_unused_parameters, marks the
//     parameters the forward did not reach as ready.
//  2. Each parameter's grad hook marks it ready. The bucket whose last member becomes ready
//     starts its reduction (Average) there, mid-backward: with gradients that are views of the
//     bucket (as_view) or compression, an allreduce_async of the bucket; otherwise a
//     grouped_allreduce_async of the gradients themselves, in place (Note [Gradients reduced
//     in place]).
//  3. finish_pass(), once every gradient is final: parameters still not ready are marked ready
//     with their current grad(), so every bucket is submitted on every rank and no member waits
//     forever; then every bucket is waited for and its average written back into the grad()s
//     that went through it. The first pass that no member has joined (without
//     find_unused_parameters) rebuilds the buckets in the root's ready order, whatever this
//     rank saw, so that every member takes part in the broadcast. Errors are thrown last: a
//     reduction's first, else the unused parameters' InvalidArgument.
// A backward() whose walk throws (a hook, a grad() of the wrong shape) still runs finish_pass()
// (Note [Backward callbacks] in src/nn/variable.cc): the buckets this rank had not started go
// out with its current grad()s, so the other members finish the same pass, and the walk's
// exception is thrown. A walk that throws before it reached the DDP output (in the loss's own
// backward) calls start_pass() from the output's failed-pass hook (Note [A walk that throws] in
// src/nn/backward_walk.cc), so that pass is made the same way. A pass that never reached
// finish_pass() leaves buckets in flight; the next forward() (abandon_pass()) waits for them and
// drops the results of those that went through a bucket. A bucket whose launch, comm hook or hook
// future failed may lack collectives the other members wait in: the DDP then refuses every later
// forward(). Hooks firing outside a pass (no_sync(), or a backward not through a DDP output) do
// nothing: gradients stay local. Bucket 0 carries one extra element, 1 on every rank that reduces
// it: its average is the fraction of members that have not joined, which tells any_joined(). With a
// communication hook (register_comm_hook), step 2 hands the bucket (without the join slot, which
// then travels as its own allreduce "<prefix>.join") to the hook instead of starting the allreduce,
// and step 3 waits for the hook's future and writes its result into the bucket. Before handing a
// bucket over, the buckets in flight are polled, so hooks' chains of collectives (PowerSGD's three)
// move on during backward(). With a hook, step 1 also starts the pass count of Note [Set-wide
// pass numbers], which the first bucket handed over waits for.
//
// Note [Set-wide pass numbers]
// A hook that changes what it sends with the iteration (PowerSGD compresses from a given pass
// on) must decide alike on every member of a pass. A member that has joined (tutti::join()) runs
// no pass while the others go on (its runtime adds zeros to their collectives; this Reducer
// sees nothing), so a count of its own passes falls behind theirs, and in the next epoch its
// collectives were not the others': PowerSGD's pass stalled. So, with a hook, start_pass() also
// starts "<prefix>.pass", a Sum of one int64 per member: each writes into its own slot one more
// than passes_, the passes of the set it has seen completed, and a joined member adds zeros.
// Before the first bucket goes to the hook, take_pass_count() waits for it: the largest slot less
// one is GradBucket::pass_index (passes are run by members that do not join meanwhile, so a
// member of the last pass knows them all), and a slot above zero but below the largest,
// GradBucket::resumed (a member is back from a join having missed passes: state that hooks keep
// from pass to pass, and that must agree, differs there). Every member of the pass sees the same
// result, and sets passes_ to pass_index + 1. If the members that knew the most passes have all
// joined, the others number their passes from what they know: lower than before, but again the
// same on every member, which is what the decisions need. Without a hook, nothing is counted.
//
// Note [Gradients reduced in place]
// Without views, compression or a hook, a bucket's gradients used to be copied into it when
// ready and the average copied back when backward() ended: about 17 MB each way a step of
// synthetic_benchmark's model. On the 2-core AMD EPYC VM DDP's step took 139.9-140.5 ms with
// the copies against 136.8-137.3 with gradient_as_bucket_view (three alternated pairs), which
// is what kept DDP behind DistributedOptimizer (P8). Now the gradients themselves are the
// bucket's reduction, one grouped allreduce under the bucket's name: the runtime packs them
// into its own fusion buffer as it would the bucket, so the reduction's work is the same and
// the two copies are gone (P8 0.885-1.018, median 0.991, against 0.997-1.040, median 1.036,
// six alternated pairs). A gradient that cannot be reduced where it is (none, or another dtype
// or size than its parameter's) goes through its slice of the bucket: none counts as zeros
// and is left empty, another dtype or size counts as zeros and is an InvalidArgument that
// finish_pass() throws. Bucket 0's join slot travels as the group's last tensor. A failed or
// abandoned reduction can no longer leave the gradients reduced in place untouched: they hold
// whatever the runtime wrote, as with gradient_as_bucket_view.
//
// Threads: every member runs on the thread that calls forward()/backward(); the mutex guards
// against a hook of a shared parameter firing from another thread's backward().
class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  struct Parameter {
    std::string name;  // "module.<name>", for messages.
    Variable variable;
  };
  struct Config {
    std::string op_prefix;  // "DistributedDataParallel.<root>.<id>", identical on every rank.
    bool find_unused = false;
    bool as_view = false;
    Compression compression = Compression::None;
    int root_rank = 0;
    ProcessSet process_set = ProcessSet::global();
    std::int64_t first_cap_bytes = 0;
    std::int64_t cap_bytes = 0;
  };

  // Builds the initial buckets (reverse parameter order); with as_view, copies each grad()
  // into its bucket and makes grad() a view of it. Does not communicate.
  Reducer(std::vector<Parameter> parameters, Config config);
  // Waits for buckets in flight, ignoring errors.
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Registers the grad hooks (they hold this object weakly). Call once, after make_shared.
  void register_hooks();

  // forward(), before the module runs: finishes an abandoned pass and, with as_view, re-points
  // gradients that no longer alias their bucket.
  void before_forward();
  // find_unused: records the parameters reachable from `output`.
  void note_reached(const Variable& output);
  // `output`, recorded through the identity operation of Note [DDP reduction passes] step 1.
  Variable attach(const Variable& output);

  // Whether some member had joined at the last completed reduction of bucket 0.
  bool any_joined() const;

  // DistributedDataParallel::register_comm_hook(): throws InvalidArgument (naming the reason)
  // for an empty hook, a second hook, a hook after the first forward(), or with compression.
  void set_comm_hook(CommHook hook) TUTTI_EXCLUDES(mutex_);

  std::vector<std::vector<std::string>> bucket_names() const;
  int buckets_started() const;

 private:
  struct Bucket {
    std::vector<std::size_t> members;   // Parameter indices, in bucket order.
    std::vector<std::int64_t> offsets;  // Element offset of each member in `contents`.
    // Per member, this pass: the gradient reduced in place (Note [Gradients reduced in place]),
    // or empty where the gradient goes through `contents`.
    std::vector<Tensor> in_place;
    Tensor contents;          // float32; bucket 0 has one more element (the join slot).
    Tensor wire;              // The 2-byte copy that travels, with compression.
    std::size_t pending = 0;  // Members not yet ready in this pass.
    bool started = false;
    bool in_flight = false;
    Handle handle;
    CommFuture future;            // With a hook: its result, instead of `handle`.
    bool join_in_flight = false;  // With a hook, bucket 0: the join slot's own allreduce.
    Handle join_handle;
  };

  void build_buckets(const std::vector<std::vector<std::size_t>>& assignment)
      TUTTI_REQUIRES(mutex_);
  Tensor slice_of(std::size_t index) const TUTTI_REQUIRES(mutex_);
  // Whether parameter `index`'s grad() can go into its bucket slice: float32, of its size.
  bool fits_bucket(std::size_t index) const TUTTI_REQUIRES(mutex_);
  // Whether buckets are reduced as their gradients in place (no hook, no views, no compression).
  bool reduces_in_place() const TUTTI_REQUIRES(mutex_);
  void start_pass() TUTTI_EXCLUDES(mutex_);
  void finish_pass() TUTTI_EXCLUDES(mutex_);
  void abandon_pass() TUTTI_REQUIRES(mutex_);
  void on_gradient(std::size_t index) TUTTI_EXCLUDES(mutex_);
  void mark_ready(std::size_t index) TUTTI_REQUIRES(mutex_);
  void launch(std::size_t bucket) TUTTI_REQUIRES(mutex_);
  void launch_hook(std::size_t bucket) TUTTI_REQUIRES(mutex_);
  // Note [Set-wide pass numbers]: starts this pass's count (start_pass(), with a hook), and
  // waits for it, setting pass_index_, resumed_ and passes_ (throws the allreduce's error).
  void start_pass_count() TUTTI_REQUIRES(mutex_);
  void take_pass_count() TUTTI_REQUIRES(mutex_);
  void finish_hook(std::size_t bucket) TUTTI_REQUIRES(mutex_);
  std::exception_ptr wait_all(bool write_results) TUTTI_REQUIRES(mutex_);
  // Marks the DDP broken (every later forward() throws InvalidArgument) where bucket `b`'s
  // collectives may be missing on this rank: a launch or a hook's future failed with `error`.
  void break_off(std::size_t b, const char* what, const std::exception_ptr& error)
      TUTTI_REQUIRES(mutex_);
  void rebuild() TUTTI_REQUIRES(mutex_);

  std::vector<Parameter> parameters_;
  Config config_;
  std::vector<std::int64_t> bytes_;  // Per parameter.
  std::unordered_map<const VariableImpl*, std::size_t> index_of_;

  mutable tutti::detail::Mutex mutex_;
  std::vector<Bucket> buckets_ TUTTI_GUARDED_BY(mutex_);
  std::vector<std::size_t> bucket_of_ TUTTI_GUARDED_BY(mutex_);  // Per parameter.
  // Per parameter: its position in its bucket.
  std::vector<std::size_t> member_of_ TUTTI_GUARDED_BY(mutex_);
  bool pass_active_ TUTTI_GUARDED_BY(mutex_) = false;
  std::vector<bool> ready_ TUTTI_GUARDED_BY(mutex_);               // Per parameter, this pass.
  std::vector<std::size_t> ready_order_ TUTTI_GUARDED_BY(mutex_);  // This pass.
  // find_unused: since the last pass started.
  std::vector<bool> reached_ TUTTI_GUARDED_BY(mutex_);
  // From a launch; thrown by finish_pass().
  std::exception_ptr pass_error_ TUTTI_GUARDED_BY(mutex_);
  int started_ TUTTI_GUARDED_BY(mutex_) = 0;
  bool rebuilt_ TUTTI_GUARDED_BY(mutex_) = false;
  bool any_joined_ TUTTI_GUARDED_BY(mutex_) = false;
  bool forwarded_ TUTTI_GUARDED_BY(mutex_) = false;  // forward() has run.
  std::string broken_ TUTTI_GUARDED_BY(mutex_);      // Why it cannot go on; empty: it can.
  // as_view: a grad() replaced by an incompatible tensor before this forward(), for
  // finish_pass() to throw; empty: none.
  std::string replaced_ TUTTI_GUARDED_BY(mutex_);
  CommHook hook_ TUTTI_GUARDED_BY(mutex_);  // Empty: DDP's own allreduce.
  // With a hook: Note [Set-wide pass numbers]. The slots (int64, one per member) are reduced in
  // place while pass_count_in_flight_.
  std::int64_t passes_ TUTTI_GUARDED_BY(mutex_) = 0;
  std::int64_t pass_index_ TUTTI_GUARDED_BY(mutex_) = 0;
  bool resumed_ TUTTI_GUARDED_BY(mutex_) = false;
  Tensor pass_slots_ TUTTI_GUARDED_BY(mutex_);
  Handle pass_handle_ TUTTI_GUARDED_BY(mutex_);
  bool pass_count_in_flight_ TUTTI_GUARDED_BY(mutex_) = false;
};

}  // namespace tutti::nn::detail

// SPDX-License-Identifier: Apache-2.0
// Collective operations and their handles (API.md, "Collectives").
//
// Every op is asynchronous: the `_async` call checks its own arguments (throwing
// InvalidArgument at once, before anything is sent), queues the op and returns a Handle. The
// background thread matches ops across the ranks of the process set BY NAME, so ranks may
// submit in different orders; it fuses small tensors and runs the collective. Disagreements
// between ranks (dtype, shape, op, root, scale factors, device) fail the op on every rank with
// Mismatch, thrown by Handle::wait(). The blocking forms are `_async(...)` then wait().
//
// Names: a name may not be reused within a process set while an op with that name is in
// flight (InvalidArgument); afterwards it may be reused with any shape or dtype. An empty name
// becomes "<op>.noname.<n>" with a per-set counter, so unnamed ops must be issued in the same
// order on every rank. Names starting with "tutti." are reserved for Tutti's own ops (join,
// process-set changes): a user op named so is InvalidArgument.
//
// Memory: every TensorView passed in must stay alive and unmodified until the handle is done.
// All functions are thread-safe.
//
// Devices: every op takes CPU tensors or, in a build with CUDA, tensors on Device::cuda(i),
// not both in one op. With CUDA tensors:
//  - The op waits, on the GPU and without blocking the call, for the work enqueued before the
//    call on this thread's current stream (tutti/cuda.h; by default the legacy default
//    stream, which covers cudaMemcpy and blocking streams): a tensor written there may be
//    submitted at once. Work on other streams must be ordered before it by the caller.
//  - Outputs (in place, and those of allgather, alltoall and reducescatter, which are on the
//    same device) are ready for any stream once wait() returns or poll() is true.
//  - All of a rank's CUDA tensors are on one device during a session (usually
//    cuda:local_rank); another device is InvalidArgument at the call.
//  - The collective runs on NCCL when every member of the set has a GPU of its own, else
//    (ranks sharing a GPU, or no NCCL) on MPI through page-locked host copies.
//  - ADASUM is refused (InvalidArgument): reduce a CPU copy.
// A CUDA tensor in a build without CUDA, or for a device this process does not see, is
// InvalidArgument at the call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/export.h"
#include "tutti/process_set.h"
#include "tutti/tensor.h"

namespace tutti {

namespace detail {
class OpState;
struct HandleAccess;
}  // namespace detail

// Average = Sum / set size. Adasum: adaptive summation, floating types only.
enum class ReduceOp : std::uint8_t { Average, Sum, Min, Max, Product, Adasum };

// "AVERAGE", "SUM", "MIN", "MAX", "PRODUCT", "ADASUM".
TUTTI_API std::string_view to_string(ReduceOp op);

struct ReduceOptions {
  ReduceOp op = ReduceOp::Average;
  double prescale_factor = 1.0;   // Applied to each input before the reduction.
  double postscale_factor = 1.0;  // Applied to the result (after Average's division).
  ProcessSet process_set = ProcessSet::global();
};

// How the data-parallel wrappers (nn::DistributedDataParallel, optim::DistributedOptimizer,
// which names this type optim::Compression) send float32 gradients. FP16/BF16 halve the bytes
// sent at the cost of precision: the gradients are converted into a 2-byte temporary, reduced
// (in float32 arithmetic, see allreduce_async) and converted back when the reduction
// completes. FP16 overflows above 65504; BF16 keeps float32's range with 8 bits of mantissa.
enum class Compression { None, FP16, BF16 };

// The result of an asynchronous op, made by the `_async` functions. Copies share the same op.
// Every method may be called from any thread, concurrently.
class TUTTI_API Handle {
 public:
  // Refers to no op. It behaves as an op that has already failed with InvalidArgument
  // ("refers to no op"): poll() is true (done), and wait() and the result accessors throw.
  Handle() = default;

  bool poll() const;  // Done (successfully or not)? Never blocks, never throws.
  void wait();        // Blocks until done; throws tutti::Error if the op failed.
  // The result of allgather, alltoall and reducescatter (waits first, throws as wait()).
  const Tensor& output() const;
  // irecv (tutti/p2p.h): the sender's global rank; waits first and throws as wait(). -1 after
  // any other op.
  int source() const;
  // The results of grouped allgather and grouped reducescatter, in input order (waits first).
  const std::vector<Tensor>& outputs() const;
  // alltoall: rows received from each set rank (waits first).
  const std::vector<std::int64_t>& received_splits() const;

 private:
  friend struct detail::HandleAccess;
  explicit Handle(std::shared_ptr<detail::OpState> state);
  // Waits; throws as wait(). A const wait for the const accessors.
  void await() const;

  std::shared_ptr<detail::OpState> state_;
};

TUTTI_API bool poll(const Handle& h);   // h.poll()
TUTTI_API void synchronize(Handle& h);  // h.wait()
// Tutti addition: waits for every handle, then throws the first failure (in order) if any.
// All are waited for even when one fails, so no tensor is released while the runtime still
// works on it.
TUTTI_API void wait_all(std::vector<Handle>& handles);

// Reduces `tensor` in place: result = postscale · reduce(prescale · input) over the set.
// Every numeric dtype; Float16/BFloat16 are reduced in float32; Bool only with Min/Max and
// without scale factors;
// Adasum floating types only, and on CPU a power-of-two set size. Integers without scale
// factors and not averaged are exact, and an overflowing integer Sum or Product is not defined
// (README, Collectives and errors); otherwise the result is trunc(postscale · reduce(prescale ·
// input) [/ size]) computed in double (API.md): truncated toward zero once, at the end, and
// saturated (a value beyond the dtype's range becomes its nearest limit).
// Throws InvalidArgument for an unsupported dtype/op, a name in flight, a set without this rank.
TUTTI_API Handle allreduce_async(TensorView tensor, std::string name = {}, ReduceOptions = {});
// Out of place: `input` is left unchanged, `output` (same dtype, element count and device)
// receives the result. They must not overlap unless they are the same memory (partly
// overlapping views are InvalidArgument).
TUTTI_API Handle allreduce_async(TensorView input, TensorView output, std::string name = {},
                                 ReduceOptions = {});
// Reduces all `tensors` in place as one unit: negotiated, fused and completed together. The
// tensors may have different dtypes. The group is one op under `name` (no name of its own per
// tensor: an op named "<name>.0" meanwhile is another op); errors name its i-th tensor
// "<name>[i]". Each tensor is written, so no two may share memory (one listed twice, or
// overlapping views; empty ones never overlap): InvalidArgument from the call.
TUTTI_API Handle grouped_allreduce_async(std::vector<TensorView> tensors, std::string name = {},
                                         ReduceOptions = {});

// Concatenates every member's `input` along dim 0 in set-rank order; output() holds it.
// Dim 0 may differ per rank, the other dims and the dtype must match. 0-d is InvalidArgument.
TUTTI_API Handle allgather_async(TensorView input, std::string name = {},
                                 ProcessSet = ProcessSet::global());
TUTTI_API Handle grouped_allgather_async(std::vector<TensorView> inputs, std::string name = {},
                                         ProcessSet = ProcessSet::global());
// Copies the root's `tensor` into every member's `tensor` (in place). `root_rank` is a global
// rank and must be a member. Shapes and dtypes must match.
TUTTI_API Handle broadcast_async(TensorView tensor, int root_rank, std::string name = {},
                                 ProcessSet = ProcessSet::global());
// Sends splits[i] rows of dim 0 to set rank i (in order); empty splits = equal parts (dim 0
// divisible by the set size). output() holds the received rows in set-rank order and
// received_splits() the count from each rank.
TUTTI_API Handle alltoall_async(TensorView input, std::vector<std::int64_t> splits = {},
                                std::string name = {}, ProcessSet = ProcessSet::global());
// Reduces (Sum or Average) and scatters along dim 0: set rank r receives rows
// [r·q + min(r, m), ...) with q = n / size, m = n % size.
TUTTI_API Handle reducescatter_async(TensorView input, std::string name = {}, ReduceOptions = {});
TUTTI_API Handle grouped_reducescatter_async(std::vector<TensorView> inputs, std::string name = {},
                                             ReduceOptions = {});

// Blocking forms: the `_async` call, then wait().
TUTTI_API void allreduce(TensorView tensor, std::string name = {}, ReduceOptions = {});
TUTTI_API void grouped_allreduce(std::vector<TensorView> tensors, std::string name = {},
                                 ReduceOptions = {});
TUTTI_API Tensor allgather(TensorView input, std::string name = {},
                           ProcessSet = ProcessSet::global());
TUTTI_API void broadcast(TensorView tensor, int root_rank, std::string name = {},
                         ProcessSet = ProcessSet::global());
struct AlltoallResult {
  Tensor output;
  std::vector<std::int64_t> received_splits;
};
TUTTI_API AlltoallResult alltoall(TensorView input, std::vector<std::int64_t> splits = {},
                                  std::string name = {}, ProcessSet = ProcessSet::global());
TUTTI_API Tensor reducescatter(TensorView input, std::string name = {}, ReduceOptions = {});

// Rooted collectives (torch.distributed's reduce, gather, scatter). Negotiated like the ops
// above and asynchronous like them: every `_async` call returns at once, without waiting for
// the other members. `root_rank` is a global rank in the set. A rank's own bad arguments
// (a root outside the set, Adasum, Bool with Sum/Average/Product, a 0-d gather input, the
// root's 0-d scatter input or its splits of the wrong length, negative, adding up to more than
// dim 0, or no splits with dim 0 not divisible by the set size) throw InvalidArgument from that
// rank's call, before anything is sent. Ranks that disagree on the root, shape, dtype or
// device get Mismatch from wait() on every rank; a root that has joined fails the op with
// InvalidArgument from wait() on every rank (see join()).
// The algorithms are rooted: only the root receives the reduction or the gathered rows, and
// only the root sends a scatter's parts (on shared memory within a host, or MPI_Reduce,
// MPI_Gatherv, MPI_Scatterv; NCCL's reduce and send/receive for CUDA tensors). README
// "Rooted collectives" has the figures.
// reduce: allreduce's arithmetic (ops, scale factors, the integer rule, dtypes), but only the
// root's `tensor` receives the result, in place; the others' tensors are only read, never
// written. Adasum is InvalidArgument. Reduces with the same root fuse like allreduces.
TUTTI_API Handle reduce_async(TensorView tensor, int root_rank, std::string name = {},
                              ReduceOptions = {});
// gather: on the root output() is the concatenation along dim 0 in set-rank order (dim 0 may
// differ per rank, the other dims must match); on the other ranks an empty Tensor. A joined
// member contributes no rows. Gathers with the same root fuse like allgathers.
TUTTI_API Handle gather_async(TensorView input, int root_rank, std::string name = {},
                              ProcessSet = ProcessSet::global());
// scatter: the root's input split along dim 0, splits[i] rows to set-rank i (empty = equal
// parts); every rank's output() holds its rows with the root's dtype and trailing dims. Other
// ranks pass a view of the root's dtype and device whose data and shape are ignored (an empty
// view is fine), and their splits are ignored. Fails with InvalidArgument from wait() while
// any member has joined (every member receives a part).
TUTTI_API Handle scatter_async(TensorView input, int root_rank,
                               std::vector<std::int64_t> splits = {}, std::string name = {},
                               ProcessSet = ProcessSet::global());
TUTTI_API void reduce(TensorView tensor, int root_rank, std::string name = {}, ReduceOptions = {});
TUTTI_API Tensor gather(TensorView input, int root_rank, std::string name = {},
                        ProcessSet = ProcessSet::global());
TUTTI_API Tensor scatter(TensorView input, int root_rank, std::vector<std::int64_t> splits = {},
                         std::string name = {}, ProcessSet = ProcessSet::global());

// Blocks until every member of the set reaches the barrier. Collective.
TUTTI_API void barrier(ProcessSet = ProcessSet::global());
// This rank has no more data. Blocks until every member has joined; meanwhile the others'
// allreduces see zeros from joined ranks and their allgathers skip joined ranks' rows.
// Returns the global rank whose join the coordinator saw last (the same on every rank).
TUTTI_API int join(ProcessSet = ProcessSet::global());

// Byte-string helpers over broadcast and allgather (for serialized objects). An empty `name`
// is "broadcast_object.noname" / "allgather_object.noname", not a counted automatic name: two
// threads calling one of them unnamed at once collide ("already in flight"); name them.
TUTTI_API std::string broadcast_object(std::string_view bytes, int root_rank, std::string name = {},
                                       ProcessSet = ProcessSet::global());
TUTTI_API std::vector<std::string> allgather_object(std::string_view bytes, std::string name = {},
                                                    ProcessSet = ProcessSet::global());

}  // namespace tutti

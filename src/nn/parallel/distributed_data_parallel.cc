// SPDX-License-Identifier: Apache-2.0
// DistributedDataParallel: the module wrapper (construction, forward, buffers); the buckets and
// their reduction live in detail::Reducer (src/nn/parallel/reducer.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/base/strings.h"
#include "src/nn/autograd.h"
#include "src/nn/parallel/reducer.h"
#include "src/nn/tensor_math.h"
#include "tutti/collectives.h"
#include "tutti/nn/parallel.h"
#include "tutti/runtime.h"

namespace tutti::nn {
namespace {

constexpr double kBytesPerMb = 1024.0 * 1024.0;  // PyTorch's "MB" is a MiB.

void check_options(const DistributedDataParallelOptions& o) {
  for (const auto& [name, mb] : {std::pair{"bucket_cap_mb", o.bucket_cap_mb},
                                 std::pair{"first_bucket_mb", o.first_bucket_mb}}) {
    if (!(mb > 0) || !std::isfinite(mb)) {
      detail::throw_invalid_argument("DistributedDataParallel: ", name,
                                     " must be a positive number, got ", mb);
    }
  }
  if (o.compression != Compression::None && o.compression != Compression::FP16 &&
      o.compression != Compression::BF16) {
    detail::throw_invalid_argument("DistributedDataParallel: unknown compression ",
                                   static_cast<int>(o.compression));
  }
  if (!o.process_set.included()) {
    detail::throw_invalid_argument(
        "DistributedDataParallel: this rank is not a member of process "
        "set ",
        o.process_set.id(), "; construct it on the members only");
  }
  const std::vector<int>& members = o.process_set.ranks();
  if (std::find(members.begin(), members.end(), o.root_rank) == members.end()) {
    detail::throw_invalid_argument("DistributedDataParallel: root_rank ", o.root_rank,
                                   " is not a member of process set ", o.process_set.id());
  }
}

// Starts every broadcast, then waits for all (the tensors must stay alive until then) and
// rethrows the first error. Returns false instead when every failure was an InvalidArgument
// from wait() and `joined_root_ok`: join's verdict on a broadcast whose root has joined, which
// every member receives alike.
bool broadcast_all(const std::vector<std::pair<std::string, Tensor>>& tensors, int root,
                   const ProcessSet& set, bool joined_root_ok = false) {
  std::vector<Handle> handles;
  std::exception_ptr first_error;
  for (const auto& [name, tensor] : tensors) {
    try {
      handles.push_back(broadcast_async(tensor, root, name, set));
    } catch (...) {
      first_error = std::current_exception();  // The call's own error: always reported.
      joined_root_ok = false;
      break;
    }
  }
  bool completed = true;
  for (Handle& handle : handles) {
    try {
      handle.wait();
    } catch (const Error& e) {
      completed = false;
      if (joined_root_ok && e.code() == ErrorCode::InvalidArgument) continue;
      if (!first_error) first_error = std::current_exception();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
  return completed;
}

// Note [One model on every rank]
// The initial broadcasts are matched by name: a rank whose model has other parameters (more,
// fewer, other names) submitted names its peers never did, and the job stalled until the stall
// limit (10 minutes by default) instead of failing. So the root first broadcasts the DDP's id
// with its model's signature (how many tensors, a hash of their names and shapes), each member
// compares it with its own, and a MIN allreduce of the answers fails every member alike with
// Mismatch when any differs.
std::uint64_t model_signature(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::uint64_t hash = tutti::detail::kFnv1aBasis;
  for (const auto& [name, tensor] : tensors) {
    // With the terminator: "ab","c" != "a","bc".
    hash = tutti::detail::fnv1a(hash, name.data(), name.size() + 1);
    const Shape& shape = tensor.shape();
    const auto dims = static_cast<std::int64_t>(shape.size());
    hash = tutti::detail::fnv1a(hash, &dims, sizeof dims);
    hash = tutti::detail::fnv1a(hash, shape.data(), shape.size() * sizeof(std::int64_t));
  }
  return hash;
}

// The members agree on `mine` (count, signature) against the root's `root` (Note [One model on
// every rank]); throws Mismatch on every member if any differs.
void check_same_model(std::int64_t count, std::int64_t signature,
                      std::span<const std::int64_t> root, int root_rank, const ProcessSet& set) {
  const bool same = root[1] == count && root[2] == signature;
  Tensor agree = Tensor::from<std::int64_t>(std::vector<std::int64_t>{same ? 1 : 0}, {});
  allreduce(agree, "DistributedDataParallel.init.agree", {.op = ReduceOp::Min, .process_set = set});
  if (agree.span<std::int64_t>()[0] == 1) return;
  throw Error(ErrorCode::Mismatch,
              tutti::detail::str_cat(
                  "DistributedDataParallel: the model differs across the ranks of its "
                  "process set (here ",
                  count, " parameters and buffers, signature ", signature, "; root rank ",
                  root_rank, ": ", root[1], ", signature ", root[2],
                  same ? "; this rank's matches the root's, another rank's does not" : "",
                  "): every rank must build the same model"));
}

// A bucket cap in bytes. A cap of more bytes than an int64 holds (DBL_MAX for "no cap") was
// cast as it was, which is undefined (it gave one bucket per parameter here): any cap above
// 2^62 bytes is no cap at all.
std::int64_t cap_bytes(double mb) {
  return static_cast<std::int64_t>(std::min(mb * kBytesPerMb, 0x1p62));
}

// The prefix of this DDP's op names: the root's rank and instance number, so that DDPs of one
// set whose roots differ never share it (each root's counts are its own).
std::string op_prefix(int root_rank, std::int64_t id) {
  return tutti::detail::str_cat("DistributedDataParallel.", root_rank, ".", id);
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module,
                                                 DistributedDataParallelOptions options)
    : options_(std::move(options)) {
  if (!module) detail::throw_invalid_argument("DistributedDataParallel: the module is null");
  check_options(options_);
  module_ = register_module("module", std::move(module));

  // Each Variable once, under its first name: a tensor listed twice must be reduced once.
  std::vector<detail::Reducer::Parameter> parameters;
  std::unordered_set<const detail::VariableImpl*> seen;
  for (auto& [name, p] : named_parameters()) {
    if (p.requires_grad() && seen.insert(detail::VariableAccess::impl(p).get()).second) {
      parameters.push_back({name, p});
    }
  }

  // The root's instance number names this DDP's ops (with the root's rank), so members agree
  // even if their counts of DDPs made so far differ; it travels with the model's signature
  // (Note [One model on every rank]). Blocking, so the fixed "init" names are free again
  // afterwards.
  static std::atomic<std::int64_t> next_instance{0};
  std::vector<std::pair<std::string, Tensor>> initial;
  for (const auto& p : parameters) {
    initial.emplace_back("DistributedDataParallel.init.parameter." + p.name, p.variable.value());
  }
  for (auto& [name, b] : named_buffers()) {
    initial.emplace_back("DistributedDataParallel.init.buffer." + name, b.value());
  }
  const auto count = static_cast<std::int64_t>(initial.size());
  const auto signature = static_cast<std::int64_t>(model_signature(initial));
  Tensor head = Tensor::from<std::int64_t>(
      std::vector<std::int64_t>{next_instance.fetch_add(1), count, signature}, {3});
  broadcast_all({{"DistributedDataParallel.init.id", head}}, options_.root_rank,
                options_.process_set);
  check_same_model(count, signature, head.span<std::int64_t>(), options_.root_rank,
                   options_.process_set);
  broadcast_all(initial, options_.root_rank, options_.process_set);
  id_ = head.span<std::int64_t>()[0];

  detail::Reducer::Config config{.op_prefix = op_prefix(options_.root_rank, id_),
                                 .find_unused = options_.find_unused_parameters,
                                 .as_view = options_.gradient_as_bucket_view,
                                 .compression = options_.compression,
                                 .root_rank = options_.root_rank,
                                 .process_set = options_.process_set,
                                 .first_cap_bytes = cap_bytes(options_.first_bucket_mb),
                                 .cap_bytes = cap_bytes(options_.bucket_cap_mb)};
  reducer_ = std::make_shared<detail::Reducer>(std::move(parameters), std::move(config));
  reducer_->register_hooks();
}

DistributedDataParallel::~DistributedDataParallel() = default;

Variable DistributedDataParallel::forward(const Variable& input) {
  reducer_->before_forward();
  if (is_training() && options_.broadcast_buffers) broadcast_buffers();
  Variable output = module_->forward(input);
  if (no_sync_depth_ > 0 || !output.requires_grad()) return output;
  if (options_.find_unused_parameters) reducer_->note_reached(output);
  return reducer_->attach(output);
}

// Note [Buffers while a member has joined]
// The root's buffers go into every member's, except while a member has joined (tutti::join()):
// then every member keeps its own (API.md). Whether one has joined is the set's fact, not a
// rank's: each rank's own view differs after a join() (the last rank to train saw the others
// joined, the first did not), and ranks that decided on their views waited in different ops
// forever. So every forward broadcasts, and beside the broadcasts a one-element allreduce counts
// the members that take part (a joined one contributes zero); all receive the same count, and
// where it falls short each member restores the values it had. A root that has joined cannot
// send: every member then gets InvalidArgument from its broadcasts' wait() alike, and none has
// changed. The count is negotiated in the same cycles as the broadcasts; what it adds to a
// forward is one 4-byte allreduce, and on the members other than the root a copy of the
// buffers.
void DistributedDataParallel::broadcast_buffers() {
  const ProcessSet& set = options_.process_set;
  if (set.size() == 1) return;
  std::vector<std::pair<std::string, Tensor>> buffers;
  const std::string prefix = op_prefix(options_.root_rank, id_) + ".buffer.";
  for (auto& [name, b] : named_buffers()) buffers.emplace_back(prefix + name, b.value());
  if (buffers.empty()) return;
  std::vector<Tensor> own;
  if (tutti::rank() != options_.root_rank) {
    for (const auto& [name, b] : buffers) own.push_back(b.clone());
  }
  std::int32_t live = 1;
  Handle count = allreduce_async(TensorView(&live, {}),
                                 op_prefix(options_.root_rank, id_) + ".buffers.members",
                                 {.op = ReduceOp::Sum, .process_set = set});
  try {
    static_cast<void>(broadcast_all(buffers, options_.root_rank, set, /*joined_root_ok=*/true));
  } catch (...) {
    try {
      count.wait();  // `live` must outlive the op.
    } catch (...) {  // The broadcasts' error is the one to report.
    }
    throw;
  }
  count.wait();
  if (live == set.size()) return;
  for (std::size_t i = 0; i < own.size(); ++i) {
    std::memcpy(buffers[i].second.data(), own[i].data(), own[i].byte_size());
  }
}

void DistributedDataParallel::register_comm_hook(CommHook hook) {
  reducer_->set_comm_hook(std::move(hook));
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_names_for_testing() const {
  return reducer_->bucket_names();
}

int DistributedDataParallel::buckets_started_for_testing() const {
  return reducer_->buckets_started();
}

}  // namespace tutti::nn

// SPDX-License-Identifier: Apache-2.0
// ZeroRedundancyOptimizer at 1-4 ranks: 50 Adam steps against the unsharded
// DistributedOptimizer (after DDP, inside a DistributedOptimizer, stage 2), the optimizer-state
// bytes per rank against 1/N of the unsharded (printed), the shards, consolidation at N ranks
// against a single-process Adam, loading at 1 and 2 ranks and continuing as an uninterrupted
// run, a member that owns no parameter, and the errors. See Note [Collective assertions].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/training/ddp_test_util.h"
#include "test/mpi/training/training_test_util.h"
#include "test/support/mpi_test_util.h"
#include "tutti/nn.h"
#include "tutti/optim.h"
#include "tutti/serialize.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

using optim::ZeroOptions;
using optim::ZeroRedundancyOptimizer;

// Linear(6, 16) -> ReLU -> Linear(16, 16) -> ReLU -> Linear(16, 16) -> ReLU -> Linear(16, 2):
// eight parameters of 2 to 256 elements, so that four ranks all own some.
std::shared_ptr<nn::Sequential> make_deep_model(std::uint64_t seed) {
  nn::manual_seed(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(6, 16))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(16, 16))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(16, 16))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(16, 2));
  return model;
}

// Step `step`'s batch of kBatch rows (inputs [rows, 6], targets [rows, 2]), or rank's share.
Batch deep_batch(std::int64_t step, int rank, int size) {
  const std::int64_t rows = kBatch / size;
  std::vector<float> xs, ys;
  for (std::int64_t i = step * kBatch + rank * rows; i < step * kBatch + (rank + 1) * rows; ++i) {
    for (int j = 0; j < 6; ++j) xs.push_back(static_cast<float>(std::sin(0.41 * i + 1.1 * j)));
    ys.push_back(static_cast<float>(std::cos(0.3 * i)));
    ys.push_back(static_cast<float>(0.1 * (i % 7) - 0.3));
  }
  return {Tensor::from<float>(xs, {rows, 6}), Tensor::from<float>(ys, {rows, 2})};
}

ZeroRedundancyOptimizer::Factory adam_factory() {
  return [](std::vector<nn::Variable> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions{.lr = 0.01});
  };
}

std::size_t state_bytes(const optim::StateDict& state) {
  std::size_t bytes = 0;
  for (const auto& [key, tensor] : state.tensors) bytes += tensor.byte_size();
  return bytes;
}

enum class Mode { AfterDdp, InsideDistributedOptimizer, Stage2 };

TEST_CASE("ZeRO: 50 Adam steps equal the unsharded DistributedOptimizer's", "[zero]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const Mode mode = GENERATE(Mode::AfterDdp, Mode::InsideDistributedOptimizer, Mode::Stage2);
  const double cap = GENERATE(25.0, 1e-4);  // One bucket; buckets of 26 elements.
  INFO("mode " << static_cast<int>(mode) << ", bucket_cap_mb " << cap);

  // The reference: Adam over every parameter inside a DistributedOptimizer.
  auto reference = make_deep_model(4);
  const nn::NamedParameters ref_named = reference->named_parameters();
  optim::Adam ref_adam(variables(ref_named), {.lr = 0.01});
  optim::DistributedOptimizer ref(ref_adam, ref_named);

  std::shared_ptr<nn::Module> model = make_deep_model(4);
  std::unique_ptr<nn::DistributedDataParallel> ddp;
  if (mode == Mode::AfterDdp) {
    ddp = std::make_unique<nn::DistributedDataParallel>(model);
    model = nullptr;
  }
  nn::Module& net = ddp ? static_cast<nn::Module&>(*ddp) : *model;
  const nn::NamedParameters named = net.named_parameters();
  ZeroRedundancyOptimizer zero(named, adam_factory(),
                               {.shard_gradients = mode == Mode::Stage2, .bucket_cap_mb = cap});
  std::unique_ptr<optim::DistributedOptimizer> outer;
  if (mode == Mode::InsideDistributedOptimizer) {
    outer = std::make_unique<optim::DistributedOptimizer>(zero, named);
  }
  optim::Optimizer& optimizer = outer ? static_cast<optim::Optimizer&>(*outer) : zero;
  for (std::int64_t step = 0; step < 50; ++step) {
    optimizer.zero_grad();
    forward_backward(net, deep_batch(step, rank, size));
    optimizer.step();
    ref.zero_grad();
    forward_backward(*reference, deep_batch(step, rank, size));
    ref.step();
  }
  const double diff = max_diff(named, ref_named);
  INFO("max |parameter difference| after 50 steps " << diff);
  CHECK(all_ranks(diff < 1e-5));
  CHECK(all_ranks(max_diff(named, make_deep_model(4)->named_parameters()) > 1e-2));  // Trained.

  // Every parameter's state lives on exactly one rank: the bytes add up to the unsharded ones,
  // about 1/N each.
  const std::size_t mine = state_bytes(zero.local_optimizer().state_dict());
  const std::size_t unsharded = state_bytes(ref_adam.state_dict());
  std::size_t total = 0, largest = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &largest, 1, MPI_UNSIGNED_LONG, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && mode == Mode::Stage2 && cap == 25.0) {
    std::printf(
        "ZeRO at %d ranks: Adam state %zu bytes on the largest rank, %zu unsharded "
        "(1/N = %zu)\n",
        size, largest, unsharded, unsharded / static_cast<std::size_t>(size));
  }
  CHECK(all_ranks(total == unsharded));
  const std::size_t largest_parameter_state = 2 * 256 * sizeof(float);  // exp_avg, exp_avg_sq
  CHECK(all_ranks(largest <= unsharded / static_cast<std::size_t>(size) + largest_parameter_state));
}

// Parameters p0..p3 of 8, 6, 4, 2 elements, every element 1.
nn::NamedParameters four_parameters() {
  nn::NamedParameters named;
  for (const std::int64_t n : {8, 6, 4, 2}) {
    Tensor value(DataType::Float32, {n});
    for (float& v : value.span<float>()) v = 1.0f;
    named.emplace_back("p" + std::to_string(named.size()), nn::Variable(value, true));
  }
  return named;
}

ZeroRedundancyOptimizer::Factory sgd_factory() {
  return [](std::vector<nn::Variable> shard) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(std::move(shard), optim::SGDOptions{.lr = 0.5});
  };
}

TEST_CASE("ZeRO with a huge bucket_cap_mb moves each parameter in one piece", "[zero]") {
  // 1e30 MiB is far beyond int64 elements: the bucket is clamped (2^62 elements), where the
  // conversion overflowed before (a bucket of one element: a broadcast per element).
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const bool stage2 = GENERATE(false, true);
  INFO("stage " << (stage2 ? 2 : 1));
  const nn::NamedParameters named = four_parameters();
  ZeroRedundancyOptimizer zero(named, sgd_factory(),
                               {.shard_gradients = stage2, .bucket_cap_mb = 1e30});
  // Parameter i's gradient: i + 1 (stage 1, averaged already), or rank r's (i + 1) (r + 1),
  // whose average is (i + 1) (size + 1) / 2 (stage 2). SGD with lr 0.5 subtracts half of it.
  for (std::size_t i = 0; i < named.size(); ++i) {
    const double g = static_cast<double>(i + 1) * (stage2 ? rank + 1 : 1);
    for (float& v : named[i].second.grad().span<float>()) v = static_cast<float>(g);
  }
  zero.step();
  bool ok = true;
  for (std::size_t i = 0; i < named.size(); ++i) {
    const double mean = static_cast<double>(i + 1) * (stage2 ? (size + 1) / 2.0 : 1.0);
    for (const float v : named[i].second.value().span<float>()) {
      ok = ok && std::abs(v - (1 - 0.5 * mean)) < 1e-6;
    }
  }
  CHECK(all_ranks(ok));
  // One broadcast (and in stage 2 one reduce) per parameter, each of the whole parameter.
  int broadcasts = 0, reduces = 0, pieces = 0;
  for (const debug::OpRecord& op : debug::flight_recorder()) {
    if (op.name.ends_with(".members")) continue;
    const bool broadcast = op.name.starts_with("ZeroRedundancyOptimizer.broadcast.");
    const bool reduce = op.name.starts_with("ZeroRedundancyOptimizer.reduce.");
    broadcasts += broadcast ? 1 : 0;
    reduces += reduce ? 1 : 0;
    if ((broadcast || reduce) && !op.name.ends_with(".0")) ++pieces;
  }
  INFO(broadcasts << " broadcasts, " << reduces << " reduces, " << pieces << " past a first piece");
  const int expected = size == 1 ? 0 : static_cast<int>(named.size());
  CHECK(all_ranks(broadcasts == expected && reduces == (stage2 ? expected : 0) && pieces == 0));
}

TEST_CASE("ZeRO: members that list different parameters fail the first step alike",
          "[zero][errors]") {
  // Note [ZeRO layouts compared] in optimizers/zero.cc. The last rank lists one parameter more,
  // a float too small to change who owns the others: before, stage 1's other members stepped
  // and went on while it waited, and stage 2 stopped at the stall limit. Now every member throws
  // InvalidArgument from the step, and again from the next (nothing was sent under the layout).
  ShortStallSession session;
  if (tutti::size() < 2) return;
  const bool stage2 = GENERATE(false, true);
  INFO((stage2 ? "stage 2" : "stage 1"));
  nn::NamedParameters named;
  for (int i = 0; i < 4; ++i) {
    named.emplace_back("p" + std::to_string(i),
                       nn::Variable(Tensor(DataType::Float32, {1000}), /*requires_grad=*/true));
  }
  if (tutti::rank() == tutti::size() - 1) {
    named.emplace_back("extra", nn::Variable(Tensor(DataType::Float32, {1}), true));
  }
  ZeroRedundancyOptimizer zero(named, sgd_factory(), {.shard_gradients = stage2});
  const auto [code, message] = error_from([&] { zero.step(); });
  INFO(message);
  const std::string counts = "rank " + std::to_string(tutti::size() - 1) + ": 5";
  CHECK(all_ranks(code == ErrorCode::InvalidArgument &&
                  message.find("the members list different parameters") != std::string::npos &&
                  message.find(counts) != std::string::npos));
  CHECK(all_ranks(error_from([&] { zero.consolidate_state_dict(0); }).first ==
                  ErrorCode::InvalidArgument));
}

TEST_CASE("ZeRO: every parameter is owned by exactly one rank", "[zero]") {
  Session session;
  auto model = make_deep_model(1);
  const nn::NamedParameters named = model->named_parameters();
  ZeroRedundancyOptimizer zero(named, adam_factory());
  std::vector<int> owned(named.size(), 0);
  for (const std::string& name : zero.owned_parameters()) {
    for (std::size_t i = 0; i < named.size(); ++i) owned[i] += named[i].first == name ? 1 : 0;
  }
  MPI_Allreduce(MPI_IN_PLACE, owned.data(), static_cast<int>(owned.size()), MPI_INT, MPI_SUM,
                MPI_COMM_WORLD);
  CHECK(all_ranks(std::all_of(owned.begin(), owned.end(), [](int n) { return n == 1; })));
}

// `state` from `root` to every rank (plain MPI carries the serialized bytes: the test's own
// transport, as a checkpoint file would be).
optim::StateDict share_state(const optim::StateDict& state, int root) {
  ByteWriter w;
  w.put<std::uint64_t>(state.tensors.size());
  for (const auto& [key, t] : state.tensors) {
    w.put_string(key);
    w.put_vector(t.shape());
    w.put_string(std::string_view(static_cast<const char*>(t.data()), t.byte_size()));
  }
  w.put<std::uint64_t>(state.scalars.size());
  for (const auto& [name, value] : state.scalars) {
    w.put_string(name);
    w.put(value);
  }
  std::string bytes = w.take();
  std::uint64_t length = bytes.size();
  MPI_Bcast(&length, 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
  bytes.resize(length);
  MPI_Bcast(bytes.data(), static_cast<int>(length), MPI_CHAR, root, MPI_COMM_WORLD);
  ByteReader r(bytes);
  optim::StateDict result;
  std::size_t tensors = 0, scalars = 0;
  r.get_count(&tensors, 1);
  for (std::size_t t = 0; t < tensors; ++t) {
    std::string key, data;
    Shape shape;
    r.get_string(&key);
    r.get_vector(&shape);
    r.get_string(&data);
    Tensor tensor(DataType::Float32, shape);
    std::memcpy(tensor.data(), data.data(), std::min(data.size(), tensor.byte_size()));
    result.tensors.emplace_back(key, tensor);
  }
  r.get_count(&scalars, 1);
  for (std::size_t s = 0; s < scalars; ++s) {
    std::string name;
    double value = 0;
    r.get_string(&name);
    r.get(&value);
    result.scalars[name] = value;
  }
  return result;
}

// Largest |a - b| between two state dicts with the same keys; 1e30 if the keys differ.
double state_diff(const optim::StateDict& a, const optim::StateDict& b) {
  if (a.tensors.size() != b.tensors.size() || a.scalars != b.scalars) return 1e30;
  double worst = 0;
  for (std::size_t t = 0; t < a.tensors.size(); ++t) {
    if (a.tensors[t].first != b.tensors[t].first) return 1e30;
    const auto va = a.tensors[t].second.span<float>(), vb = b.tensors[t].second.span<float>();
    if (va.size() != vb.size()) return 1e30;
    for (std::size_t i = 0; i < va.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(va[i]) - vb[i]));
    }
  }
  return worst;
}

TEST_CASE("ZeRO: consolidate at N ranks, load at 1 and 2, continue as an uninterrupted run",
          "[zero][state]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  // The uninterrupted run: Adam over the whole batch in one process (every rank alike).
  auto oracle = make_deep_model(6);
  optim::Adam oracle_adam(variables(oracle->named_parameters()), {.lr = 0.01});
  for (std::int64_t step = 0; step < 6; ++step) {
    oracle_adam.zero_grad();
    forward_backward(*oracle, deep_batch(step, 0, 1));
    oracle_adam.step();
  }
  auto halfway = make_deep_model(6);  // The oracle's state after 3 steps.
  optim::Adam halfway_adam(variables(halfway->named_parameters()), {.lr = 0.01});
  for (std::int64_t step = 0; step < 3; ++step) {
    halfway_adam.zero_grad();
    forward_backward(*halfway, deep_batch(step, 0, 1));
    halfway_adam.step();
  }

  // Three steps of stage 2 at N ranks, consolidated on the last rank.
  auto model = make_deep_model(6);
  const nn::NamedParameters named = model->named_parameters();
  optim::StateDict saved;
  {
    ZeroRedundancyOptimizer zero(named, adam_factory(), {.shard_gradients = true});
    for (std::int64_t step = 0; step < 3; ++step) {
      zero.zero_grad();
      forward_backward(*model, deep_batch(step, rank, size));
      zero.step();
    }
    const int to = size - 1;
    // An error on one rank must not keep it from the broadcast below (the others would hang).
    const bool consolidated = error_from([&] {
                                zero.consolidate_state_dict(to);
                                if (rank == to) saved = zero.state_dict();
                              }).first == ErrorCode::Internal;
    saved = share_state(saved, to);
    CHECK(all_ranks(consolidated));
    CHECK(all_ranks(state_diff(saved, halfway_adam.state_dict()) < 1e-6));
    CHECK(all_ranks(max_diff(named, halfway->named_parameters()) < 1e-6));
  }
  // Load at 1 and at 2 ranks (the first ones), three more steps, against the oracle.
  for (const int members : {1, 2}) {
    if (members > size) continue;  // The same on every rank.
    std::vector<int> ranks(static_cast<std::size_t>(members));
    std::iota(ranks.begin(), ranks.end(), 0);
    const ProcessSet set = members == size ? ProcessSet::global() : add_process_set(ranks);
    // Members only; a load refused on some member must not leave the others stepping alone.
    const bool member = rank < members;
    auto resumed = make_deep_model(99);  // Other weights: the saved ones are copied in.
    const nn::NamedParameters resumed_named = resumed->named_parameters();
    std::unique_ptr<ZeroRedundancyOptimizer> zero;
    bool loaded = true;
    if (member) {
      for (std::size_t i = 0; i < named.size(); ++i) {
        nn::Variable p = resumed_named[i].second;
        p.value() = named[i].second.value().clone();
      }
      zero = std::make_unique<ZeroRedundancyOptimizer>(
          resumed_named, adam_factory(), ZeroOptions{.shard_gradients = true, .process_set = set});
      loaded = error_from([&] { zero->load_state_dict(saved); }).first == ErrorCode::Internal;
    }
    const bool all_loaded = all_ranks(loaded);
    CHECK(all_loaded);
    bool ok = true;
    if (member && all_loaded) {
      for (std::int64_t step = 3; step < 6; ++step) {
        zero->zero_grad();
        forward_backward(*resumed, deep_batch(step, set.rank(), members));
        zero->step();
      }
      const double diff = max_diff(resumed_named, oracle->named_parameters());
      INFO("resumed at " << members << " ranks: max |parameter difference| " << diff);
      ok = diff < 1e-5;
    }
    CHECK(all_ranks(ok));
    if (set.id() != 0) remove_process_set(set);
  }
}

TEST_CASE("ZeRO: broadcast_optimizer_state distributes a consolidated state, or fails everywhere",
          "[zero][state]") {
  // How a user restores a consolidated state on every rank: consolidate_state_dict(0), then
  // broadcast_optimizer_state(zero, 0). Only the root's state_dict() works; before, every rank
  // called it, the others threw InvalidArgument there and rank 0 waited for them in the
  // broadcast until the stall limit.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto code = [](auto&& f) { return error_from(f).first; };
  const ErrorCode bad = ErrorCode::InvalidArgument;
  // The oracle: Adam over the whole batch in one process (every rank alike), 3 steps and 4.
  auto oracle = make_deep_model(8);
  optim::Adam oracle_adam(variables(oracle->named_parameters()), {.lr = 0.01});
  optim::StateDict after3;
  for (std::int64_t step = 0; step < 4; ++step) {
    if (step == 3) after3 = oracle_adam.state_dict();
    oracle_adam.zero_grad();
    forward_backward(*oracle, deep_batch(step, 0, 1));
    oracle_adam.step();
  }

  auto model = make_deep_model(8);
  const nn::NamedParameters named = model->named_parameters();
  ZeroRedundancyOptimizer zero(named, adam_factory(), {.shard_gradients = true});
  // No consolidation yet: the root's state_dict() throws, and every rank throws its message.
  const auto [unconsolidated, why] = error_from([&] { optim::broadcast_optimizer_state(zero, 0); });
  INFO(why);
  CHECK(all_ranks(unconsolidated == bad &&
                  why.find("consolidate_state_dict() on every member") != std::string::npos));
  for (std::int64_t step = 0; step < 3; ++step) {
    zero.zero_grad();
    forward_backward(*model, deep_batch(step, rank, size));
    zero.step();
  }
  zero.consolidate_state_dict(0);
  const auto [broadcast_code, message] =
      error_from([&] { optim::broadcast_optimizer_state(zero, 0); });
  INFO(message);
  CHECK(all_ranks(broadcast_code == ErrorCode::Internal));  // No error.
  // Every member loaded the consolidated state: consolidated again, it is the oracle's.
  zero.consolidate_state_dict(0);
  const optim::StateDict again = share_state(rank == 0 ? zero.state_dict() : optim::StateDict{}, 0);
  CHECK(all_ranks(state_diff(again, after3) < 1e-6));
  if (size > 1) {  // Consolidated on another rank than the root: every rank throws.
    zero.consolidate_state_dict(size - 1);
    CHECK(all_ranks(code([&] { optim::broadcast_optimizer_state(zero, 0); }) == bad));
  }
  // And the run continues as the uninterrupted one.
  zero.zero_grad();
  forward_backward(*model, deep_batch(3, rank, size));
  zero.step();
  const double diff = max_diff(named, oracle->named_parameters());
  INFO("max |parameter difference| after 4 steps " << diff);
  CHECK(all_ranks(diff < 1e-5));
}

// The last rank joins (tutti::join()) while every other rank runs `op`, which must throw
// InvalidArgument naming the one joined member ("1 of <size> members have joined").
void check_fails_beside_a_join(const std::function<void()>& op) {
  const int rank = tutti::rank();
  const int size = tutti::size();
  ErrorCode code = ErrorCode::InvalidArgument;
  std::string message;
  if (rank != size - 1) std::tie(code, message) = error_from(op);
  tutti::join();
  INFO(message);
  CHECK(all_ranks(code == ErrorCode::InvalidArgument));
  CHECK(all_ranks(rank == size - 1 || message.find("1 of " + std::to_string(size) +
                                                   " members have joined") != std::string::npos));
}

TEST_CASE("ZeRO with a joined member fails its step on the others instead of misplacing shards",
          "[zero][join]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  if (size == 1) return;  // Nobody to fail. The same on every rank.
  const bool stage2 = GENERATE(false, true);
  INFO("stage " << (stage2 ? 2 : 1));
  auto model = make_deep_model(3);
  ZeroRedundancyOptimizer zero(model->named_parameters(), adam_factory(),
                               {.shard_gradients = stage2});
  // One step with every member, so that the local optimizers hold state (Adam's moments and
  // step count) that a failed step must leave as it is.
  forward_backward(*model, deep_batch(0, rank, size));
  zero.step();
  auto before = make_deep_model(3);  // The parameters after that step, copied.
  for (auto& [name, p] : before->named_parameters()) {
    for (const auto& [other, q] : model->named_parameters()) {
      if (other != name) continue;
      const auto from = q.value().span<float>();
      std::copy(from.begin(), from.end(), p.value().span<float>().begin());
    }
  }
  const optim::StateDict state_before = zero.local_optimizer().state_dict();

  zero.zero_grad();
  check_fails_beside_a_join([&] {
    forward_backward(*model, deep_batch(1, rank, size));
    zero.step();
  });
  // Nothing was stepped: not this member's shard (stage 1 stepped it before its broadcasts
  // failed) and not its optimizer state.
  CHECK(all_ranks(max_diff(model->named_parameters(), before->named_parameters()) == 0.0));
  const optim::StateDict state_after = zero.local_optimizer().state_dict();
  CHECK(all_ranks(state_after.scalars == state_before.scalars));
  double moved = state_after.tensors.size() == state_before.tensors.size() ? 0.0 : 1.0;
  for (std::size_t i = 0; moved == 0.0 && i < state_after.tensors.size(); ++i) {
    const auto a = state_after.tensors[i].second.span<float>();
    const auto b = state_before.tensors[i].second.span<float>();
    moved = std::equal(a.begin(), a.end(), b.begin(), b.end()) ? 0.0 : 1.0;
  }
  CHECK(all_ranks(moved == 0.0));
}

TEST_CASE("ZeRO: consolidate_state_dict with a joined member throws on every other member",
          "[zero][join][state]") {
  // The last rank joins; the others' consolidation counts the members and throws
  // InvalidArgument naming the join. Before, the joined rank's shard was missing from the
  // gather, and rank 0 failed to decode it (Internal, "malformed shard state") while the
  // others returned as if it had worked.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  if (size == 1) return;          // Nobody to join. The same on every rank.
  const int to = GENERATE(0, 1);  // A live member, or (at 2 ranks) the joined one.
  INFO("consolidated to rank " << to);
  auto model = make_deep_model(5);
  ZeroRedundancyOptimizer zero(model->named_parameters(), adam_factory(),
                               {.shard_gradients = true});
  forward_backward(*model, deep_batch(0, rank, size));
  zero.step();
  check_fails_beside_a_join([&] { zero.consolidate_state_dict(to); });
  // No consolidation stands: state_dict() refuses on every rank.
  CHECK(all_ranks(error_from([&] { static_cast<void>(zero.state_dict()); }).first ==
                  ErrorCode::InvalidArgument));
}

// One parameter: rank 0 owns it and every other rank owns nothing (Note [ZeRO's collectives]).
TEST_CASE("ZeRO with members that own no parameter: the step's closed form, and a join fails it",
          "[zero][join]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const bool stage2 = GENERATE(false, true);
  INFO("stage " << (stage2 ? 2 : 1));
  const std::vector<float> start{1, 2, 3};
  nn::Variable weight(Tensor::from<float>(start, {3}), true);
  ZeroRedundancyOptimizer zero({{"weight", weight}},
                               [](std::vector<nn::Variable> shard) {
                                 return std::make_unique<optim::SGD>(std::move(shard),
                                                                     optim::SGDOptions{.lr = 0.5});
                               },
                               {.shard_gradients = stage2});
  // Stage 1 gets the average already (as from DDP): 2 everywhere. Stage 2 averages rank r's
  // r + 1 itself: (size + 1) / 2.
  auto set_grad = [&] {
    for (float& g : weight.grad().span<float>()) g = stage2 ? static_cast<float>(rank + 1) : 2.0f;
  };
  set_grad();
  zero.step();
  const float mean = stage2 ? static_cast<float>(size + 1) / 2 : 2.0f;
  bool equal = true;
  for (int i = 0; i < 3; ++i)
    equal = equal && weight.value().span<float>()[i] == i + 1 - 0.5f * mean;
  CHECK(all_ranks(equal));

  if (size == 1) return;  // Nobody to join. The same on every rank.
  // The last rank owns nothing, so no op of the step is rooted at it: the step's count of
  // members is what fails it on the others.
  check_fails_beside_a_join([&] {
    set_grad();
    zero.step();
  });
}

// size - 1 parameters of 4 elements and one of 0 (the last): the greedy layout gives each of
// ranks 0 .. size - 2 one of 4 and the last rank the empty parameter alone, so no shard is
// empty but the last rank owns no element and roots no op of the step.
TEST_CASE("ZeRO with a member that owns only empty parameters: a join fails the step",
          "[zero][join]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const bool stage2 = GENERATE(false, true);
  INFO("stage " << (stage2 ? 2 : 1));
  nn::NamedParameters named;
  for (int i = 0; i < size; ++i) {
    Tensor value(DataType::Float32, {i == size - 1 ? 0 : 4});
    for (float& v : value.span<float>()) v = 1.0f;
    named.emplace_back("p" + std::to_string(i), nn::Variable(value, true));
  }
  ZeroRedundancyOptimizer zero(named, sgd_factory(), {.shard_gradients = stage2});
  const std::vector<std::string> owned = zero.owned_parameters();
  CHECK(all_ranks(owned == std::vector<std::string>{"p" + std::to_string(rank)}));
  // A step with every gradient 2 (the same on every rank, so also its average): 1 - 0.5 * 2.
  auto set_grads = [&] {
    for (auto& [name, p] : named) {
      for (float& g : p.grad().span<float>()) g = 2.0f;
    }
  };
  set_grads();
  zero.step();
  bool zeroed = true;
  for (const auto& [name, p] : named) {
    for (const float v : p.value().span<float>()) zeroed = zeroed && v == 0.0f;
  }
  CHECK(all_ranks(zeroed));

  if (size == 1) return;  // Nobody to join. The same on every rank.
  check_fails_beside_a_join([&] {
    set_grads();
    zero.step();
  });
}

TEST_CASE(
    "ZeRO: a rank whose backward() threw skips the step in zero_grad(), in step with the "
    "others",
    "[zero][errors]") {
  // Rank 0's backward() throws at step 1 and it goes on with zero_grad() (Note [A rank that
  // skips a ZeRO step]). Four parameters, SGD (lr 0.5, no momentum), every gradient element of
  // rank r at step s c = r + 1 + 10 s: closed forms per owner. Before, rank 0's next step()
  // paired with the others' step 1, and their last step waited for one it never made.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const bool stage2 = GENERATE(false, true);
  const std::vector<std::int64_t> sizes{8, 6, 4, 2};
  nn::NamedParameters named;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    Tensor value(DataType::Float32, {sizes[i]});
    for (float& v : value.span<float>()) v = 1.0f;
    named.emplace_back("p" + std::to_string(i), nn::Variable(value, true));
  }
  ZeroRedundancyOptimizer zero(named,
                               [](std::vector<nn::Variable> shard) {
                                 return std::make_unique<optim::SGD>(std::move(shard),
                                                                     optim::SGDOptions{.lr = 0.5});
                               },
                               {.shard_gradients = stage2});
  const auto c = [](int r, int s) { return static_cast<double>(r + 1 + 10 * s); };
  bool ok = true;
  std::string log;
  for (int step = 0; step < 3; ++step) {
    zero.zero_grad();
    const bool fails = step == 1 && rank == 0;
    nn::Variable u(Tensor(DataType::Float32, {1}), true);
    if (fails) u.grad() = Tensor();  // The engine refuses it: this backward() throws.
    nn::Variable loss = nn::sum(u);
    for (const auto& [name, p] : named) {
      Tensor x(DataType::Float32, p.value().shape());
      for (float& v : x.span<float>()) v = static_cast<float>(c(rank, step));
      loss = loss + nn::sum(p * nn::Variable(x));
    }
    const auto [code, message] = error_from([&] { loss.backward(); });
    if (fails) {
      ok = ok && code == ErrorCode::InvalidArgument;
      continue;  // zero_grad() at the top of the loop makes this rank's part of step 1.
    }
    const auto [step_code, step_message] = error_from([&] { zero.step(); });
    ok = ok && code == ErrorCode::Internal && step_code == ErrorCode::Internal;
    log += message + step_message;
  }
  zero.zero_grad();
  // Each parameter's owner (plain MPI: the owners' ranks summed).
  std::vector<int> owner(sizes.size(), 0);
  const std::vector<std::string> mine = zero.owned_parameters();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (std::find(mine.begin(), mine.end(), "p" + std::to_string(i)) != mine.end()) owner[i] = rank;
  }
  MPI_Allreduce(MPI_IN_PLACE, owner.data(), static_cast<int>(owner.size()), MPI_INT, MPI_SUM,
                MPI_COMM_WORLD);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    double expected = 1.0;
    for (int step = 0; step < 3; ++step) {
      if (step == 1 && owner[i] == 0) continue;  // Rank 0 skipped step 1: its shard stays.
      double g = 0;
      if (stage2) {  // The average over the ranks, rank 0's zero at step 1.
        for (int r = 0; r < size; ++r) g += (step == 1 && r == 0) ? 0.0 : c(r, step);
        g /= size;
      } else {  // Stage 1 steps with the owner's own gradient (no DDP here).
        g = c(owner[i], step);
      }
      expected -= 0.5 * g;
    }
    for (float v : named[i].second.value().span<float>()) {
      if (std::abs(v - expected) > 1e-4) {
        ok = false;
        log += " p" + std::to_string(i) + ": " + std::to_string(v) + " for " +
               std::to_string(expected);
        break;
      }
    }
  }
  INFO("stage " << (stage2 ? 2 : 1) << log);
  CHECK(all_ranks(ok));
}

// SGD (lr 0.5) whose step() throws, having changed nothing, while `*fail` is set.
class FailingSgd : public optim::Optimizer {
 public:
  FailingSgd(std::vector<nn::Variable> shard, std::shared_ptr<bool> fail)
      : Optimizer(shard), sgd_(std::move(shard), {.lr = 0.5}), fail_(std::move(fail)) {}
  void step() override {
    if (*fail_) throw std::runtime_error("the local step failed");
    sgd_.step();
  }

 private:
  optim::SGD sgd_;
  std::shared_ptr<bool> fail_;
};

TEST_CASE("ZeRO: a local step that throws on one rank throws there; the others' step completes",
          "[zero][errors]") {
  // The last rank's local optimizer throws at step 0. It still broadcasts its shard (not
  // updated) and then throws the local error; the others' step() returns. Step 1 then goes
  // normally everywhere. Before, that rank left without its broadcasts, and the others waited
  // for them until the stall limit.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const bool stage2 = GENERATE(false, true);
  INFO("stage " << (stage2 ? 2 : 1));
  const nn::NamedParameters named = four_parameters();
  const auto fail = std::make_shared<bool>(false);
  ZeroRedundancyOptimizer zero(
      named,
      [&](std::vector<nn::Variable> shard) { return std::make_unique<FailingSgd>(shard, fail); },
      {.shard_gradients = stage2});
  // Parameter i's gradient: i + 1 (stage 1, averaged already), or rank r's (i + 1) (r + 1),
  // whose average is (i + 1) (size + 1) / 2 (stage 2). SGD with lr 0.5 subtracts half of it.
  auto set_grads = [&] {
    for (std::size_t i = 0; i < named.size(); ++i) {
      const double g = static_cast<double>(i + 1) * (stage2 ? rank + 1 : 1);
      for (float& v : named[i].second.grad().span<float>()) v = static_cast<float>(g);
    }
  };
  bool ok = true;
  std::string log;
  for (int step = 0; step < 2; ++step) {
    set_grads();
    *fail = step == 0 && rank == size - 1;
    try {
      zero.step();
      ok = ok && !*fail;
    } catch (const std::runtime_error& e) {
      ok = ok && *fail && std::string(e.what()) == "the local step failed";
      log += std::string(" step ") + std::to_string(step) + ": " + e.what();
    } catch (const std::exception& e) {
      ok = false;
      log += std::string(" step ") + std::to_string(step) + ": " + e.what();
    }
  }
  // Each parameter's owner (plain MPI: the owners' ranks summed).
  std::vector<int> owner(named.size(), 0);
  const std::vector<std::string> mine = zero.owned_parameters();
  for (std::size_t i = 0; i < named.size(); ++i) {
    if (std::find(mine.begin(), mine.end(), named[i].first) != mine.end()) owner[i] = rank;
  }
  MPI_Allreduce(MPI_IN_PLACE, owner.data(), static_cast<int>(owner.size()), MPI_INT, MPI_SUM,
                MPI_COMM_WORLD);
  for (std::size_t i = 0; i < named.size(); ++i) {
    const double mean = static_cast<double>(i + 1) * (stage2 ? (size + 1) / 2.0 : 1.0);
    const int updates = owner[i] == size - 1 ? 1 : 2;  // The last rank's shard missed step 0.
    const double expected = 1 - updates * 0.5 * mean;
    for (const float v : named[i].second.value().span<float>()) {
      if (std::abs(v - expected) > 1e-6) {
        ok = false;
        log += " " + named[i].first + ": " + std::to_string(v) + " for " + std::to_string(expected);
        break;
      }
    }
  }
  INFO(log);
  CHECK(all_ranks(ok));
}

TEST_CASE("ZeRO: an unusable gradient on one rank fails the step on every rank; nothing changes",
          "[zero][errors]") {
  // The last rank's grad() of its first owned parameter is replaced (empty, of 3 elements,
  // float64). Every member's step() throws InvalidArgument naming that parameter and rank, with
  // every parameter unchanged; the next step with good gradients gives the closed form. Before,
  // stage 2's reduces stopped at the bad gradient on that rank and the others stalled (a short
  // stall timeout, read by init(), makes that an error here, not a wait); stage 1 stepped the
  // others' shards while that rank threw. Gradients and SGD (lr 0.5) as in the test above.
  ShortStallSession session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const bool stage2 = GENERATE(false, true);
  const int bad = GENERATE(0, 1, 2);  // Empty, 3 elements (no parameter has 3), float64.
  INFO("stage " << (stage2 ? 2 : 1) << ", bad gradient " << bad);
  const nn::NamedParameters named = four_parameters();
  ZeroRedundancyOptimizer zero(named, sgd_factory(), {.shard_gradients = stage2});
  // The last rank's first owned parameter (four parameters: every rank of 1-4 owns one).
  int victim = 0;
  if (rank == size - 1) {
    while (named[static_cast<std::size_t>(victim)].first != zero.owned_parameters().front())
      ++victim;
  }
  MPI_Bcast(&victim, 1, MPI_INT, size - 1, MPI_COMM_WORLD);
  const std::string name = named[static_cast<std::size_t>(victim)].first;
  auto set_grads = [&] {
    for (std::size_t i = 0; i < named.size(); ++i) {
      const double g = static_cast<double>(i + 1) * (stage2 ? rank + 1 : 1);
      for (float& v : named[i].second.grad().span<float>()) v = static_cast<float>(g);
    }
  };
  set_grads();
  if (rank == size - 1) {
    nn::Variable p = named[static_cast<std::size_t>(victim)].second;  // A shared handle.
    Tensor& grad = p.grad();
    grad = bad == 0   ? Tensor()
           : bad == 1 ? Tensor(DataType::Float32, {3})
                      : Tensor(DataType::Float64, grad.shape());
  }
  const auto [code, message] = error_from([&] { zero.step(); });
  INFO(message);
  CHECK(all_ranks(code == ErrorCode::InvalidArgument &&
                  message.find("'" + name + "'") != std::string::npos &&
                  message.find("rank " + std::to_string(size - 1)) != std::string::npos));
  bool unchanged = true;
  for (const auto& [n, p] : named) {
    for (const float v : p.value().span<float>()) unchanged = unchanged && v == 1.0f;
  }
  CHECK(all_ranks(unchanged));
  zero.zero_grad();
  set_grads();
  const auto [next_code, next_message] = error_from([&] { zero.step(); });
  INFO(next_message);
  bool closed_form = next_code == ErrorCode::Internal;  // error_from's "nothing thrown".
  for (std::size_t i = 0; i < named.size(); ++i) {
    const double mean = static_cast<double>(i + 1) * (stage2 ? (size + 1) / 2.0 : 1.0);
    for (const float v : named[i].second.value().span<float>())
      closed_form = closed_form && std::abs(v - (1 - 0.5 * mean)) <= 1e-6;
  }
  CHECK(all_ranks(closed_form));
}

TEST_CASE("ZeRO: state_dict needs a consolidation; bad arguments and states are refused",
          "[zero][errors]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto code = [](auto&& f) { return error_from(f).first; };
  const ErrorCode bad = ErrorCode::InvalidArgument;
  auto model = make_deep_model(2);
  const nn::NamedParameters named = model->named_parameters();
  CHECK(all_ranks(code([&] { ZeroRedundancyOptimizer(named, nullptr); }) == bad));
  CHECK(all_ranks(
      code([&] { ZeroRedundancyOptimizer(named, adam_factory(), {.bucket_cap_mb = 0}); }) == bad));
  nn::NamedParameters twice = named;
  twice.push_back(named.front());
  CHECK(all_ranks(code([&] { ZeroRedundancyOptimizer(twice, adam_factory()); }) == bad));
  CHECK(all_ranks(code([&] {
                    ZeroRedundancyOptimizer(named, [&](std::vector<nn::Variable>) {
                      return std::make_unique<optim::SGD>(variables(named));  // Not the shard.
                    });
                  }) == (size == 1 ? ErrorCode::Internal : bad)));

  ZeroRedundancyOptimizer zero(named, adam_factory(), {.shard_gradients = true});
  CHECK(all_ranks(code([&] { static_cast<void>(zero.state_dict()); }) == bad));
  CHECK(all_ranks(code([&] { zero.consolidate_state_dict(size); }) == bad));
  forward_backward(*model, deep_batch(0, rank, size));
  zero.step();
  zero.consolidate_state_dict(0);
  CHECK(all_ranks(code([&] { static_cast<void>(zero.state_dict()); }) ==
                  (rank == 0 ? ErrorCode::Internal : bad)));
  optim::StateDict good = share_state(rank == 0 ? zero.state_dict() : optim::StateDict{}, 0);
  CHECK(all_ranks(good.scalars.at("step") == 1 && good.tensors.size() == 2 * named.size()));
  optim::StateDict out_of_range = good;
  out_of_range.tensors.emplace_back("99.exp_avg", Tensor(DataType::Float32, {2}));
  CHECK(all_ranks(code([&] { zero.load_state_dict(out_of_range); }) == bad));
  zero.load_state_dict(good);  // Unchanged by the refused load; loads fine.
  CHECK(all_ranks(code([&] { static_cast<void>(zero.state_dict()); }) == bad));  // Stale now.
  zero.consolidate_state_dict(0);
  const optim::StateDict again = share_state(rank == 0 ? zero.state_dict() : optim::StateDict{}, 0);
  CHECK(all_ranks(state_diff(again, good) == 0));
}

}  // namespace
}  // namespace tutti::test

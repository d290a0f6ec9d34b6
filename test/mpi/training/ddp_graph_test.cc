// SPDX-License-Identifier: Apache-2.0
// DistributedDataParallel where the graph matters: unused parameters (both settings of
// find_unused_parameters), the bucket rebuild for a forward order unlike the registration
// order (the root's order wins), join() with uneven batches, buckets starting mid-backward,
// process sets. Oracles are identical models run with plain nn in one process.
// See Note [Collective assertions] in test/support/mpi_test_util.h.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "src/nn/autograd.h"  // Probe: an identity operation that runs code in backward.
#include "test/mpi/training/ddp_test_util.h"
#include "test/mpi/training/training_test_util.h"
#include "test/support/mpi_test_util.h"
#include "tutti/nn.h"
#include "tutti/optim.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

using nn::DistributedDataParallel;
using nn::DistributedDataParallelOptions;

// A bucket per parameter, so that bucket listings show the order.
DistributedDataParallelOptions tiny_buckets() {
  return {.bucket_cap_mb = 1e-9, .first_bucket_mb = 1e-9};
}

// "a" always used; "b" (if any) never; "u" (one element, scaling a's output) only on ranks
// != 0.
class Branches : public nn::Module {
 public:
  explicit Branches(int rank, bool with_b = true) : rank_(rank) {
    nn::manual_seed(41);
    a = register_module("a", std::make_shared<nn::Linear>(4, 2));
    if (with_b) b = register_module("b", std::make_shared<nn::Linear>(4, 2));
    u = register_parameter("u", nn::Variable(Tensor::from<float>(std::vector<float>{0.5f}, {1})));
  }
  nn::Variable forward(const nn::Variable& x) override {
    nn::Variable y = a->forward(x);
    return rank_ == 0 ? y : y * u;
  }
  std::shared_ptr<nn::Linear> a, b;
  nn::Variable u;

 private:
  int rank_;
};

// Zeroes every parameter's gradient in place (as Optimizer::zero_grad() would).
void zero_grads(const nn::Module& model) {
  for (const auto& [name, p] : model.named_parameters()) {
    for (float& g : p.grad().span<float>()) g = 0;
  }
}

// The oracle for Branches: the ranks' local gradients, each computed here, averaged.
nn::NamedParameters expected_branch_grads(int size, std::int64_t step, bool with_b = true) {
  auto total = std::make_shared<Branches>(0, with_b);
  zero_grads(*total);
  for (int r = 0; r < size; ++r) {
    Branches local(r, with_b);
    forward_backward(local, shard(r, size, step));
    const nn::NamedParameters l = local.named_parameters(), t = total->named_parameters();
    for (std::size_t i = 0; i < l.size(); ++i) {
      const auto from = l[i].second.grad().span<float>();
      const auto to = t[i].second.grad().span<float>();
      for (std::size_t k = 0; k < to.size(); ++k) to[k] += from[k] / static_cast<float>(size);
    }
  }
  return total->named_parameters();
}

TEST_CASE("find_unused_parameters: unused parameters count as ready and average as zeros",
          "[ddp][unused]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = std::make_shared<Branches>(rank);
  DistributedDataParallel ddp(model, {.find_unused_parameters = true});
  optim::SGD sgd(variables(ddp.named_parameters()), {.lr = 0.1});
  for (std::int64_t step = 0; step < 2; ++step) {
    sgd.zero_grad();
    forward_backward(ddp, shard(rank, size, step));
    const nn::NamedParameters expected = expected_branch_grads(size, step);
    CHECK(all_ranks(max_diff(ddp.named_parameters(), expected, /*grads=*/true) < 1e-5));
    bool b_zero = true;
    for (float g : model->b->weight().grad().span<float>()) b_zero = b_zero && g == 0;
    CHECK(all_ranks(b_zero));
    // Keep the parameters equal to the oracle's next starting point: no step (the oracle
    // models start from the seed), only the gradients are compared.
  }
}

TEST_CASE("Without find_unused_parameters an unused parameter is InvalidArgument, not a hang",
          "[ddp][unused]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = std::make_shared<Branches>(rank);
  DistributedDataParallel ddp(model);
  for (std::int64_t step = 0; step < 2; ++step) {  // The DDP stays usable after the error.
    const auto [code, message] =
        error_from([&] { forward_backward(ddp, shard(rank, size, step)); });
    INFO(message);
    // "b" is unused everywhere; "u" on rank 0 only, so rank 0 names it too.
    const bool names_u = message.find("module.u") != std::string::npos;
    CHECK(all_ranks(code == ErrorCode::InvalidArgument &&
                    message.find("module.b.weight") != std::string::npos &&
                    message.find("module.b.bias") != std::string::npos &&
                    message.find("find_unused_parameters") != std::string::npos &&
                    names_u == (rank == 0)));
    // The used parameters were still averaged (the buckets were all reduced).
    const nn::NamedParameters expected = expected_branch_grads(size, step);
    CHECK(all_ranks(max_diff({ddp.named_parameters()[0]}, {expected[0]}, true) < 1e-5));
    zero_grads(ddp);
  }
}

// Only some ranks leave a parameter unused: they throw, the others get the average with this
// rank's zero, and the one-time bucket rebuild (a broadcast) still involves every rank.
TEST_CASE("A parameter unused on one rank only: that rank throws, nobody hangs", "[ddp][unused]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  DistributedDataParallel ddp(std::make_shared<Branches>(rank, /*with_b=*/false), tiny_buckets());
  for (std::int64_t step = 0; step < 2; ++step) {
    const auto [code, message] =
        error_from([&] { forward_backward(ddp, shard(rank, size, step)); });
    INFO(message);
    CHECK(all_ranks(rank == 0 ? code == ErrorCode::InvalidArgument &&
                                    message.find("module.u") != std::string::npos
                              : code == ErrorCode::Internal));
    const nn::NamedParameters expected = expected_branch_grads(size, step, /*with_b=*/false);
    CHECK(all_ranks(max_diff(ddp.named_parameters(), expected, true) < 1e-5));
    zero_grads(ddp);
  }
}

// Note [Gradients reduced in place]: a gradient that cannot be reduced where it is goes through
// the bucket. On rank 0, "u" (unused there) has no gradient at all: it must count as zeros in
// every step (not as the slice's last average), and the other ranks' gradients, reduced in
// place, must hold the average with that zero. Then one of the wrong size: InvalidArgument on
// rank 0 naming it, zeros for the others, and nobody hangs.
// The parameters to compare: on rank 0, all but "u", whose gradient the test replaced.
nn::NamedParameters but_u(const nn::NamedParameters& all, int rank) {
  nn::NamedParameters kept;
  for (const auto& [name, p] : all) {
    if (rank != 0 || (name != "u" && name != "module.u")) kept.emplace_back(name, p);
  }
  return kept;
}

TEST_CASE("A gradient absent or of the wrong size goes through the bucket as zeros",
          "[ddp][unused]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = std::make_shared<Branches>(rank, /*with_b=*/false);
  DistributedDataParallel ddp(model, {.find_unused_parameters = true});
  for (std::int64_t step = 0; step < 3; ++step) {
    zero_grads(ddp);
    if (rank == 0) model->u.grad() = Tensor();
    forward_backward(ddp, shard(rank, size, step));
    const nn::NamedParameters expected = expected_branch_grads(size, step, /*with_b=*/false);
    const double diff = max_diff(but_u(ddp.named_parameters(), rank), but_u(expected, rank), true);
    INFO("step " << step << " max |gradient difference| " << diff);
    CHECK(all_ranks(diff < 1e-5));
    CHECK(all_ranks(rank != 0 || model->u.grad().num_elements() == 0));  // Left as it was.
  }
  zero_grads(ddp);
  if (rank == 0) model->u.grad() = Tensor::from<float>(std::vector<float>{0, 0, 0}, {3});
  const auto [code, message] = error_from([&] { forward_backward(ddp, shard(rank, size, 3)); });
  INFO(message);
  CHECK(all_ranks(rank == 0 ? code == ErrorCode::InvalidArgument &&
                                  message.find("module.u") != std::string::npos
                            : code == ErrorCode::Internal));
  const nn::NamedParameters expected = expected_branch_grads(size, 3, /*with_b=*/false);
  const double diff = max_diff(but_u(ddp.named_parameters(), rank), but_u(expected, rank), true);
  CHECK(all_ranks(diff < 1e-5));
}

// Four steps of a DDP over Branches (find_unused_parameters) in which rank 0's backward()
// throws at step 1: `breaks(true)` before that step's backward, `breaks(false)` after it;
// `backward` runs a step's forward and backward. Every rank but rank 0 at step 1 must succeed,
// and every step but step 1 (whose averages include rank 0's gradients as they stood) must
// equal the oracle: a step skew would make every later average mix two steps. The checks come
// after the loop (Note [Collective assertions]).
void check_a_failed_backward_keeps_the_steps(
    const std::function<void(bool)>& breaks,
    const std::function<void(DistributedDataParallel&, const Batch&)>& backward,
    const std::shared_ptr<Branches>& model) {
  const int rank = tutti::rank();
  const int size = tutti::size();
  DistributedDataParallel ddp(model, {.find_unused_parameters = true});
  bool codes_ok = true;
  double worst = 0;
  std::string messages;
  for (std::int64_t step = 0; step < 4; ++step) {
    zero_grads(ddp);
    const bool fails = step == 1 && rank == 0;
    if (fails) breaks(true);
    const auto [code, message] = error_from([&] { backward(ddp, shard(rank, size, step)); });
    messages += message;
    codes_ok =
        codes_ok && (fails ? code == ErrorCode::InvalidArgument : code == ErrorCode::Internal);
    if (fails) breaks(false);
    if (step == 1) continue;
    const nn::NamedParameters expected = expected_branch_grads(size, step, /*with_b=*/false);
    worst =
        std::max(worst, max_diff(but_u(ddp.named_parameters(), rank), but_u(expected, rank), true));
  }
  INFO(messages << "; max |gradient difference| " << worst);
  CHECK(all_ranks(codes_ok));
  CHECK(all_ranks(worst < 1e-5));
}

TEST_CASE("A backward() that threw on one rank leaves every rank on the same step",
          "[ddp][errors]") {
  // Rank 0's a.weight.grad() is absent at step 1, which the engine refuses before its buckets
  // start. Before, its step-2 buckets then matched the others' unfinished step-1 ones under the
  // same names. Rank 0's buckets now go out (from the callback Note [Backward callbacks] runs
  // after a walk that threw) before its exception reaches the test.
  Session session;
  auto model = std::make_shared<Branches>(tutti::rank(), /*with_b=*/false);
  nn::Variable weight = model->a->weight();  // A copy shares the parameter's state.
  check_a_failed_backward_keeps_the_steps(
      [&](bool broken) {
        weight.grad() = broken ? Tensor() : Tensor(DataType::Float32, {2, 4});
      },
      [](DistributedDataParallel& ddp, const Batch& batch) { forward_backward(ddp, batch); },
      model);
}

TEST_CASE(
    "A backward() that threw before reaching the DDP output leaves every rank on the same step",
    "[ddp][errors]") {
  // The loss is scaled by a leaf outside the module, whose grad() rank 0 empties at step 1: its
  // walk throws there, in the loss's own backward, before the DDP output's backward (which
  // starts the pass) runs. The output's failed-pass hook starts the pass, so rank 0's buckets
  // still go out (with its zeroed grad()s).
  Session session;
  nn::Variable scale(Tensor::from<float>(std::vector<float>{1}, {}), true);
  check_a_failed_backward_keeps_the_steps(
      [&](bool broken) { scale.grad() = broken ? Tensor() : Tensor(DataType::Float32, {}); },
      [&](DistributedDataParallel& ddp, const Batch& batch) {
        (nn::mse_loss(ddp.forward(batch.x), batch.y) * scale).backward();
      },
      std::make_shared<Branches>(tutti::rank(), /*with_b=*/false));
}

// Registered a, b, c but applied b, a, c (or, on ranks != 0 with `rank_dependent`, a, b, c).
class Reordered : public nn::Module {
 public:
  Reordered(bool b_first, std::uint64_t seed) : b_first_(b_first) {
    nn::manual_seed(seed);
    a = register_module("a", std::make_shared<nn::Linear>(4, 4));
    b = register_module("b", std::make_shared<nn::Linear>(4, 4));
    c = register_module("c", std::make_shared<nn::Linear>(4, 2));
  }
  nn::Variable forward(const nn::Variable& x) override {
    const auto& first = b_first_ ? b : a;
    const auto& second = b_first_ ? a : b;
    return c->forward(nn::relu(second->forward(nn::relu(first->forward(x)))));
  }
  std::shared_ptr<nn::Linear> a, b, c;

 private:
  bool b_first_;
};

using BucketNames = std::vector<std::vector<std::string>>;
const BucketNames kRegistrationOrder = {{"module.c.bias"}, {"module.c.weight"},
                                        {"module.b.bias"}, {"module.b.weight"},
                                        {"module.a.bias"}, {"module.a.weight"}};
// backward() reaches c, then the layer applied second, then the first; weight before bias.
const BucketNames kReadyOrderBFirst = {{"module.c.weight"}, {"module.c.bias"},
                                       {"module.a.weight"}, {"module.a.bias"},
                                       {"module.b.weight"}, {"module.b.bias"}};

TEST_CASE("Buckets are rebuilt once, in the order gradients became ready", "[ddp][rebuild]") {
  Session session;
  const bool view = GENERATE(false, true);
  const int rank = tutti::rank();
  const int size = tutti::size();
  DistributedDataParallelOptions options = tiny_buckets();
  options.gradient_as_bucket_view = view;
  DistributedDataParallel ddp(std::make_shared<Reordered>(true, 3), options);
  Reordered reference(true, 3);
  CHECK(all_ranks(ddp.bucket_names_for_testing() == kRegistrationOrder));
  const nn::NamedParameters named = ddp.named_parameters();
  optim::SGD sgd(variables(named), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_sgd(variables(reference.named_parameters()), {.lr = 0.1, .momentum = 0.9});
  for (std::int64_t step = 0; step < 3; ++step) {
    sgd.zero_grad();
    forward_backward(ddp, shard(rank, size, step));
    CHECK(all_ranks(ddp.bucket_names_for_testing() == kReadyOrderBFirst));
    ref_sgd.zero_grad();
    forward_backward(reference, full_batch(step));
    CHECK(all_ranks(max_diff(named, reference.named_parameters(), true) < 1e-5));
    sgd.step();
    ref_sgd.step();
  }
  CHECK(all_ranks(max_diff(named, reference.named_parameters()) < 1e-5));
}

TEST_CASE("The rebuild takes rank 0's order on every rank", "[ddp][rebuild]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  // Rank 0 applies b first, the others a first: their ready orders differ.
  DistributedDataParallel ddp(std::make_shared<Reordered>(rank == 0, 3), tiny_buckets());
  forward_backward(ddp, shard(rank, size, 0));
  CHECK(all_ranks(ddp.bucket_names_for_testing() == kReadyOrderBFirst));
}

TEST_CASE("A rank that joined before its first backward rebuilds with the others next epoch",
          "[ddp][rebuild][join]") {
  // The one-time rebuild is a broadcast of the root's order: while a member has joined it
  // cannot take part, so the rebuild waits for a pass every member runs. Before, the others
  // counted the rebuild done in their first pass and the late member broadcast alone in its
  // own first pass (the next epoch), where no one else ever would: a hang until the stall
  // inspector stopped the job.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const int late = GENERATE(0, 1) == 0 ? 0 : size - 1;  // The root, or the last rank.
  if (size < 2) return;
  DistributedDataParallel ddp(std::make_shared<Reordered>(true, 5), tiny_buckets());
  Reordered reference(true, 5);
  const nn::NamedParameters named = ddp.named_parameters();
  const nn::NamedParameters ref_named = reference.named_parameters();
  optim::SGD sgd(variables(named), {.lr = 0.1});
  optim::SGD ref_sgd(variables(ref_named), {.lr = 0.1});
  // Epoch 0: `late` has no batch; the others take two steps, reduced over the whole set (the
  // joined rank contributes zeros). Epoch 1: everyone takes two steps, and the buckets are
  // rebuilt in the first, with every member.
  for (int epoch = 0; epoch < 2; ++epoch) {
    const int steps = epoch == 0 && rank == late ? 0 : 2;
    for (int step = 0; step < steps; ++step) {
      sgd.zero_grad();
      forward_backward(ddp, shard(rank, size, 10 * epoch + step));
      sgd.step();
    }
    const int last = tutti::join();
    CHECK(all_ranks(ddp.bucket_names_for_testing() ==
                    (epoch == 0 ? kRegistrationOrder : kReadyOrderBFirst)));
    // The joined rank's parameters did not take the others' steps: as after any uneven epoch,
    // the application brings them in line from a rank that trained to the end.
    if (epoch == 0) optim::broadcast_parameters(named, last);
  }
  // Oracle: each step's gradient is the sum of the active ranks' shard gradients over the set
  // size.
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int step = 0; step < 2; ++step) {
      ref_sgd.zero_grad();
      for (int r = 0; r < size; ++r) {
        if (epoch == 0 && r == late) continue;
        forward_backward(reference, shard(r, size, 10 * epoch + step));
      }
      for (const auto& [name, p] : ref_named) {
        for (float& g : p.grad().span<float>()) g /= static_cast<float>(size);
      }
      ref_sgd.step();
    }
  }
  CHECK(all_ranks(max_diff(named, ref_named) < 1e-5));
}

TEST_CASE("join(): a rank with fewer batches contributes zeros and nobody hangs", "[ddp][join]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const int fewer = GENERATE(0, 1) == 0 ? 0 : size - 1;  // The root, or the last rank.
  // 0: it joins before its first backward (no data at all), so before the one-time bucket
  // rebuild the others make after their first step.
  const int fewer_steps = GENERATE(2, 0);
  auto steps_of = [&](int r) { return r == fewer ? fewer_steps : 3; };
  auto make = [] {
    nn::manual_seed(29);
    auto model = std::make_shared<nn::Sequential>();  // With buffers, kept while one joined.
    model->add(std::make_shared<nn::Linear>(4, 8))
        .add(std::make_shared<nn::BatchNorm1d>(8))
        .add(std::make_shared<nn::ReLU>())
        .add(std::make_shared<nn::Linear>(8, 2));
    return model;
  };
  DistributedDataParallel ddp(make());
  optim::SGD sgd(variables(ddp.named_parameters()), {.lr = 0.1});
  for (int step = 0; step < steps_of(rank); ++step) {
    sgd.zero_grad();
    forward_backward(ddp, shard(rank, size, step));
    sgd.step();
  }
  const int last = tutti::join();
  CHECK(all_ranks(last >= 0 && last < size));

  // Oracle: at each step the sum of the active ranks' shard gradients over the set size.
  auto reference = make();
  const nn::NamedParameters ref_named = reference->named_parameters();
  optim::SGD ref_sgd(variables(ref_named), {.lr = 0.1});
  int max_steps = 0;
  for (int r = 0; r < size; ++r) max_steps = std::max(max_steps, steps_of(r));
  double diff = 1e30;
  if (steps_of(rank) == 0) diff = max_diff(ddp.named_parameters(), ref_named);  // Untouched.
  for (int step = 0; step < max_steps; ++step) {
    ref_sgd.zero_grad();
    for (int r = 0; r < size; ++r) {
      if (step < steps_of(r)) forward_backward(*reference, shard(r, size, step));
    }
    for (const auto& [name, p] : ref_named) {
      for (float& g : p.grad().span<float>()) g /= static_cast<float>(size);
    }
    ref_sgd.step();
    if (step + 1 == steps_of(rank)) diff = max_diff(ddp.named_parameters(), ref_named);
  }
  INFO("rank " << rank << " (fewer: rank " << fewer << ") max |difference| " << diff);
  CHECK(all_ranks(diff < 1e-5));
}

TEST_CASE("After a join() the next epoch trains and the buffers are broadcast again",
          "[ddp][join]") {
  // Before, the last rank to train saw the others joined and skipped the buffer broadcast at
  // every later forward, while the others broadcast: both waited in different ops forever.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  nn::manual_seed(31);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(4, 2)).add(std::make_shared<nn::BatchNorm1d>(2));
  DistributedDataParallel ddp(model);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int step = 0; step <= rank; ++step) {
      forward_backward(ddp, shard(rank, size, 10 * epoch + step));  // Uneven: rank r, r + 1.
    }
    tutti::join();
  }
  // One more forward of the same batch everywhere: each rank starts from the root's running
  // statistics, so all end equal (checked with plain MPI: the max and min over ranks agree).
  const Tensor x = shard(0, size, 99).x;
  static_cast<void>(ddp.forward(nn::Variable(x)));
  std::vector<float> mean;
  for (const auto& [name, b] : ddp.named_buffers()) {
    for (float v : b.value().span<float>()) mean.push_back(v);
  }
  std::vector<float> high(mean.size()), low(mean.size());
  MPI_Allreduce(mean.data(), high.data(), static_cast<int>(mean.size()), MPI_FLOAT, MPI_MAX,
                MPI_COMM_WORLD);
  MPI_Allreduce(mean.data(), low.data(), static_cast<int>(mean.size()), MPI_FLOAT, MPI_MIN,
                MPI_COMM_WORLD);
  CHECK(all_ranks(!mean.empty() && high == low));
}

TEST_CASE("While a rank has joined, the others keep their own buffers", "[ddp][join]") {
  // API.md: "While any rank of the set has joined, buffers are not broadcast." The last rank
  // joins at once; the others train two steps on their own batches, so that each one's running
  // statistics differ from the root's at the second forward. Oracle: the same model without
  // DDP on this rank's batches (DDP changes no parameter without an optimizer). Before, the
  // second forward gave every rank the root's statistics (observable from 3 ranks: 2 live).
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto make = [] {
    nn::manual_seed(37);
    auto model = std::make_shared<nn::Sequential>();
    model->add(std::make_shared<nn::Linear>(4, 2)).add(std::make_shared<nn::BatchNorm1d>(2));
    return model;
  };
  DistributedDataParallel ddp(make());
  auto reference = make();
  if (rank != size - 1 || size == 1) {
    for (int step = 0; step < 2; ++step) {
      forward_backward(ddp, shard(rank, size, step));
      static_cast<void>(reference->forward(nn::Variable(shard(rank, size, step).x)));
    }
  }
  tutti::join();
  std::vector<float> mine, expected;
  for (const auto& [name, b] : ddp.named_buffers()) {
    for (float v : b.value().span<float>()) mine.push_back(v);
  }
  for (const auto& [name, b] : reference->named_buffers()) {
    for (float v : b.value().span<float>()) expected.push_back(v);
  }
  INFO("rank " << rank);
  CHECK(all_ranks(!mine.empty() && mine == expected));
}

// Identity in forward; its backward records how many buckets had started by then.
class Probe : public nn::Module {
 public:
  nn::Variable forward(const nn::Variable& x) override {
    return nn::detail::make_result(x.value(), {x}, [this](const Tensor& g) {
      started_at_backward = ddp->buckets_started_for_testing();
      return nn::detail::Gradients{g};
    });
  }
  DistributedDataParallel* ddp = nullptr;
  int started_at_backward = -1;
};

TEST_CASE("Buckets start mid-backward, before the first layer's gradient is computed",
          "[ddp][overlap]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  nn::manual_seed(31);
  auto probe = std::make_shared<Probe>();
  auto model = std::make_shared<nn::Sequential>();
  model
      ->add(std::make_shared<nn::Linear>(4, 8))  // 0: its gradient comes after the probe's.
      .add(probe)
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(8, 8))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(8, 2));
  DistributedDataParallel ddp(model, tiny_buckets());  // 6 buckets, one per parameter.
  probe->ddp = &ddp;
  for (std::int64_t step = 0; step < 2; ++step) {  // Before and after the rebuild.
    forward_backward(ddp, shard(rank, size, step));
    INFO("step " << step << ": " << probe->started_at_backward << " buckets had started");
    // Layers 3 and 5 (4 parameters, 4 buckets) were reduced while layer 0 was still to come.
    CHECK(all_ranks(probe->started_at_backward == 4));
    CHECK(all_ranks(ddp.buckets_started_for_testing() == 6));
  }
}

TEST_CASE("DDP over a process set averages among its members only", "[ddp][process_set]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  if (size < 3) return;  // {0, 1} must differ from the global set. The same on every rank.
  ProcessSet pair = add_process_set({0, 1});
  if (rank <= 1) {
    DistributedDataParallel ddp(make_model(37), {.process_set = pair});
    auto reference = make_model(37);
    forward_backward(ddp, shard(rank, 2, 0));
    forward_backward(*reference, shard(0, 2, 0));
    forward_backward(*reference, shard(1, 2, 0));
    CHECK(all_ranks(max_diff(ddp.named_parameters(), reference->named_parameters(), true, 0.5) <
                    1e-5));
  } else {
    const auto [code, message] =
        error_from([&] { DistributedDataParallel ddp(make_model(37), {.process_set = pair}); });
    CHECK(all_ranks(code == ErrorCode::InvalidArgument));
  }
  remove_process_set(pair);
}

}  // namespace
}  // namespace tutti::test

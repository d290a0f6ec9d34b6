// SPDX-License-Identifier: Apache-2.0
// DistributedDataParallel at 1-4 ranks against single-process oracles: N ranks on shards of a
// batch must end where one process on the whole batch ends (an identical model trained with
// plain nn on every rank). Equivalence with and without gradient_as_bucket_view and for several
// bucket sizes, compression, no_sync, the constructor's and the buffers' broadcasts, bucket
// views. See Note [Collective assertions] in test/support/mpi_test_util.h.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

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

struct EquivalenceCase {
  const char* what;
  bool cnn;
  DistributedDataParallelOptions options;
  double tolerance;  // On gradients and parameters.
};

// Three SGD steps (momentum) of DDP on shards and of the oracle on whole batches; after each
// backward() the gradients must already be the whole batch's.
void check_equivalence(const EquivalenceCase& c) {
  INFO(c.what);
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto reference = make_net(c.cnn, 7);
  DistributedDataParallel ddp(make_net(c.cnn, 7), c.options);
  const nn::NamedParameters named = ddp.named_parameters();
  const nn::NamedParameters ref_named = reference->named_parameters();
  optim::SGD sgd(variables(named), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_sgd(variables(ref_named), {.lr = 0.1, .momentum = 0.9});
  for (std::int64_t step = 0; step < 3; ++step) {
    sgd.zero_grad();
    forward_backward(ddp, batch_for(c.cnn, rank, size, step));
    ref_sgd.zero_grad();
    forward_backward(*reference, whole_batch(c.cnn, step));
    const double diff = max_diff(named, ref_named, /*grads=*/true);
    INFO("step " << step << " max |gradient difference| " << diff);
    CHECK(all_ranks(diff < c.tolerance));
    sgd.step();
    ref_sgd.step();
  }
  CHECK(all_ranks(max_diff(named, ref_named) < c.tolerance));
  CHECK(all_ranks(max_diff(named, make_net(c.cnn, 7)->named_parameters()) > 1e-3));  // Trained.
}

TEST_CASE("DDP: N ranks on shards end with the parameters of one process on the whole batch",
          "[ddp]") {
  Session session;
  const bool cnn = GENERATE(false, true);
  const bool view = GENERATE(false, true);
  // Default caps (one bucket), a bucket per parameter, and buckets of ~100 bytes.
  const double cap = GENERATE(25.0, 1e-9, 1e-4);
  check_equivalence({cnn ? "cnn" : "mlp",
                     cnn,
                     {.bucket_cap_mb = cap,
                      .gradient_as_bucket_view = view,
                      .first_bucket_mb = cap == 25.0 ? 1.0 : cap},
                     1e-5});
}

TEST_CASE("DDP over a model with a frozen layer trains the rest like one process", "[ddp]") {
  // Variable::set_requires_grad(false) on the first Linear before the DDP is built: the DDP
  // leaves it out (as PyTorch's DDP leaves out what does not require grad), and the rest ends
  // where one process on the whole batch ends.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const auto frozen_first = [] {
    std::shared_ptr<nn::Sequential> net = make_net(/*cnn=*/false, 7);
    net->named_children().front().second->set_requires_grad(false);  // "0": Linear(4, 8).
    return net;
  };
  auto reference = frozen_first();
  DistributedDataParallel ddp(frozen_first());
  const nn::NamedParameters named = ddp.named_parameters();  // module.0.weight, .0.bias, .2.*
  const nn::NamedParameters ref_named = reference->named_parameters();
  REQUIRE(named.size() == 4);
  optim::SGD sgd(variables(named), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_sgd(variables(ref_named), {.lr = 0.1, .momentum = 0.9});
  const nn::NamedParameters trained(named.begin() + 2, named.end());
  const nn::NamedParameters ref_trained(ref_named.begin() + 2, ref_named.end());
  for (std::int64_t step = 0; step < 3; ++step) {
    sgd.zero_grad();
    forward_backward(ddp, batch_for(false, rank, size, step));
    ref_sgd.zero_grad();
    forward_backward(*reference, whole_batch(false, step));
    const double diff = max_diff(trained, ref_trained, /*grads=*/true);
    INFO("step " << step << " max |gradient difference| " << diff);
    CHECK(all_ranks(diff < 1e-5 && named[0].second.grad().num_elements() == 0 &&
                    named[1].second.grad().num_elements() == 0));
    sgd.step();
    ref_sgd.step();
  }
  const nn::NamedParameters initial = make_net(false, 7)->named_parameters();
  const nn::NamedParameters frozen(named.begin(), named.begin() + 2);
  CHECK(all_ranks(max_diff(frozen, nn::NamedParameters(initial.begin(), initial.begin() + 2)) ==
                  0.0));
  CHECK(all_ranks(max_diff(trained, ref_trained) < 1e-5));
  CHECK(all_ranks(max_diff(trained, nn::NamedParameters(initial.begin() + 2, initial.end())) >
                  1e-3));  // Trained.
}

TEST_CASE("DDP with FP16 and BF16 compression is close to the whole batch's", "[ddp]") {
  Session session;
  const bool view = GENERATE(false, true);
  const Compression compression = GENERATE(Compression::FP16, Compression::BF16);
  // Gradients of magnitude ~1: fp16 keeps ~3 decimal digits, bf16 ~2.
  check_equivalence({compression == Compression::FP16 ? "fp16" : "bf16",
                     true,
                     {.bucket_cap_mb = 1e-4,
                      .gradient_as_bucket_view = view,
                      .compression = compression,
                      .first_bucket_mb = 1e-4},
                     compression == Compression::FP16 ? 4e-3 : 3e-2});
}

TEST_CASE("no_sync accumulates 3 micro-batches locally; the synchronized one averages the sum",
          "[ddp][no_sync]") {
  Session session;
  const bool view = GENERATE(false, true);
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto reference = make_model(3);
  auto local = make_model(3);  // This rank alone: what no_sync() must leave in grad().
  DistributedDataParallel ddp(make_model(3), {.gradient_as_bucket_view = view});
  const nn::NamedParameters named = ddp.named_parameters();
  {
    auto guard = ddp.no_sync();
    forward_backward(ddp, shard(rank, size, 0));
    forward_backward(ddp, shard(rank, size, 1));
  }
  forward_backward(*local, shard(rank, size, 0));
  forward_backward(*local, shard(rank, size, 1));
  CHECK(all_ranks(max_diff(named, local->named_parameters(), /*grads=*/true) < 1e-6));
  CHECK(all_ranks(ddp.buckets_started_for_testing() == 0));
  forward_backward(ddp, shard(rank, size, 2));  // Synchronized: the average of the sums.
  for (std::int64_t step = 0; step < 3; ++step) forward_backward(*reference, full_batch(step));
  CHECK(all_ranks(max_diff(named, reference->named_parameters(), /*grads=*/true) < 1e-5));
}

TEST_CASE("The constructor broadcasts the root's parameters and buffers", "[ddp][broadcast]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const int root = size - 1;
  nn::manual_seed(100 + rank);  // Different weights on every rank.
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(4, 8)).add(std::make_shared<nn::BatchNorm1d>(8));
  for (auto& [name, b] : model->named_buffers()) {
    for (float& v : b.value().span<float>()) v = static_cast<float>(rank + 1);
  }
  DistributedDataParallel ddp(model, {.root_rank = root});
  nn::manual_seed(100 + root);  // The oracle: the root's own model.
  nn::Linear expected(4, 8);
  bool ok = true;
  const auto w = find(ddp.named_parameters(), "module.0.weight").value().span<float>();
  const auto we = expected.weight().value().span<float>();
  for (std::size_t i = 0; i < w.size(); ++i) ok = ok && w[i] == we[i];
  const auto b = find(ddp.named_parameters(), "module.0.bias").value().span<float>();
  const auto be = expected.bias().value().span<float>();
  for (std::size_t i = 0; i < b.size(); ++i) ok = ok && b[i] == be[i];
  for (auto& [name, b] : ddp.named_buffers()) {
    for (float v : b.value().span<float>()) ok = ok && v == static_cast<float>(root + 1);
  }
  CHECK(all_ranks(ok));
  CHECK(all_ranks(ddp.named_parameters().front().first == "module.0.weight"));
}

TEST_CASE("issue 24: DDP over a set whose ranks differ from the global ones, global root",
          "[ddp][broadcast][process_set]") {
  if (world_size() < 3) return;
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const ProcessSet set = add_process_set({1, size - 1});  // Set rank 1 is global size - 1.
  const int root = size - 1;
  bool ok = true;
  if (set.included()) {
    nn::manual_seed(100 + rank);  // Different weights on every rank.
    auto model = std::make_shared<nn::Sequential>();
    model->add(std::make_shared<nn::Linear>(4, 8)).add(std::make_shared<nn::BatchNorm1d>(8));
    for (auto& [name, b] : model->named_buffers()) {
      for (float& v : b.value().span<float>()) v = static_cast<float>(rank + 1);
    }
    DistributedDataParallel ddp(model, {.root_rank = root, .process_set = set});
    nn::manual_seed(100 + root);  // The oracle: the root's own model.
    nn::Linear expected(4, 8);
    const auto w = find(ddp.named_parameters(), "module.0.weight").value().span<float>();
    const auto we = expected.weight().value().span<float>();
    for (std::size_t i = 0; i < w.size(); ++i) ok = ok && w[i] == we[i];
    // The buffers' broadcast before a training forward comes from the root too.
    for (auto& [name, b] : ddp.named_buffers()) {
      for (float& v : b.value().span<float>()) v = rank == root ? 3.0f : -1.0f;
    }
    model->train();
    nn::Variable loss = nn::sum(ddp.forward(nn::Variable(Tensor(DataType::Float32, {2, 4}))));
    loss.backward();
    // 0.9 running + 0.1 batch mean; the batch is zeros, so its mean is the root's bias.
    const auto mean = find(ddp.named_buffers(), "module.1.running_mean").value().span<float>();
    const auto bias = expected.bias().value().span<float>();
    for (std::size_t i = 0; i < mean.size(); ++i)
      ok = ok && std::abs(mean[i] - (0.9f * 3.0f + 0.1f * bias[i])) < 1e-5f;
  }
  CHECK(all_ranks(ok));
  barrier();
  remove_process_set(set);
}

TEST_CASE("Buffers are broadcast before every training forward (BatchNorm running statistics)",
          "[ddp][broadcast]") {
  Session session;
  const bool broadcast_buffers = GENERATE(true, false);
  const int rank = tutti::rank();
  const int size = tutti::size();
  nn::manual_seed(5);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(4, 8))
      .add(std::make_shared<nn::BatchNorm1d>(8))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(8, 2));
  DistributedDataParallel ddp(model, {.broadcast_buffers = broadcast_buffers});
  optim::SGD sgd(variables(ddp.named_parameters()), {.lr = 0.1});
  for (std::int64_t step = 0; step < 2; ++step) {  // Each rank's own data: buffers drift apart.
    sgd.zero_grad();
    forward_backward(ddp, shard(rank, size, step));
    sgd.step();
  }
  {
    // The same input everywhere: equal buffers afterwards iff they were equal before.
    auto guard = ddp.no_sync();
    static_cast<void>(ddp.forward(full_batch(9).x));
  }
  std::vector<double> buffers;
  for (auto& [name, b] : ddp.named_buffers()) {
    for (float v : b.value().span<float>()) buffers.push_back(v);
  }
  const bool equal = same_as_root(buffers, 0);
  INFO("broadcast_buffers " << broadcast_buffers << ", equal " << equal);
  CHECK(all_ranks(equal == (broadcast_buffers || size == 1)));
}

TEST_CASE("gradient_as_bucket_view: each bucket's gradients are consecutive views of it",
          "[ddp][view]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  DistributedDataParallel ddp(
      make_cnn(9),
      {.bucket_cap_mb = 1e-4, .gradient_as_bucket_view = true, .first_bucket_mb = 1e-4});
  const nn::NamedParameters named = ddp.named_parameters();
  auto contiguous = [&] {
    bool ok = true;
    for (const std::vector<std::string>& bucket : ddp.bucket_names_for_testing()) {
      for (std::size_t m = 1; m < bucket.size(); ++m) {
        const Tensor& previous = find(named, bucket[m - 1]).grad();
        ok = ok && static_cast<float*>(previous.data()) + previous.num_elements() ==
                       find(named, bucket[m]).grad().data();
      }
    }
    return ok;
  };
  CHECK(all_ranks(contiguous()));
  optim::SGD sgd(variables(named), {.lr = 0.1});
  for (std::int64_t step = 0; step < 2; ++step) {  // Across the rebuild after the first step.
    sgd.zero_grad();
    forward_backward(ddp, batch_for(true, rank, size, step));
    sgd.step();
    CHECK(all_ranks(contiguous()));
  }
  // A gradient replaced by the user is copied back into the bucket at the next forward().
  nn::Variable first = named.front().second;
  Tensor replacement = first.grad().clone();
  first.grad() = replacement;
  static_cast<void>(ddp.forward(batch_for(true, rank, size, 2).x));
  CHECK(all_ranks(contiguous() && first.grad().data() != replacement.data()));
  // One that cannot be copied back (another size, on rank 0) is dropped and named by backward()
  // after the reductions; before, silently. The others are not held up.
  if (rank == 0) first.grad() = Tensor(DataType::Float32, {3});
  const auto [code, message] =
      error_from([&] { forward_backward(ddp, batch_for(true, rank, size, 3)); });
  INFO(message);
  CHECK(all_ranks(rank == 0 ? code == ErrorCode::InvalidArgument &&
                                  message.find(named.front().first) != std::string::npos &&
                                  message.find("replaced by a float32[3]") != std::string::npos
                            : code == ErrorCode::Internal));
  CHECK(all_ranks(contiguous()));
}

TEST_CASE("DDP rejects bad arguments before communicating", "[ddp][errors]") {
  Session session;
  const int size = tutti::size();
  auto code = [](auto&& f) { return error_from(f).first; };
  auto build = [&](DistributedDataParallelOptions o) {
    return code([&] { DistributedDataParallel(make_model(1), o); });
  };
  CHECK(all_ranks(code([] { DistributedDataParallel(nullptr); }) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(build({.bucket_cap_mb = 0}) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(build({.first_bucket_mb = -1}) == ErrorCode::InvalidArgument));
  CHECK(
      all_ranks(build({.compression = static_cast<Compression>(9)}) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(build({.root_rank = size}) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(build({.root_rank = size - 1}) == ErrorCode::Internal));  // Fine: no error.
}

// A cap too large for an int64 of bytes (DBL_MAX for "no cap") is no cap: one bucket. Before,
// the cast was undefined and gave a bucket per parameter.
TEST_CASE("A bucket cap beyond any size puts every gradient in one bucket", "[ddp]") {
  Session session;
  const double huge = std::numeric_limits<double>::max();
  DistributedDataParallel ddp(make_cnn(9), {.bucket_cap_mb = huge, .first_bucket_mb = huge});
  CHECK(all_ranks(ddp.bucket_names_for_testing().size() == 1));
}

// Note [One model on every rank] in src/nn/parallel/distributed_data_parallel.cc: a model with
// another parameter count, or other names, on one rank fails the constructor on every rank with
// Mismatch, at once; before, the broadcasts matched by name stalled until the stall limit (600 s
// by default, which this test's 180 s timeout would not reach).
TEST_CASE("A model that differs across the ranks fails the constructor with Mismatch everywhere",
          "[ddp][errors]") {
  Session session;
  const int size = tutti::size();
  if (size < 2) return;
  const bool odd_one = tutti::rank() == size - 1;
  std::string message;
  const auto build = [&](std::shared_ptr<nn::Module> model) {
    const auto [code, what] = error_from([&] { DistributedDataParallel ddp(std::move(model)); });
    message = what;
    return code;
  };
  auto extra = make_model(3);  // One more layer: more parameters.
  if (odd_one) extra->add(std::make_shared<nn::Linear>(2, 2));
  CHECK(all_ranks(build(extra) == ErrorCode::Mismatch));
  CHECK(message.find("the model differs across the ranks") != std::string::npos);
  auto renamed = std::make_shared<nn::Sequential>();  // The same count, other names.
  if (odd_one) renamed->add(std::make_shared<nn::ReLU>());
  renamed->add(std::make_shared<nn::Linear>(4, 2));
  CHECK(all_ranks(build(renamed) == ErrorCode::Mismatch));
  CHECK(all_ranks(build(make_model(3)) == ErrorCode::Internal));  // The same model: no error.
}

// Two DDPs over one set whose roots differ: each root's count of DDPs is its own, so the ids
// could be equal (here both 1, rank 0 having built one more DDP alone); the op names carry the
// root too. Before, a backward through both failed with "already in flight".
TEST_CASE("Two DDPs of one set with different roots reduce under their own names",
          "[ddp][process_set]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  if (size < 2) return;
  ProcessSet first_only = add_process_set({0});
  if (rank == 0) DistributedDataParallel alone(make_model(5), {.process_set = first_only});
  DistributedDataParallel a(make_model(6), {.root_rank = 0});
  DistributedDataParallel b(make_model(7), {.root_rank = 1});
  const Batch batch = shard(rank, size, 0);
  nn::Variable loss =
      nn::mse_loss(a.forward(batch.x), batch.y) + nn::mse_loss(b.forward(batch.x), batch.y);
  CHECK(all_ranks(error_from([&] { loss.backward(); }).first == ErrorCode::Internal));
  // Both averaged: the gradients agree on every rank (plain MPI's min and max).
  std::vector<double> mine;
  for (const auto* ddp : {&a, &b}) {
    for (const auto& [name, p] : ddp->named_parameters()) {
      for (float g : p.grad().span<float>()) mine.push_back(g);
    }
  }
  CHECK(same_on_every_rank(mine));
  remove_process_set(first_only);
}

}  // namespace
}  // namespace tutti::test

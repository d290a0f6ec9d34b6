// SPDX-License-Identifier: Apache-2.0
// SyncBatchNorm and convert_sync_batchnorm at 1-4 ranks against BatchNorm over the concatenated
// batch in one process (computed on every rank): outputs, input and parameter gradients,
// running statistics, uneven and empty shards, a mean large against the spread, and DDP
// training with converted layers.
// See Note [Collective assertions] in test/support/mpi_test_util.h.
#include <cmath>
#include <cstdint>
#include <cstdlib>
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

// A deterministic float32 tensor: element i of rows [first, first + shape[0]) of a global batch.
Tensor pattern(Shape shape, std::int64_t first, double phase) {
  Tensor t(DataType::Float32, shape);
  const std::int64_t row = shape[0] == 0 ? 0 : t.num_elements() / shape[0];
  std::int64_t i = first * row;
  for (float& v : t.span<float>()) {
    v = static_cast<float>(1.5 * std::sin(0.731 * static_cast<double>(i) + phase) + 0.3);
    ++i;
  }
  return t;
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return 1e30;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

// Rows [first, first + count) of a float32 tensor whose first dimension is the batch.
std::span<const float> rows(const Tensor& t, std::int64_t first, std::int64_t count) {
  const std::int64_t row = t.shape()[0] == 0 ? 0 : t.num_elements() / t.shape()[0];
  return t.span<float>().subspan(static_cast<std::size_t>(first * row),
                                 static_cast<std::size_t>(count * row));
}

// weight 1 + 0.1 c, bias 0.05 c: not the defaults, so that both enter every formula.
void set_affine(const nn::Module& bn) {
  for (const auto& [name, p] : bn.named_parameters()) {
    std::span<float> v = p.value().span<float>();
    for (std::size_t c = 0; c < v.size(); ++c) {
      v[c] = name == "weight" ? 1.0f + 0.1f * static_cast<float>(c) : 0.05f * static_cast<float>(c);
    }
  }
}

// The uneven shards of the tests: rank r holds rows [first, first + mine) of a global batch of
// `total` rows, mine = r + 2.
struct UnevenShard {
  std::int64_t first = 0, total = 0, mine = 0;
};
UnevenShard uneven_shard(int rank, int size) {
  UnevenShard part{.mine = rank + 2};
  for (int r = 0; r < size; ++r) {
    if (r < rank) part.first += r + 2;
    part.total += r + 2;
  }
  return part;
}

TEST_CASE("SyncBatchNorm equals BatchNorm over the concatenated batch, forward and backward",
          "[sync_batch_norm]") {
  Session session;
  const int layout = GENERATE(0, 1, 2);  // [n, c], [n, c, l], [n, c, h, w].
  const int rank = tutti::rank();
  const int size = tutti::size();
  constexpr std::int64_t kChannels = 3;
  auto shape_of = [&](std::int64_t n) {
    return layout == 0   ? Shape{n, kChannels}
           : layout == 1 ? Shape{n, kChannels, 5}
                         : Shape{n, kChannels, 2, 3};
  };
  const UnevenShard part = uneven_shard(rank, size);  // Rank r holds r + 2 rows.
  const std::int64_t first = part.first, total = part.total, mine = part.mine;
  nn::SyncBatchNorm sync(kChannels);
  std::shared_ptr<nn::Module> plain =
      layout == 2 ? std::shared_ptr<nn::Module>(std::make_shared<nn::BatchNorm2d>(kChannels))
                  : std::make_shared<nn::BatchNorm1d>(kChannels);
  set_affine(sync);
  set_affine(*plain);
  for (int pass = 0; pass < 2; ++pass) {  // Twice: the running statistics move twice.
    INFO("layout " << layout << ", pass " << pass);
    nn::Variable x(pattern(shape_of(mine), first, pass), true);
    nn::Variable x_all(pattern(shape_of(total), 0, pass), true);
    const nn::Variable y = sync.forward(x);
    const nn::Variable y_all = plain->forward(x_all);
    CHECK(
        all_ranks(max_abs_diff(y.value().span<float>(), rows(y_all.value(), first, mine)) < 1e-5));
    // Loss sum(y * coef): the single process's loss is the sum of the ranks' losses.
    nn::sum(y * nn::Variable(pattern(shape_of(mine), first, 7.0))).backward();
    nn::sum(y_all * nn::Variable(pattern(shape_of(total), 0, 7.0))).backward();
    CHECK(all_ranks(max_abs_diff(x.grad().span<float>(), rows(x_all.grad(), first, mine)) < 1e-5));
    // Weight and bias gradients are this rank's own: their sum over ranks (MPI, the oracle's
    // arithmetic) is the single process's.
    for (std::size_t p = 0; p < 2; ++p) {
      const nn::Variable w = sync.named_parameters()[p].second;
      std::vector<float> summed(w.grad().span<float>().begin(), w.grad().span<float>().end());
      MPI_Allreduce(MPI_IN_PLACE, summed.data(), static_cast<int>(summed.size()), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
      CHECK(all_ranks(
          max_abs_diff(summed, plain->named_parameters()[p].second.grad().span<float>()) < 1e-4));
    }
    for (std::size_t b = 0; b < 2; ++b) {
      CHECK(all_ranks(max_abs_diff(sync.named_buffers()[b].second.value().span<float>(),
                                   plain->named_buffers()[b].second.value().span<float>()) < 1e-5));
    }
  }
  // Evaluation: the running statistics, no communication (only rank 0 runs it).
  sync.train(false);
  plain->train(false);
  bool eval_ok = true;
  if (rank == 0) {
    const Tensor x = pattern(shape_of(4), 0, 3.0);
    eval_ok = max_abs_diff(sync.forward(x).value().span<float>(),
                           plain->forward(x).value().span<float>()) < 1e-6;
  }
  CHECK(all_ranks(eval_ok));
}

TEST_CASE("SyncBatchNorm keeps the variance when the mean is large against the spread",
          "[sync_batch_norm]") {
  // 1e5 + 0.01 * pattern: the variance is 1e-14 of the mean's square. Sums of x and x^2 reduced
  // together lost it to cancellation (outputs 0.04 off at 2 ranks); gathered means and centred
  // squares keep it, as BatchNorm's two passes over the concatenated batch do.
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  constexpr std::int64_t kChannels = 2, kRows = 64;
  auto shifted = [](Tensor t) {
    for (float& v : t.span<float>()) v = 1e5f + 0.01f * v;
    return t;
  };
  nn::SyncBatchNorm sync(kChannels);
  nn::BatchNorm1d plain(kChannels);
  const nn::Variable y =
      sync.forward(nn::Variable(shifted(pattern({kRows, kChannels}, rank * kRows, 0)), false));
  const nn::Variable y_all =
      plain.forward(nn::Variable(shifted(pattern({size * kRows, kChannels}, 0, 0)), false));
  CHECK(all_ranks(max_abs_diff(y.value().span<float>(), rows(y_all.value(), rank * kRows, kRows)) <
                  1e-4));
  // running_var: the unbiased variance, of order 1e-5 here.
  const double var_error = max_abs_diff(sync.named_buffers()[1].second.value().span<float>(),
                                        plain.named_buffers()[1].second.value().span<float>());
  CHECK(all_ranks(var_error < 1e-9));
}

TEST_CASE("A backward() that threw on one rank before a SyncBatchNorm still reduces there",
          "[sync_batch_norm][errors]") {
  // At pass 1 rank 0's loss is scaled by a leaf whose grad() it emptied: its walk throws there,
  // before the layer's backward, whose reduction the other ranks wait in. The layer's
  // failed-pass hook sends zeros to it, so the others' pass 1 is the concatenated batch's with
  // rank 0's loss weights zero, and pass 2 meets pass 2. Before, the others waited, and rank 0's
  // pass-2 forward reduction met their backward one under the layer's name (a Mismatch).
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  constexpr std::int64_t kChannels = 3;
  const UnevenShard part = uneven_shard(rank, size);
  const std::int64_t first = part.first, total = part.total, mine = part.mine;
  nn::SyncBatchNorm sync(kChannels);
  nn::BatchNorm1d plain(kChannels);
  set_affine(sync);
  set_affine(plain);
  nn::Variable scale(Tensor::from<float>(std::vector<float>{1}, {}), true);
  bool ok = true;
  std::string log;
  for (int pass = 0; pass < 3; ++pass) {
    const bool fails = pass == 1 && rank == 0;
    nn::Variable x(pattern({mine, kChannels}, first, pass), true);
    nn::Variable x_all(pattern({total, kChannels}, 0, pass), true);
    if (fails) scale.grad() = Tensor();
    const nn::Variable loss =
        nn::sum(sync.forward(x) * nn::Variable(pattern({mine, kChannels}, first, 7.0)));
    ErrorCode code = ErrorCode::Internal;
    try {
      (loss * scale).backward();
    } catch (const Error& e) {
      code = e.code();
    }
    if (fails) {
      ok = ok && code == ErrorCode::InvalidArgument;
      scale.grad() = Tensor(DataType::Float32, {});
    }
    // The oracle's loss weights, rank 0's rows zero at pass 1 (its contribution to the sums).
    Tensor coef_all = pattern({total, kChannels}, 0, 7.0);
    if (pass == 1) {
      for (float& v : coef_all.span<float>().subspan(0, static_cast<std::size_t>(2 * kChannels)))
        v = 0;
    }
    nn::sum(plain.forward(x_all) * nn::Variable(coef_all)).backward();
    if (fails) continue;
    const double diff = max_abs_diff(x.grad().span<float>(), rows(x_all.grad(), first, mine));
    ok = ok && code == ErrorCode::Internal && diff < 1e-5;
    log += " pass " + std::to_string(pass) + ": " + std::to_string(diff);
  }
  INFO("max |input gradient - oracle| per pass:" << log);
  CHECK(all_ranks(ok));
}

TEST_CASE("issue 24: convert_sync_batchnorm converts a bare BatchNorm1d/2d itself",
          "[sync_batch_norm]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  constexpr std::int64_t kChannels = 2;
  const UnevenShard part = uneven_shard(rank, size);  // Rank r holds r + 2 rows.
  const std::int64_t first = part.first, total = part.total, mine = part.mine;
  for (const bool two_d : {false, true}) {
    INFO((two_d ? "BatchNorm2d" : "BatchNorm1d"));
    auto make = [&]() -> std::shared_ptr<nn::Module> {
      if (two_d) return std::make_shared<nn::BatchNorm2d>(kChannels);
      return std::make_shared<nn::BatchNorm1d>(kChannels);
    };
    const Shape row = two_d ? Shape{kChannels, 2, 2} : Shape{kChannels};
    auto shape_of = [&](std::int64_t n) {
      Shape shape{n};
      shape.insert(shape.end(), row.begin(), row.end());
      return shape;
    };
    std::shared_ptr<nn::Module> bn = make();
    set_affine(*bn);
    const nn::NamedParameters params = bn->named_parameters();
    const nn::NamedParameters buffers = bn->named_buffers();
    const std::shared_ptr<nn::Module> converted = nn::convert_sync_batchnorm(bn);
    // The module itself, its values and names kept.
    bool same = converted == bn && converted->named_parameters().size() == params.size() &&
                converted->named_buffers().size() == buffers.size();
    for (std::size_t i = 0; same && i < params.size(); ++i) {
      same = converted->named_parameters()[i].first == params[i].first &&
             &converted->named_parameters()[i].second.value() == &params[i].second.value();
    }
    CHECK(all_ranks(same));
    // It normalizes over the whole set's batch: as BatchNorm over the concatenated batch.
    std::shared_ptr<nn::Module> plain = make();
    set_affine(*plain);
    const nn::Variable y = converted->forward(nn::Variable(pattern(shape_of(mine), first, 0.5)));
    const nn::Variable y_all = plain->forward(nn::Variable(pattern(shape_of(total), 0, 0.5)));
    CHECK(
        all_ranks(max_abs_diff(y.value().span<float>(), rows(y_all.value(), first, mine)) < 1e-5));
    CHECK(all_ranks(max_abs_diff(converted->named_buffers()[0].second.value().span<float>(),
                                 plain->named_buffers()[0].second.value().span<float>()) < 1e-5));
  }
}

TEST_CASE("SyncBatchNorm counts every rank's values: too few overall is InvalidArgument",
          "[sync_batch_norm][errors]") {
  Session session;
  const int rank = tutti::rank();
  nn::SyncBatchNorm sync(2);
  // One row on rank 0 and none elsewhere: one value per channel in the whole set.
  const auto [code, message] = error_from([&] {
    static_cast<void>(sync.forward(Tensor(DataType::Float32, {rank == 0 ? 1 : 0, 2})));
  });
  INFO(message);
  CHECK(all_ranks(code == ErrorCode::InvalidArgument));
  // Rank 0 alone with two rows is enough when the others have none.
  const auto [code2, message2] = error_from([&] {
    static_cast<void>(sync.forward(pattern({rank == 0 ? 2 : 0, 2}, 0, 0)));
  });
  INFO(message2);
  CHECK(all_ranks(code2 == ErrorCode::Internal));
}

// A module that calls its BatchNorm2d through its own typed pointer, with a BatchNorm1d deeper
// inside a Sequential: conv -> bn2d -> relu -> flatten -> head (Linear, BatchNorm1d, Linear).
class Net : public nn::Module {
 public:
  explicit Net(std::uint64_t seed) {
    nn::manual_seed(seed);
    conv_ = register_module("conv", std::make_shared<nn::Conv2d>(1, 2, 3, 1, 1));
    bn_ = register_module("bn", std::make_shared<nn::BatchNorm2d>(2));
    head_ = register_module("head", std::make_shared<nn::Sequential>());
    head_->add(std::make_shared<nn::Linear>(72, 4))
        .add(std::make_shared<nn::BatchNorm1d>(4))
        .add(std::make_shared<nn::ReLU>())
        .add(std::make_shared<nn::Linear>(4, 2));
  }
  nn::Variable forward(const nn::Variable& x) override {
    return head_->forward(flatten_.forward(nn::relu(bn_->forward(conv_->forward(x)))));
  }

 private:
  std::shared_ptr<nn::Conv2d> conv_;
  std::shared_ptr<nn::BatchNorm2d> bn_;
  std::shared_ptr<nn::Sequential> head_;
  nn::Flatten flatten_;
};

TEST_CASE("convert_sync_batchnorm + DDP: N ranks equal one process with BatchNorm on the batch",
          "[sync_batch_norm][ddp]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = std::make_shared<Net>(43);
  const nn::NamedParameters before = model->named_parameters();
  const nn::NamedParameters buffers_before = model->named_buffers();
  std::shared_ptr<nn::Module> converted = nn::convert_sync_batchnorm(model);
  // Converted in place: the same module, names and Variables.
  bool same = converted == model && converted->named_parameters().size() == before.size();
  for (std::size_t i = 0; same && i < before.size(); ++i) {
    same = converted->named_parameters()[i].first == before[i].first &&
           &converted->named_parameters()[i].second.value() == &before[i].second.value();
  }
  same = same && converted->named_buffers().size() == buffers_before.size();
  CHECK(all_ranks(same));

  Net reference(43);
  nn::DistributedDataParallel ddp(converted);
  const nn::NamedParameters named = ddp.named_parameters();
  optim::SGD sgd(variables(named), {.lr = 0.05, .momentum = 0.9});
  optim::SGD ref_sgd(variables(reference.named_parameters()), {.lr = 0.05, .momentum = 0.9});
  for (std::int64_t step = 0; step < 3; ++step) {
    sgd.zero_grad();
    forward_backward(ddp, batch_for(true, rank, size, step));
    ref_sgd.zero_grad();
    forward_backward(reference, whole_batch(true, step));
    INFO("step " << step);
    CHECK(all_ranks(max_diff(named, reference.named_parameters(), true) < 1e-5));
    sgd.step();
    ref_sgd.step();
  }
  CHECK(all_ranks(max_diff(named, reference.named_parameters()) < 1e-5));
  CHECK(all_ranks(max_diff(ddp.named_buffers(), reference.named_buffers()) < 1e-5));
}

TEST_CASE("SyncBatchNorm over a process set; a rank outside it gets InvalidArgument",
          "[sync_batch_norm][process_set]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  if (size < 3) return;  // {0, 1} must differ from the global set. The same on every rank.
  ProcessSet pair = add_process_set({0, 1});
  nn::SyncBatchNorm sync(2, pair);
  nn::BatchNorm1d plain(2);
  bool ok = true;
  if (rank <= 1) {  // Rows 3r .. 3r + 2 of a batch of 6.
    const nn::Variable y = sync.forward(pattern({3, 2}, 3 * rank, 0));
    const nn::Variable y_all = plain.forward(pattern({6, 2}, 0, 0));
    ok = max_abs_diff(y.value().span<float>(), rows(y_all.value(), 3 * rank, 3)) < 1e-5;
  } else {
    ok = error_from([&] {
           static_cast<void>(sync.forward(pattern({3, 2}, 0, 0)));
         }).first == ErrorCode::InvalidArgument;
  }
  CHECK(all_ranks(ok));
  remove_process_set(pair);
}

TEST_CASE("SyncBatchNorm layers are named by their first training forward, not by creation",
          "[sync_batch_norm][process_set]") {
  // Rank 0 makes synchronized layers the others do not make, and with 3 ranks or more ranks 0
  // and 1 train a layer of the set {0, 1} first: neither may change the name of the layer every
  // rank then trains (Note [SyncBatchNorm names] in src/nn/parallel/sync_batch_norm_op.h).
  // Numbered in creation order, the names differed and its forward stalled: a short stall
  // timeout (read by init(), set alike on every rank) makes that a Stalled error, not a wait.
  ShortStallSession session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  std::vector<std::shared_ptr<nn::Module>> only_on_rank_0;
  if (rank == 0) {
    auto evaluated = std::make_shared<nn::SyncBatchNorm>(2);
    evaluated->train(false);
    static_cast<void>(evaluated->forward(pattern({4, 2}, 0, 0)));  // No collective.
    only_on_rank_0 = {std::make_shared<nn::SyncBatchNorm>(2), evaluated,
                      nn::convert_sync_batchnorm(std::make_shared<nn::BatchNorm1d>(2))};
  }
  bool ok = true;
  std::string log;
  const auto checked = [&](auto&& body) {
    try {
      body();
    } catch (const Error& e) {
      ok = false;
      log += std::string(" ") + e.what();
    }
  };
  if (size >= 3) {  // The same on every rank.
    const ProcessSet pair = add_process_set({0, 1});
    nn::SyncBatchNorm pair_layer(2, pair);
    nn::BatchNorm1d plain(2);
    if (rank <= 1) {  // Rows 3r .. 3r + 2 of a batch of 6.
      checked([&] {
        const nn::Variable y = pair_layer.forward(pattern({3, 2}, 3 * rank, 0));
        const nn::Variable y_all = plain.forward(pattern({6, 2}, 0, 0));
        const double diff = max_abs_diff(y.value().span<float>(), rows(y_all.value(), 3 * rank, 3));
        ok = ok && diff < 1e-5;
        log += " pair: " + std::to_string(diff);
      });
    }
    remove_process_set(pair);
  }
  const UnevenShard part = uneven_shard(rank, size);
  nn::SyncBatchNorm sync(2);
  nn::BatchNorm1d plain(2);
  checked([&] {
    nn::Variable x(pattern({part.mine, 2}, part.first, 1), true);
    nn::Variable x_all(pattern({part.total, 2}, 0, 1), true);
    const nn::Variable y = sync.forward(x);
    const nn::Variable y_all = plain.forward(x_all);
    nn::sum(y * nn::Variable(pattern({part.mine, 2}, part.first, 7.0))).backward();
    nn::sum(y_all * nn::Variable(pattern({part.total, 2}, 0, 7.0))).backward();
    const double y_diff =
        max_abs_diff(y.value().span<float>(), rows(y_all.value(), part.first, part.mine));
    const double grad_diff =
        max_abs_diff(x.grad().span<float>(), rows(x_all.grad(), part.first, part.mine));
    ok = ok && y_diff < 1e-5 && grad_diff < 1e-5;
    log += " global: " + std::to_string(y_diff) + ", gradient " + std::to_string(grad_diff);
  });
  INFO("rank " << rank << ", max |value - oracle| or the error:" << log);
  CHECK(all_ranks(ok));
}

}  // namespace
}  // namespace tutti::test

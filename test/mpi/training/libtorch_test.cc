// SPDX-License-Identifier: Apache-2.0
// The LibTorch adapter at 1-4 ranks against single-process oracles computed on every rank
// with plain LibTorch: N ranks on shards of a batch must end where one process on the whole
// batch ends. Every check after a collective is CHECK(all_ranks(...)) (Note [Collective
// assertions] in test/support/mpi_test_util.h). One translation unit: Torch's headers are slow.
#include "tutti/libtorch.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/mpi/training/elastic_dir.h"
#include "test/mpi/training/training_test_util.h"
#include "test/support/capture_stderr.h"
#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "tutti/elastic.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

using libtorch::DistributedOptimizer;
using optim::DistributedOptions;
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

constexpr std::int64_t kBatch = 12;  // Divisible by 1, 2, 3 and 4 ranks.

torch::nn::Sequential make_mlp(torch::Dtype dtype) {
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  model->to(dtype);
  return model;
}

torch::nn::Sequential make_cnn(torch::Dtype dtype) {
  torch::manual_seed(2);
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)),
                              torch::nn::ReLU(), torch::nn::Flatten(),
                              torch::nn::Linear(4 * 4 * 4, 3));
  model->to(dtype);
  return model;
}

struct Batch {
  torch::Tensor x;
  torch::Tensor y;
};

// The whole batch of step `step`, identical on every rank.
Batch whole_batch(const std::vector<std::int64_t>& sample_shape, torch::Dtype dtype, int step) {
  torch::manual_seed(100 + step);
  std::vector<std::int64_t> shape{kBatch};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  return {torch::randn(shape).to(dtype), torch::randint(0, 3, {kBatch}, torch::kLong)};
}

// This rank's shard of `batch`.
Batch shard(const Batch& batch) {
  const std::int64_t per_rank = kBatch / world_size();
  const std::int64_t begin = per_rank * world_rank();
  return {batch.x.slice(0, begin, begin + per_rank), batch.y.slice(0, begin, begin + per_rank)};
}

torch::Tensor loss_of(torch::nn::Sequential& model, const Batch& batch) {
  return torch::nn::functional::cross_entropy(model->forward(batch.x), batch.y);
}

double max_difference(torch::nn::Sequential& a, torch::nn::Sequential& b) {
  double worst = 0;
  const std::vector<torch::Tensor> pa = a->parameters();
  const std::vector<torch::Tensor> pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return worst;
}

OptimizerFactory sgd_momentum() {
  return [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(std::move(p),
                                               torch::optim::SGDOptions(0.1).momentum(0.9));
  };
}

OptimizerFactory sgd_nesterov() {
  return [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(
        std::move(p), torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  };
}

OptimizerFactory adam() {
  return [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(std::move(p), torch::optim::AdamOptions(0.01));
  };
}

// Trains a reference on whole batches and a distributed copy on shards for `steps` steps and
// returns the largest parameter difference. `passes` micro-batches per step are accumulated
// (backward_passes_per_step on the distributed side, plain accumulation on the reference).
double train_both(const std::function<torch::nn::Sequential()>& make,
                  const std::vector<std::int64_t>& sample_shape, torch::Dtype dtype,
                  const OptimizerFactory& make_optimizer, DistributedOptions options, int steps = 3,
                  int passes = 1, torch::Device device = torch::kCPU) {
  torch::nn::Sequential reference = make();
  torch::nn::Sequential model = make();
  reference->to(device);
  model->to(device);
  std::unique_ptr<torch::optim::Optimizer> reference_opt = make_optimizer(reference->parameters());
  std::unique_ptr<torch::optim::Optimizer> inner = make_optimizer(model->parameters());
  options.backward_passes_per_step = passes;
  DistributedOptimizer opt(*inner, model->named_parameters(), options);
  for (int step = 0; step < steps; ++step) {
    reference_opt->zero_grad();
    opt.zero_grad();
    for (int pass = 0; pass < passes; ++pass) {
      const Batch host = whole_batch(sample_shape, dtype, step * passes + pass);
      const Batch batch{host.x.to(device), host.y.to(device)};
      loss_of(reference, batch).backward();
      loss_of(model, shard(batch)).backward();
    }
    reference_opt->step();
    opt.step();
  }
  return max_difference(reference, model);
}

TEST_CASE("LibTorch: N ranks on shards equal one process on the whole batch (MLP, CNN)",
          "[libtorch]") {
  Session session;
  const auto mlp = [] { return make_mlp(torch::kFloat64); };
  const auto cnn = [] { return make_cnn(torch::kFloat64); };
  for (const OptimizerFactory& factory : {sgd_momentum(), sgd_nesterov(), adam()}) {
    CHECK(all_ranks(train_both(mlp, {6}, torch::kFloat64, factory, {}) < 1e-5));
    CHECK(all_ranks(train_both(cnn, {1, 6, 6}, torch::kFloat64, factory, {}) < 1e-5));
  }
  // Groups, predivision and Sum (with a loss scaled to make Sum an average) follow the same
  // path through other options.
  DistributedOptions grouped;
  grouped.num_groups = 2;
  CHECK(all_ranks(train_both(mlp, {6}, torch::kFloat64, sgd_momentum(), grouped) < 1e-5));
  DistributedOptions named;
  named.groups = {{"0.weight", "3.bias"}};
  CHECK(all_ranks(train_both(cnn, {1, 6, 6}, torch::kFloat64, adam(), named) < 1e-5));
  DistributedOptions predivide;
  predivide.gradient_predivide_factor = 2.0;
  CHECK(all_ranks(train_both(mlp, {6}, torch::kFloat64, sgd_nesterov(), predivide) < 1e-5));
}

// Issue 23: on a GPU the hooks fire when backward enqueues a gradient's kernels; the adapter
// hands LibTorch's current stream to Tutti, which waits for it on the device. Ranks share
// the machine's GPUs (cuda:(local_rank % GPUs)), so two ranks on one GPU reduce through host
// staging, and every rank must end where one process on the whole batch ends. Runs only where
// LibTorch has CUDA and sees a GPU and Tutti is built with CUDA (a GPU machine; see README
// "GPUs"); elsewhere it says so and checks nothing.
TEST_CASE("LibTorch on CUDA: N ranks on shards equal one process after 20 steps",
          "[libtorch][cuda]") {
  const bool runs = all_ranks(torch::cuda::is_available() && tutti::cuda_built());
  if (!runs) {
    WARN("skipped: needs a LibTorch with CUDA, a visible GPU and a Tutti built with CUDA");
    return;
  }
  Session session;
  const torch::Device device(
      torch::kCUDA, static_cast<c10::DeviceIndex>(tutti::local_rank() %
                                                  static_cast<int>(torch::cuda::device_count())));
  const auto cnn = [] { return make_cnn(torch::kFloat64); };
  CHECK(all_ranks(train_both(cnn, {1, 6, 6}, torch::kFloat64, sgd_momentum(), {}, 20, 1, device) <
                  1e-5));
  DistributedOptions grouped;
  grouped.num_groups = 2;
  const auto mlp = [] { return make_mlp(torch::kFloat64); };
  CHECK(all_ranks(train_both(mlp, {6}, torch::kFloat64, adam(), grouped, 20, 1, device) < 1e-5));
}

TEST_CASE("LibTorch: FP16 and BF16 compression stay close to the whole batch", "[libtorch]") {
  Session session;
  const auto mlp = [] { return make_mlp(torch::kFloat32); };
  for (const Compression compression : {Compression::FP16, Compression::BF16}) {
    DistributedOptions options;
    options.compression = compression;
    CHECK(all_ranks(train_both(mlp, {6}, torch::kFloat32, sgd_momentum(), options) < 1e-2));
  }
}

TEST_CASE("LibTorch: backward_passes_per_step = 3 equals local accumulation", "[libtorch]") {
  Session session;
  const auto mlp = [] { return make_mlp(torch::kFloat64); };
  CHECK(all_ranks(train_both(mlp, {6}, torch::kFloat64, sgd_momentum(), {}, 2, 3) < 1e-5));

  // A fourth pass before step() is refused from backward().
  torch::nn::Sequential model = make_mlp(torch::kFloat64);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  DistributedOptions options;
  options.backward_passes_per_step = 3;
  DistributedOptimizer opt(sgd, model->named_parameters(), options);
  const Batch batch = shard(whole_batch({6}, torch::kFloat64, 0));
  for (int pass = 0; pass < 3; ++pass) loss_of(model, batch).backward();
  std::string message;
  bool refused = false;
  try {
    loss_of(model, batch).backward();
  } catch (const std::exception& e) {
    refused = true;
    message = e.what();
  }
  CHECK(refused);
  CHECK(message.find("backward_passes_per_step is 3") != std::string::npos);
  opt.step();
}

TEST_CASE("LibTorch: the hooks start reductions mid-backward", "[libtorch]") {
  Session session;
  // Where the job's default is one gradient group (TUTTI_GRADIENT_GROUPING; meson runs this
  // binary with =each too), one grouped reduction starts once the last gradient is ready.
  const bool one_group = tutti::default_gradient_groups() == 1;
  torch::nn::Sequential model = make_mlp(torch::kFloat64);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  DistributedOptimizer opt(sgd, model->named_parameters());
  // The first layer's weight is accumulated after the last layer's gradients; a post hook
  // registered after the optimizer's runs after it.
  int started_then = -1;
  torch::autograd::impl::grad_accumulator(model->parameters()[0])
      ->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [&](const torch::autograd::variable_list& outputs,
              const torch::autograd::variable_list&) {
            started_then = opt.reductions_started();
            return outputs;
          }));
  loss_of(model, shard(whole_batch({6}, torch::kFloat64, 0))).backward();
  if (one_group) {
    CHECK(started_then <= 1);
    CHECK(opt.reductions_started() == 1);
  } else {
    CHECK(started_then >= 3);  // Both of layer 2's and layer 1's weight.
    CHECK(opt.reductions_started() == 4);
  }
  opt.step();
  CHECK(opt.reductions_started() == 0);
}

TEST_CASE("LibTorch: backward_failed() after a backward() that threw keeps the ranks on one step",
          "[libtorch][errors]") {
  // y = w2 (w1 x) with w1 = 1, w2 = 2 and lr 0: on rank r at step s, with x = 100 (r + 1) + 10 s,
  // w2's gradient is x and w1's 2x. Rank 0's backward() of step 1 throws in a tensor hook: on y's
  // gradient, before any parameter's hook ran, or on h = w1 x's, after w2's gradient was
  // accumulated (torch runs AccumulateGrad nodes first). Before backward_failed(), rank 0 went on
  // with zero_grad() and its step 2 paired with the others' step 1 (hook on y), or that
  // zero_grad() was refused with w2's reduction in flight (hook on h, a unit per gradient).
  Session session;
  const bool before_any_hook = GENERATE(true, false);
  const int rank = world_rank();
  const int size = world_size();
  const auto x = [](int r, std::int64_t s) {
    return 100.0 * (r + 1) + 10.0 * static_cast<double>(s);
  };
  torch::Tensor w1 = torch::ones({1}, torch::kFloat64).requires_grad_();
  torch::Tensor w2 = torch::full({1}, 2.0, torch::kFloat64).requires_grad_();
  torch::OrderedDict<std::string, torch::Tensor> named;
  named.insert("w1", w1);
  named.insert("w2", w2);
  torch::optim::SGD sgd({w1, w2}, 0.0);
  DistributedOptimizer opt(sgd, named);
  bool ok = true;
  std::string log;
  for (std::int64_t step = 0; step < 4; ++step) {
    ok = ok && !error_of([&] { opt.zero_grad(); }).has_value();
    const bool fails = step == 1 && rank == 0;
    const torch::Tensor input = torch::full({1}, x(rank, step), torch::kFloat64);
    const torch::Tensor h = w1 * input;
    const torch::Tensor y = w2 * h;
    if (fails) {
      torch::Tensor at = before_any_hook ? y : h;
      at.register_hook([](const torch::Tensor&) -> torch::Tensor {
        throw std::runtime_error("the test's hook: a NaN");
      });
    }
    bool threw = false;
    try {
      y.sum().backward();
    } catch (const std::exception&) {
      threw = true;
    }
    if (fails) {
      opt.backward_failed();
      std::string message;
      const bool refused = error_of([&] { opt.step(); }, &message) == ErrorCode::InvalidArgument;
      ok = ok && threw && refused && message.find("skips the step") != std::string::npos;
      log += " rank 0 at step 1: " + message;
      continue;
    }
    std::string message;
    ok = ok && !threw && !error_of([&] { opt.step(); }, &message).has_value();
    // At step 1 the others average what rank 0's grad() held: w2's gradient when the hook on h
    // threw after it was accumulated, zeros otherwise.
    double w1_sum = 0, w2_sum = 0;
    for (int r = 0; r < size; ++r) {
      const bool zero = step == 1 && r == 0;
      w1_sum += zero ? 0.0 : 2 * x(r, step);
      w2_sum += zero && before_any_hook ? 0.0 : x(r, step);
    }
    const double got1 = w1.grad().item<double>();
    const double got2 = w2.grad().item<double>();
    const bool right =
        std::abs(got1 - w1_sum / size) < 1e-9 && std::abs(got2 - w2_sum / size) < 1e-9;
    ok = ok && right;
    if (!right || !message.empty()) {
      log += " step " + std::to_string(step) + ": " + std::to_string(got1) + ", " +
             std::to_string(got2) + " " + message;
    }
  }
  INFO("before_any_hook " << before_any_hook << log);
  CHECK(all_ranks(ok));
}

TEST_CASE("LibTorch: clipping through synchronize() and skip_synchronize(); the one warning",
          "[libtorch]") {
  Session session;
  torch::nn::Sequential reference = make_mlp(torch::kFloat64);
  torch::nn::Sequential model = make_mlp(torch::kFloat64);
  torch::optim::SGD reference_opt(reference->parameters(), 0.5);
  torch::optim::SGD sgd(model->parameters(), 0.5);
  DistributedOptimizer opt(sgd, model->named_parameters());
  for (int step = 0; step < 3; ++step) {
    const Batch batch = whole_batch({6}, torch::kFloat64, step);
    reference_opt.zero_grad();
    loss_of(reference, batch).backward();
    torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.05);
    reference_opt.step();
    opt.zero_grad();
    loss_of(model, shard(batch)).backward();
    opt.synchronize();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 0.05);
    auto guard = opt.skip_synchronize();
    opt.step();
  }
  CHECK(all_ranks(max_difference(reference, model) < 1e-5));

  CaptureStderr capture;
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    loss_of(model, shard(whole_batch({6}, torch::kFloat64, step))).backward();
    opt.synchronize();
    opt.step();  // Without the guard: warned once.
  }
  const std::string text = capture.text();
  std::size_t count = 0;
  for (std::size_t at = text.find("without skip_synchronize"); at != std::string::npos;
       at = text.find("without skip_synchronize", at + 1)) {
    ++count;
  }
  CHECK(all_ranks(count == 1));
}

TEST_CASE("LibTorch: skip_synchronize() without synchronize() applies what the hooks reduced",
          "[libtorch]") {
  // As optim::DistributedOptimizer (Note [Reduction rounds]): step() waits for the reductions
  // the hooks started and applies them, compressed ones too; before the two shared one engine,
  // the LibTorch copy dropped compressed results and stepped with this rank's own gradients.
  Session session;
  torch::nn::Sequential reference = make_mlp(torch::kFloat64);
  torch::nn::Sequential model = make_mlp(torch::kFloat64);
  torch::optim::SGD reference_opt(reference->parameters(), 0.5);
  torch::optim::SGD sgd(model->parameters(), 0.5);
  DistributedOptions options;
  options.compression = Compression::FP16;
  DistributedOptimizer opt(sgd, model->named_parameters(), options);
  const Batch batch = whole_batch({6}, torch::kFloat64, 0);
  reference_opt.zero_grad();
  loss_of(reference, batch).backward();
  reference_opt.step();
  opt.zero_grad();
  loss_of(model, shard(batch)).backward();
  {
    auto guard = opt.skip_synchronize();
    opt.step();
  }
  // FP16 rounds each gradient to ~1e-3 of itself; one rank's own gradient is ~1e-1 away.
  CHECK(all_ranks(max_difference(reference, model) < 1e-3));
}

TEST_CASE("LibTorch: a parameter without a gradient gets zeros and contributes zeros",
          "[libtorch]") {
  Session session;
  torch::manual_seed(3);
  torch::nn::Linear used(4, 2);
  torch::nn::Linear rank0_only(4, 2);
  used->to(torch::kFloat64);
  rank0_only->to(torch::kFloat64);
  torch::OrderedDict<std::string, torch::Tensor> named;
  for (const auto& item : used->named_parameters())
    named.insert("used." + item.key(), item.value());
  for (const auto& item : rank0_only->named_parameters()) {
    named.insert("rank0_only." + item.key(), item.value());
  }
  torch::optim::SGD sgd(named.values(), 0.1);
  DistributedOptimizer opt(sgd, named);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({3, 4}, torch::kFloat64);
  torch::Tensor loss = used->forward(x).sum();
  if (world_rank() == 0) loss = loss + rank0_only->forward(x).pow(2).sum();
  // Rank 0's gradient of rank0_only, computed here without the hooks' module.
  const torch::Tensor w = rank0_only->weight.detach().clone().requires_grad_(true);
  const torch::Tensor b = rank0_only->bias.detach().clone().requires_grad_(true);
  torch::nn::functional::linear(x, w, b).pow(2).sum().backward();
  loss.backward();
  opt.synchronize();
  const bool defined = rank0_only->weight.grad().defined() && rank0_only->bias.grad().defined();
  bool ok = defined;
  if (defined) {
    ok = torch::allclose(rank0_only->weight.grad(), w.grad() / world_size(), 1e-9, 1e-12) &&
         torch::allclose(rank0_only->bias.grad(), b.grad() / world_size(), 1e-9, 1e-12);
  }
  CHECK(all_ranks(ok));
  auto guard = opt.skip_synchronize();
  opt.step();
}

TEST_CASE("LibTorch: broadcast_optimizer_state equalizes state and hyper-parameters",
          "[libtorch]") {
  Session session;
  using Make =
      std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>, double)>;
  const std::vector<std::pair<std::string, Make>> optimizers = {
      {"SGD",
       [](std::vector<torch::Tensor> p, double lr) {
         return std::make_unique<torch::optim::SGD>(std::move(p),
                                                    torch::optim::SGDOptions(lr).momentum(0.9));
       }},
      {"Adam",
       [](std::vector<torch::Tensor> p, double lr) {
         return std::make_unique<torch::optim::Adam>(std::move(p), torch::optim::AdamOptions(lr));
       }},
      {"AdamW",
       [](std::vector<torch::Tensor> p, double lr) {
         return std::make_unique<torch::optim::AdamW>(std::move(p), torch::optim::AdamWOptions(lr));
       }},
      {"RMSprop",
       [](std::vector<torch::Tensor> p, double lr) {
         return std::make_unique<torch::optim::RMSprop>(
             std::move(p), torch::optim::RMSpropOptions(lr).momentum(0.5));
       }},
      {"Adagrad",
       [](std::vector<torch::Tensor> p, double lr) {
         return std::make_unique<torch::optim::Adagrad>(std::move(p),
                                                        torch::optim::AdagradOptions(lr));
       }},
  };
  for (const auto& [name, make] : optimizers) {
    for (const int steps_before : {0, 2}) {
      INFO(name << " after " << steps_before << " steps");
      torch::nn::Sequential model = make_mlp(torch::kFloat64);
      // Every rank starts elsewhere, with its own learning rate and its own history.
      torch::manual_seed(50 + world_rank());
      {
        torch::NoGradGuard no_grad;
        for (torch::Tensor& p : model->parameters()) p.add_(torch::randn_like(p));
      }
      const double lr = 0.01 * (world_rank() + 1);
      std::unique_ptr<torch::optim::Optimizer> opt = make(model->parameters(), lr);
      for (int step = 0; step < steps_before; ++step) {
        opt->zero_grad();
        loss_of(model, whole_batch({6}, torch::kFloat64, world_rank() * 10 + step)).backward();
        opt->step();
      }
      libtorch::broadcast_parameters(model->named_parameters(), 0);
      libtorch::broadcast_optimizer_state(*opt, 0);
      bool ok = opt->param_groups()[0].options().get_lr() == 0.01;
      // Equal state: one more identical step leaves identical parameters.
      opt->zero_grad();
      loss_of(model, whole_batch({6}, torch::kFloat64, 99)).backward();
      opt->step();
      for (const torch::Tensor& p : model->parameters()) {
        torch::Tensor root = p.detach().clone();
        tutti::broadcast(libtorch::view(root), 0, "libtorch_test.check." + name);
        ok = ok && torch::equal(root, p.detach());
      }
      CHECK(all_ranks(ok));
    }
  }
}

TEST_CASE("issue 24: LibTorch over a set whose ranks differ from the global ones, global roots",
          "[libtorch][process_set]") {
  if (world_size() < 3) return;
  Session session;
  const int me = world_rank();
  // {1, n - 1}: global rank 1 is set rank 0 and global rank n - 1 set rank 1, so a set rank
  // taken for a global one names the wrong root, or none.
  const ProcessSet set = add_process_set({1, world_size() - 1});
  bool ok = true;
  for (const int root : set.ranks()) {
    torch::nn::Sequential model = make_mlp(torch::kFloat64);
    torch::manual_seed(70 + me);
    {
      torch::NoGradGuard no_grad;
      for (torch::Tensor& p : model->parameters()) p.add_(torch::randn_like(p));
    }
    auto opt = std::make_unique<torch::optim::Adam>(model->parameters(),
                                                    torch::optim::AdamOptions(0.01 * (me + 1)));
    opt->zero_grad();
    loss_of(model, whole_batch({6}, torch::kFloat64, me)).backward();
    opt->step();  // Rank-dependent moments.
    if (!set.included()) continue;
    libtorch::broadcast_parameters(model->named_parameters(), root, set);
    libtorch::broadcast_optimizer_state(*opt, root, set);
    ok = ok && opt->param_groups()[0].options().get_lr() == 0.01 * (root + 1);
    // Equal parameters and state: one more identical step leaves identical parameters, equal
    // to the root's (compared over the set).
    opt->zero_grad();
    loss_of(model, whole_batch({6}, torch::kFloat64, 99)).backward();
    opt->step();
    for (const torch::Tensor& p : model->parameters()) {
      torch::Tensor from_root = p.detach().clone();
      tutti::broadcast(libtorch::view(from_root), root, "issue_24.check", set);
      ok = ok && torch::equal(from_root, p.detach());
    }
  }
  CHECK(all_ranks(ok));
  barrier();
  remove_process_set(set);
}

// An MLP with BatchNorm (so that the module has buffers) and Adam, after `steps` steps of its
// own on the whole batches `first`, `first` + 1, ... (the same on every rank for one `first`).
struct TorchLoop {
  torch::nn::Sequential model;
  torch::optim::Adam adam;

  explicit TorchLoop(int hidden = 8, int steps = 2, int first = 0)
      : model(make_model(hidden)), adam(model->parameters(), torch::optim::AdamOptions(0.01)) {
    for (int step = 0; step < steps; ++step) train(first + step);
  }
  static torch::nn::Sequential make_model(int hidden) {
    torch::manual_seed(3);
    torch::nn::Sequential m(torch::nn::Linear(6, hidden), torch::nn::BatchNorm1d(hidden),
                            torch::nn::Tanh(), torch::nn::Linear(hidden, 3));
    m->to(torch::kFloat64);
    return m;
  }
  void train(int batch) {
    adam.zero_grad();
    loss_of(model, whole_batch({6}, torch::kFloat64, batch)).backward();
    adam.step();
  }
  // Copies of the parameters, then the buffers.
  std::vector<torch::Tensor> tensors() const {
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& t : model->parameters()) out.push_back(t.detach().clone());
    for (const torch::Tensor& t : model->buffers()) out.push_back(t.detach().clone());
    return out;
  }
  // Adam's moments and step counts, parameter by parameter.
  std::vector<torch::Tensor> moments() const {
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& p : model->parameters()) {
      const auto& state = static_cast<const torch::optim::AdamParamState&>(
          *adam.state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
      out.push_back(state.exp_avg().clone());
      out.push_back(state.exp_avg_sq().clone());
      out.push_back(torch::tensor(state.step()));
    }
    return out;
  }
  void add_to(elastic::State& state) {
    state.add("model", libtorch::stateful(*model));
    state.add("adam", libtorch::stateful(adam));
  }
};

bool equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

TEST_CASE("LibTorch: stateful() commits a model and its optimizer; restore() loads them in place",
          "[libtorch][elastic]") {
  Session session;
  ElasticDir dir;
  std::vector<torch::Tensor> committed;
  std::vector<torch::Tensor> after_one_step;  // The committed state, then one step on batch 99.
  {
    TorchLoop loop;
    elastic::State state;
    loop.add_to(state);
    state.commit();
    committed = loop.tensors();
    loop.train(99);
    after_one_step = loop.tensors();
  }
  // A relaunch: another history, another learning rate.
  TorchLoop loop(8, 3, 10 + world_rank());
  loop.adam.param_groups()[0].options().set_lr(0.5);
  std::vector<void*> storage;
  for (const torch::Tensor& t : loop.model->parameters()) storage.push_back(t.data_ptr());
  elastic::State state;
  loop.add_to(state);
  CHECK(all_ranks(state.restore()));
  CHECK(all_ranks(equal(loop.tensors(), committed)));
  CHECK(all_ranks(loop.adam.param_groups()[0].options().get_lr() == 0.01));
  bool in_place = true;
  for (std::size_t i = 0; i < storage.size(); ++i)
    in_place = in_place && loop.model->parameters()[i].data_ptr() == storage[i];
  CHECK(all_ranks(in_place));
  // Adam's moments and step counts came back too: the next step is the committed state's.
  loop.train(99);
  CHECK(all_ranks(equal(loop.tensors(), after_one_step)));
}

TEST_CASE("LibTorch: a commit the model or the optimizer does not fit is refused, changing nothing",
          "[libtorch][elastic]") {
  Session session;
  ElasticDir dir;
  {
    TorchLoop loop;
    elastic::State state;
    loop.add_to(state);
    state.commit();
  }
  std::string message;
  SECTION("a wider hidden layer") {
    TorchLoop loop(9, 1, 5);
    const std::vector<torch::Tensor> tensors = loop.tensors();
    const std::vector<torch::Tensor> moments = loop.moments();
    elastic::State state;
    loop.add_to(state);
    CHECK(all_ranks(error_of([&] { state.restore(); }, &message) == ErrorCode::InvalidArgument));
    CHECK(all_ranks(message.find("'model' refused its bytes: '0.weight' is float64 [8, 6] in the "
                                 "commit, float64 [9, 6] in the module") != std::string::npos));
    CHECK(all_ranks(equal(loop.tensors(), tensors) && equal(loop.moments(), moments)));
  }
  SECTION("an optimizer over fewer parameters") {
    // LibTorch's load throws after this rank's state was cleared: it is put back.
    TorchLoop loop(8, 1, 5);
    std::vector<torch::Tensor> first = loop.model->parameters();
    first.pop_back();
    torch::optim::Adam fewer(first, torch::optim::AdamOptions(0.02));
    fewer.zero_grad();
    loss_of(loop.model, whole_batch({6}, torch::kFloat64, 5)).backward();
    fewer.step();
    const std::size_t entries = fewer.state().size();
    const std::vector<torch::Tensor> tensors = loop.tensors();
    elastic::State state;
    state.add("model", libtorch::stateful(*loop.model));
    state.add("adam", libtorch::stateful(fewer));
    CHECK(all_ranks(error_of([&] { state.restore(); }, &message) == ErrorCode::InvalidArgument));
    INFO(message);
    CHECK(
        all_ranks(message.find("'adam' refused its bytes: loaded state dict contains a "
                               "parameter group that has a different size") != std::string::npos));
    CHECK(all_ranks(message.find("frame #") == std::string::npos));  // Not LibTorch's stack.
    CHECK(all_ranks(fewer.state().size() == entries && entries == first.size()));
    CHECK(all_ranks(equal(loop.tensors(), tensors)));
    CHECK(all_ranks(fewer.param_groups()[0].options().get_lr() == 0.02));
  }
}

TEST_CASE("LibTorch: sync() gives every rank the root's model and optimizer",
          "[libtorch][elastic]") {
  Session session;
  const int root = world_size() - 1;
  TorchLoop loop(8, 2, 20 + world_rank());  // Rank-dependent values and moments.
  loop.adam.param_groups()[0].options().set_lr(0.01 * (world_rank() + 1));
  elastic::State state;
  loop.add_to(state);
  state.sync(root);
  std::vector<double> values;
  for (const std::vector<torch::Tensor>& list : {loop.tensors(), loop.moments()}) {
    for (const torch::Tensor& t : list) {
      const torch::Tensor flat = t.to(torch::kFloat64).flatten().contiguous();
      values.insert(values.end(), flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
    }
  }
  values.push_back(loop.adam.param_groups()[0].options().get_lr());
  CHECK(same_as_root(values, root));
  CHECK(all_ranks(loop.adam.param_groups()[0].options().get_lr() == 0.01 * (root + 1)));
}

TEST_CASE("LibTorch: view, to_torch and broadcast_parameters of parameters and buffers",
          "[libtorch]") {
  Session session;
  torch::Tensor t = torch::full({2, 3}, static_cast<double>(world_rank()), torch::kFloat64);
  tutti::allreduce(libtorch::view(t), "libtorch_test.view", {.op = ReduceOp::Sum});
  const double expected = world_size() * (world_size() - 1) / 2.0;
  CHECK(all_ranks(torch::all(t == expected).item<bool>()));

  Tensor owned(DataType::Int32, {4});
  torch::Tensor shared = libtorch::to_torch(owned);
  shared.fill_(7);
  CHECK(owned.span<std::int32_t>()[3] == 7);
  CHECK(libtorch::to_torch(Tensor(DataType::Float16, {2})).scalar_type() == torch::kFloat16);
  CHECK(libtorch::view(torch::ones({2}, torch::kBFloat16)).dtype() == DataType::BFloat16);

  torch::manual_seed(20 + world_rank());
  torch::nn::Sequential model(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  model->forward(torch::randn({5, 3}));  // Rank-dependent running statistics.
  torch::manual_seed(20);
  torch::nn::Sequential root(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  root->forward(torch::randn({5, 3}));
  libtorch::broadcast_parameters(model->named_parameters(), 0);
  libtorch::broadcast_parameters(model->named_buffers(), 0);
  bool ok = true;
  for (const auto& item : root->named_parameters()) {
    ok = ok && torch::equal(item.value(), model->named_parameters()[item.key()]);
  }
  for (const auto& item : root->named_buffers()) {
    ok = ok && torch::equal(item.value(), model->named_buffers()[item.key()]);
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("LibTorch: bad inputs are InvalidArgument naming the problem", "[libtorch]") {
  Session session;
  std::string message;
  CHECK(error_of(
            [] {
              libtorch::view(torch::ones({3, 4}).t());
            },
            &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("non-contiguous") != std::string::npos);
  CHECK(error_of([] { libtorch::view(torch::ones({2}, torch::kComplexFloat)); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("ComplexFloat") != std::string::npos);
  CHECK(error_of([] { libtorch::to_torch(Tensor(DataType::UInt16, {2})); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("uint16") != std::string::npos);

  torch::nn::Sequential model = make_mlp(torch::kFloat32);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  DistributedOptions duplicate;
  duplicate.groups = {{"0.weight", "2.weight"}, {"0.weight"}};
  CHECK(error_of([&] { DistributedOptimizer(sgd, model->named_parameters(), duplicate); },
                 &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("'0.weight' appears more than once") != std::string::npos);
  DistributedOptions unknown;
  unknown.groups = {{"nope"}};
  CHECK(error_of([&] { DistributedOptimizer(sgd, model->named_parameters(), unknown); },
                 &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("'nope'") != std::string::npos);
  torch::nn::Sequential partly_frozen = make_mlp(torch::kFloat32);
  partly_frozen->named_parameters()["2.bias"].set_requires_grad(false);
  torch::optim::SGD frozen_sgd(partly_frozen->parameters(), 0.1);
  DistributedOptions with_frozen;
  with_frozen.groups = {{"0.weight", "2.bias"}};
  CHECK(
      error_of(
          [&] { DistributedOptimizer(frozen_sgd, partly_frozen->named_parameters(), with_frozen); },
          &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("names '2.bias', a frozen parameter") != std::string::npos);
  torch::OrderedDict<std::string, torch::Tensor> partial;
  partial.insert("only", model->parameters()[0]);
  CHECK(error_of([&] { DistributedOptimizer(sgd, partial); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("has no name") != std::string::npos);
  DistributedOptions bad_k;
  bad_k.backward_passes_per_step = 0;
  CHECK(error_of([&] { DistributedOptimizer(sgd, model->named_parameters(), bad_k); }) ==
        ErrorCode::InvalidArgument);
  torch::OrderedDict<std::string, torch::Tensor> strided;
  strided.insert("t", torch::ones({3, 4}).t());
  CHECK(error_of([&] { libtorch::broadcast_parameters(strided, 0); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("'t'") != std::string::npos);
}

}  // namespace
}  // namespace tutti::test

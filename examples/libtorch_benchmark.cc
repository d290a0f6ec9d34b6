// SPDX-License-Identifier: Apache-2.0
// P9 of DESIGN.md section 6: a LibTorch ResNet-style model's training step (zero_grad, forward,
// backward, step) timed three ways in one binary, same model, same data:
//   tutti           libtorch::DistributedOptimizer (allreduces start from the hooks,
//                   overlapping backward)
//   nocomm          the plain optimizer, no communication
//   after_backward  backward first, then one grouped allreduce of every gradient, then step
// Prints the mean step times in ms, the scaling efficiency nocomm/tutti, and ends with
//   P9 tutti_ms=<x> nocomm_ms=<y> after_backward_ms=<z>
// Target: tutti_ms <= after_backward_ms (the overlap hides at least the raw reduce cost).
//
// Usage: scripts/tuttirun -np 2 build/examples/libtorch_benchmark [--batch-size B]
//            [--channels C] [--blocks N] [--warmup W] [--iters I]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tutti/libtorch.h"
#include "tutti/tutti.h"

namespace {

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(std::int64_t channels)
      : conv1(register_module(
            "conv1", torch::nn::Conv2d(
                         torch::nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(channels))),
        conv2(register_module(
            "conv2", torch::nn::Conv2d(
                         torch::nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(channels))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    return torch::relu(x + bn2(conv2(y)));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
};
TORCH_MODULE(Block);

struct ResNetImpl : torch::nn::Module {
  ResNetImpl(std::int64_t channels, int blocks)
      : stem(register_module(
            "stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, channels, 3).padding(1)))),
        head(register_module("head", torch::nn::Linear(channels, 10))) {
    for (int b = 0; b < blocks; ++b) body->push_back(Block(channels));
    register_module("body", body);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = body->forward(torch::relu(stem(x)));
    return head(torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1));
  }

  torch::nn::Conv2d stem;
  torch::nn::Sequential body;
  torch::nn::Linear head;
};
TORCH_MODULE(ResNet);

// Mean ms of `iters` calls of `step` after `warmup` calls; the ranks start each timing together.
double time_ms(const std::function<void()>& step, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) step();
  tutti::barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) step();
  tutti::barrier();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
             .count() /
         iters;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t batch_size = 16;
  std::int64_t channels = 32;
  int blocks = 4;
  int warmup = 3;
  int iters = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::stoi(argv[i + 1]);
    if (flag == "--batch-size") {
      batch_size = value;
    } else if (flag == "--channels") {
      channels = value;
    } else if (flag == "--blocks") {
      blocks = value;
    } else if (flag == "--warmup") {
      warmup = value;
    } else if (flag == "--iters") {
      iters = value;
    } else {
      std::fprintf(stderr,
                   "usage: libtorch_benchmark [--batch-size B] [--channels C] "
                   "[--blocks N] [--warmup W] [--iters I]\n");
      return 2;
    }
  }
  tutti::init();
  torch::set_num_threads(1);  // One core per rank.
  torch::manual_seed(0);
  ResNet model(channels, blocks);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  tutti::libtorch::broadcast_parameters(model->named_parameters(), 0);
  const torch::Tensor x = torch::randn({batch_size, 3, 32, 32});
  const torch::Tensor y = torch::randint(0, 10, {batch_size}, torch::kLong);
  const auto backward = [&] {
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  };

  const double nocomm_ms = time_ms(
      [&] {
        sgd.zero_grad();
        backward();
        sgd.step();
      },
      warmup, iters);

  std::vector<torch::Tensor> grads;
  const double after_backward_ms = time_ms(
      [&] {
        sgd.zero_grad();
        backward();
        std::vector<tutti::TensorView> views;
        for (const torch::Tensor& p : model->parameters())
          views.push_back(tutti::libtorch::view(p.grad()));
        tutti::grouped_allreduce(std::move(views), "libtorch_benchmark.after_backward");
        sgd.step();
      },
      warmup, iters);

  double tutti_ms = 0;
  {
    tutti::libtorch::DistributedOptimizer optimizer(sgd, model->named_parameters());
    tutti_ms = time_ms(
        [&] {
          optimizer.zero_grad();
          backward();
          optimizer.step();
        },
        warmup, iters);
  }

  if (tutti::rank() == 0) {
    std::size_t count = 0;
    for (const torch::Tensor& p : model->parameters()) count += static_cast<std::size_t>(p.numel());
    std::printf(
        "libtorch_benchmark: %d ranks, ResNet-style %d blocks x %lld channels, %zu "
        "parameters, batch %lld per rank, 32x32 inputs\n",
        tutti::size(), blocks, static_cast<long long>(channels), count,
        static_cast<long long>(batch_size));
    std::printf("scaling efficiency (nocomm / tutti): %.1f%%\n", 100.0 * nocomm_ms / tutti_ms);
    std::printf("P9 tutti_ms=%.2f nocomm_ms=%.2f after_backward_ms=%.2f\n", tutti_ms, nocomm_ms,
                after_backward_ms);
  }
  tutti::shutdown();
  return 0;
}

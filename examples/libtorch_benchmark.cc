// SPDX-License-Identifier: Apache-2.0
// P9 of DESIGN.md section 6: a LibTorch ResNet-style model's training step (zero_grad, forward,
// backward, step) timed three ways in one binary, same model, same data:
//   tutti           libtorch::DistributedOptimizer (allreduces start from the hooks,
//                   overlapping backward)
//   nocomm          the plain optimizer, no communication
//   after_backward  backward first, then one grouped allreduce of every gradient, then step
// The three are measured round after round (the order rotated each round), so that load which
// changes during the run falls on all three alike; each figure is the median over the rounds of
// a round's mean step time. Prints those, the scaling efficiency nocomm/tutti, and ends with
//   P9 tutti_ms=<x> nocomm_ms=<y> after_backward_ms=<z> rounds=<r>
// Target: tutti_ms <= after_backward_ms (the overlap hides at least the raw reduce cost).
//
// Usage: scripts/tuttirun -np 2 build/examples/libtorch_benchmark [--batch-size B]
//            [--channels C] [--blocks N] [--warmup W] [--iters I] [--rounds R] [--num-groups G]
//   --num-groups  DistributedOptions::num_groups of the tutti mode (default 0: each gradient
//                 reduced alone; 1: all in one group, started when backward has made the last)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "examples/machine_line.h"
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

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

constexpr char kUsage[] =
    "usage: libtorch_benchmark [--batch-size B] [--channels C] [--blocks N] [--warmup W]\n"
    "                          [--iters I] [--rounds R] [--num-groups G]\n"
    "                          (each a whole number, 1 to 100000; --warmup and --num-groups\n"
    "                          may be 0)\n";

struct Flags {
  std::int64_t batch_size = 16;
  std::int64_t channels = 32;
  int blocks = 4;
  int warmup = 3;
  int iters = 10;
  int rounds = 5;
  int num_groups = 0;
};

std::optional<Flags> parse_flags(int argc, char** argv) {
  Flags f;
  if (argc % 2 == 0) return std::nullopt;  // A flag without its value.
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    char* end = nullptr;
    const long value = std::strtol(argv[i + 1], &end, 10);
    if (*argv[i + 1] == '\0' || *end != '\0' || value < 0 || value > 100'000) return std::nullopt;
    const int v = static_cast<int>(value);
    if (flag == "--warmup") {
      f.warmup = v;
      continue;
    }
    if (flag == "--num-groups") {
      f.num_groups = v;
      continue;
    }
    if (v == 0) return std::nullopt;
    if (flag == "--batch-size")
      f.batch_size = v;
    else if (flag == "--channels")
      f.channels = v;
    else if (flag == "--blocks")
      f.blocks = v;
    else if (flag == "--iters")
      f.iters = v;
    else if (flag == "--rounds")
      f.rounds = v;
    else
      return std::nullopt;
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Flags> flags = parse_flags(argc, argv);
  if (!flags) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const Flags& f = *flags;
  tutti::init();
  {  // First line: the machine (CPU model, MPI library, binding), as every benchmark prints it.
    const std::string machine = tutti::examples::machine_line();
    if (tutti::rank() == 0) std::printf("%s\n", machine.c_str());
  }
  torch::set_num_threads(1);  // One core per rank.
  torch::manual_seed(0);
  ResNet model(f.channels, f.blocks);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  tutti::libtorch::broadcast_parameters(model->named_parameters(), 0);
  const torch::Tensor x = torch::randn({f.batch_size, 3, 32, 32});
  const torch::Tensor y = torch::randint(0, 10, {f.batch_size}, torch::kLong);
  const auto backward = [&] {
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  };

  const auto nocomm = [&] {
    return time_ms(
        [&] {
          sgd.zero_grad();
          backward();
          sgd.step();
        },
        f.warmup, f.iters);
  };
  const auto after_backward = [&] {
    return time_ms(
        [&] {
          sgd.zero_grad();
          backward();
          std::vector<tutti::TensorView> views;
          for (const torch::Tensor& p : model->parameters())
            views.push_back(tutti::libtorch::view(p.grad()));
          tutti::grouped_allreduce(std::move(views), "libtorch_benchmark.after_backward");
          sgd.step();
        },
        f.warmup, f.iters);
  };
  // A DistributedOptimizer per round: its hooks stay registered on the gradient accumulators
  // but do nothing once it is destroyed, so the other two modes run without communication.
  const auto overlapped = [&] {
    tutti::libtorch::DistributedOptimizer optimizer(sgd, model->named_parameters(),
                                                    {.num_groups = f.num_groups});
    return time_ms(
        [&] {
          optimizer.zero_grad();
          backward();
          optimizer.step();
        },
        f.warmup, f.iters);
  };

  const std::vector<std::function<double()>> modes = {overlapped, nocomm, after_backward};
  std::vector<std::vector<double>> times(modes.size());
  for (int round = 0; round < f.rounds; ++round) {
    for (std::size_t k = 0; k < modes.size(); ++k) {
      const std::size_t mode = (k + static_cast<std::size_t>(round)) % modes.size();
      times[mode].push_back(modes[mode]());
    }
  }
  const double tutti_ms = median(times[0]);
  const double nocomm_ms = median(times[1]);
  const double after_backward_ms = median(times[2]);

  if (tutti::rank() == 0) {
    std::size_t count = 0;
    for (const torch::Tensor& p : model->parameters()) count += static_cast<std::size_t>(p.numel());
    std::printf(
        "libtorch_benchmark: %d ranks, ResNet-style %d blocks x %lld channels, %zu "
        "parameters, batch %lld per rank, 32x32 inputs, %d rounds of %d steps, num_groups %d\n",
        tutti::size(), f.blocks, static_cast<long long>(f.channels), count,
        static_cast<long long>(f.batch_size), f.rounds, f.iters, f.num_groups);
    for (std::size_t mode = 0; mode < modes.size(); ++mode) {
      const auto [lo, hi] = std::minmax_element(times[mode].begin(), times[mode].end());
      std::printf("%-15s median %.2f ms, rounds %.2f-%.2f ms\n",
                  mode == 0   ? "tutti"
                  : mode == 1 ? "nocomm"
                              : "after_backward",
                  median(times[mode]), *lo, *hi);
    }
    std::printf("scaling efficiency (nocomm / tutti): %.1f%%\n", 100.0 * nocomm_ms / tutti_ms);
    std::printf("P9 tutti_ms=%.2f nocomm_ms=%.2f after_backward_ms=%.2f rounds=%d\n", tutti_ms,
                nocomm_ms, after_backward_ms, f.rounds);
  }
  tutti::shutdown();
  return 0;
}

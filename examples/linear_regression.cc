// SPDX-License-Identifier: Apache-2.0
// The smallest complete Tutti program: fits y = 3x + 2 (plus noise) with a 1 -> 1 Linear layer,
// each rank on its own shard of the data, gradients averaged by the DistributedOptimizer.
// Usage: scripts/tuttirun -np 2 build/examples/linear_regression
// Rank 0 prints the learned weight and bias; the exit status is 1 unless the weight is within
// 0.1 of 3 and the bias within 0.1 of 2 (the smoke test in examples/meson.build relies on it);
// 2 for any argument (it takes none; --help prints the usage).
#include <tutti/nn.h>
#include <tutti/optim.h>
#include <tutti/tutti.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

#include "examples/flag_reader.h"

constexpr char kUsage[] = "usage: linear_regression   (it takes no flags)\n";

int main(int argc, char** argv) {
  // It takes no flags: anything on the command line is refused rather than ignored.
  tutti::examples::FlagReader flags("linear_regression", argc, argv);
  while (flags.next()) flags.unknown();
  if (const std::optional<int> exit_status = flags.exit_status(kUsage)) return *exit_status;
  tutti::init();
  constexpr std::int64_t kSamplesPerRank = 256;

  // Each rank draws its own shard: a different seed per rank, as if it had read other files.
  std::mt19937 generator(1234 + tutti::rank());
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  std::vector<float> xs(kSamplesPerRank), ys(kSamplesPerRank);
  for (std::int64_t i = 0; i < kSamplesPerRank; ++i) {
    xs[i] = uniform(generator);
    ys[i] = 3.0f * xs[i] + 2.0f + noise(generator);
  }
  const tutti::Tensor x = tutti::Tensor::from<float>(xs, {kSamplesPerRank, 1});
  const tutti::Tensor y = tutti::Tensor::from<float>(ys, {kSamplesPerRank, 1});

  tutti::nn::Linear model(1, 1);
  // Every rank must start from the same weights: rank 0's win.
  tutti::optim::broadcast_parameters(model.named_parameters(), /*root_rank=*/0);
  tutti::optim::SGD sgd({model.weight(), model.bias()}, {.lr = 0.1});
  // Averages each gradient over the ranks as backward() produces it, so every rank takes the
  // same step: the one a single process would take on the union of the shards.
  tutti::optim::DistributedOptimizer optimizer(sgd, model.named_parameters());

  for (int step = 0; step < 200; ++step) {
    optimizer.zero_grad();
    tutti::nn::Variable loss = tutti::nn::mse_loss(model.forward(x), y);
    loss.backward();
    optimizer.step();
  }

  const float weight = model.weight().value().span<float>()[0];
  const float bias = model.bias().value().span<float>()[0];
  if (tutti::rank() == 0) {
    std::printf("ranks %d: learned y = %.4f x + %.4f (true: y = 3 x + 2)\n", tutti::size(), weight,
                bias);
  }
  tutti::shutdown();
  return std::abs(weight - 3.0f) < 0.1f && std::abs(bias - 2.0f) < 0.1f ? 0 : 1;
}

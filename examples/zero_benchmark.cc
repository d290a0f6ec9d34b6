// SPDX-License-Identifier: Apache-2.0
// DESIGN.md's P13: a training step with Adam on the ResNet-50 gradient shapes through
// optim::DistributedOptimizer (the reference), DDP + ZeroRedundancyOptimizer (stage 1), and
// ZeroRedundancyOptimizer with shard_gradients (stage 2), and each rank's optimizer-state bytes.
// Every line after the first two reads
//   P13 mode=<name> step_ms=<median> state_bytes=<largest rank's> step_ratio=<this / reference>
//       state_ratio=<this / reference>
// step_ms: the median over the rounds of each round's median step time (zero_grad, forward,
// backward, step; rank 0's clock). The modes take turns round by round.
//
// Usage: scripts/tuttirun -np 2 build/examples/zero_benchmark [--iters N] [--warmup W]
//          [--rounds R] [--tensors T] [--grads FILE]
//   Defaults 10, 2, 3, all 161 (T > 0: only the last T tensors, for smoke tests), the
//   built-in reference list (examples/data/resnet50_grads.txt; the shapes are checked
//   against it, or against FILE).
// Exit status 2 for bad flags, 1 if the workload does not match FILE or the modes' weights
// differ after the same steps.
#include <tutti/nn.h>
#include <tutti/optim.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "examples/machine_line.h"
#include "examples/resnet50_model.h"
#include "examples/step_benchmark_flags.h"

namespace {

namespace nn = tutti::nn;
namespace optim = tutti::optim;

constexpr char kUsage[] =
    "usage: zero_benchmark [--iters N] [--warmup W] [--rounds R] [--tensors T] [--grads FILE]\n";

using Flags = tutti::examples::StepBenchmarkFlags;

// The flags, or the exit status after rank 0 printed the usage (stdout for --help) or the fault
// naming the flag.
std::optional<Flags> parse_flags(int argc, char** argv, int* status) {
  return tutti::examples::read_step_benchmark_flags("zero_benchmark", kUsage, argc, argv,
                                                    {.warmup = 2}, tutti::rank() == 0, status);
}

enum class Mode { DistributedOptimizer, ZeroStage1, ZeroStage2 };
constexpr const char* kModeNames[] = {"distributed_optimizer", "zero_stage1", "zero_stage2"};

struct Result {
  std::vector<double> medians_ms;
  std::size_t state_bytes = 0;
  double checksum = 0;  // Σ of the weights after the last round: equal across modes.
};

std::size_t state_bytes(const optim::Optimizer& optimizer) {
  std::size_t bytes = 0;
  for (const auto& [key, t] : optimizer.state_dict().tensors) bytes += t.byte_size();
  return bytes;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void run_round(Mode mode, Result& result,
               const std::vector<std::pair<std::string, tutti::Shape>>& shapes,
               const Flags& flags) {
  auto model = std::make_shared<tutti::examples::GradientModel>(shapes, 1);
  std::unique_ptr<nn::DistributedDataParallel> ddp;
  if (mode == Mode::ZeroStage1) ddp = std::make_unique<nn::DistributedDataParallel>(model);
  nn::Module& net = ddp ? static_cast<nn::Module&>(*ddp) : *model;
  const nn::NamedParameters named = net.named_parameters();
  std::vector<nn::Variable> params;
  for (const auto& [name, p] : named) params.push_back(p);
  const optim::AdamOptions adam_options{.lr = 1e-4};
  std::unique_ptr<optim::Adam> adam;
  std::unique_ptr<optim::Optimizer> optimizer;
  const optim::Optimizer* state_holder = nullptr;
  if (mode == Mode::DistributedOptimizer) {
    adam = std::make_unique<optim::Adam>(params, adam_options);
    optimizer = std::make_unique<optim::DistributedOptimizer>(*adam, named);
    state_holder = adam.get();
  } else {
    auto zero = std::make_unique<optim::ZeroRedundancyOptimizer>(
        named,
        [&](std::vector<nn::Variable> shard) {
          return std::make_unique<optim::Adam>(std::move(shard), adam_options);
        },
        optim::ZeroOptions{.shard_gradients = mode == Mode::ZeroStage2});
    state_holder = &zero->local_optimizer();
    optimizer = std::move(zero);
  }
  const nn::Variable input(tutti::Tensor(tutti::DataType::Float32, {1}));
  std::vector<double> times;
  for (int step = 0; step < flags.warmup + flags.iters; ++step) {
    tutti::barrier();
    const auto start = std::chrono::steady_clock::now();
    optimizer->zero_grad();
    net.forward(input).backward();
    optimizer->step();
    const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - start;
    if (step >= flags.warmup) times.push_back(ms.count());
  }
  result.medians_ms.push_back(median(times));
  auto bytes = static_cast<std::int64_t>(state_bytes(*state_holder));
  tutti::allreduce(tutti::TensorView(&bytes, {}), "zero_benchmark.state_bytes",
                   {.op = tutti::ReduceOp::Max});
  result.state_bytes = static_cast<std::size_t>(bytes);
  result.checksum = 0;
  for (const auto& [name, p] : named) {
    for (float w : p.value().span<float>()) result.checksum += w;
  }
}

int run(const Flags& flags) {
  const bool root = tutti::rank() == 0;
  const std::string machine = tutti::examples::machine_line();
  if (root) std::printf("%s\n", machine.c_str());
  const auto workload =
      tutti::examples::checked_workload(flags.grads, flags.tensors, "zero_benchmark");
  if (!workload) return 1;
  const auto& shapes = *workload;
  std::int64_t elements = 0;
  for (const auto& [name, shape] : shapes) elements += tutti::num_elements(shape);
  if (root) {
    std::printf(
        "P13 workload: %zu tensors, %lld floats (%.1f MB), Adam, %d ranks, %d rounds of "
        "%d steps after %d warm-up steps\n",
        shapes.size(), static_cast<long long>(elements), 4e-6 * elements, tutti::size(),
        flags.rounds, flags.iters, flags.warmup);
  }
  Result results[3];
  for (int round = 0; round < flags.rounds; ++round) {
    for (int m = 0; m < 3; ++m) run_round(static_cast<Mode>(m), results[m], shapes, flags);
  }
  const double reference_ms = median(results[0].medians_ms);
  bool same = true;
  for (int m = 0; m < 3; ++m) {
    const double ms = median(results[m].medians_ms);
    same = same && std::abs(results[m].checksum - results[0].checksum) <=
                       1e-6 * static_cast<double>(elements);
    if (root) {
      std::printf("P13 mode=%s step_ms=%.1f state_bytes=%zu step_ratio=%.2f state_ratio=%.2f\n",
                  kModeNames[m], ms, results[m].state_bytes, ms / reference_ms,
                  static_cast<double>(results[m].state_bytes) / results[0].state_bytes);
    }
  }
  if (!same && root) std::fprintf(stderr, "zero_benchmark: the modes' weights differ\n");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  tutti::init();
  int status = 0;
  const std::optional<Flags> flags = parse_flags(argc, argv, &status);
  if (flags) status = run(*flags);
  tutti::shutdown();
  return status;
}

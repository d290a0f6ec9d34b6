// SPDX-License-Identifier: Apache-2.0
// DESIGN.md's P12: a DistributedDataParallel training step on the ResNet-50 gradient shapes with
// each communication hook (DDP's own reduction, hooks::allreduce, fp16_compress, PowerSGD at
// rank 1, 2 and 4, batched PowerSGD at rank 1), and the gradient bytes each sends per step.
// Every line after the first reads
//   P12 hook=<name> step_ms=<median> bytes=<per rank per step> bytes_ratio=<allreduce's / this>
//       time_ratio=<this / allreduce's>
// step_ms is the median over the rounds of each round's median step time (forward, backward
// with the bucket reductions, SGD step; rank 0's clock). bytes: what the hook hands to its
// allreduces per rank (DDP's and allreduce: 4 per float; fp16: 2; PowerSGD: 4 per element of P,
// Q and the uncompressed vectors, from PowerSGDState's counters), not counting how often the
// MPI algorithm copies them. PowerSGD starts at the third step (start_powerSGD_iter = 2), so
// --warmup must be at least 3 for its timings to be of compressed steps. The hooks take turns
// round by round, so that load from elsewhere hits them alike.
//
// Usage: scripts/tuttirun -np 2 build/examples/comm_hook_benchmark [--iters N] [--warmup W]
//          [--rounds R] [--tensors T] [--grads FILE]
//   Defaults 10, 3, 3, all 161 (T > 0: only the last T tensors, for smoke tests), the
//   built-in reference list (examples/data/resnet50_grads.txt; the shapes are checked
//   against it, or against FILE).
// Exit status 2 for bad flags, 1 if the workload does not match FILE.
#include <tutti/nn.h>
#include <tutti/optim.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "examples/machine_line.h"
#include "examples/resnet50_model.h"
#include "examples/step_benchmark_flags.h"

namespace {

namespace nn = tutti::nn;
namespace hooks = tutti::nn::hooks;

constexpr char kUsage[] =
    "usage: comm_hook_benchmark [--iters N] [--warmup W] [--rounds R] [--tensors T] "
    "[--grads FILE]\n";

using Flags = tutti::examples::StepBenchmarkFlags;

// The flags, or the exit status after rank 0 printed the usage (stdout for --help) or the fault
// naming the flag.
std::optional<Flags> parse_flags(int argc, char** argv, int* status) {
  return tutti::examples::read_step_benchmark_flags("comm_hook_benchmark", kUsage, argc, argv,
                                                    {.warmup = 3}, tutti::rank() == 0, status);
}

struct Variant {
  std::string name;
  std::function<nn::CommHook(std::shared_ptr<hooks::PowerSGDState>)> make;  // Empty: DDP's own.
  int rank = 0;  // PowerSGD's matrix_approximation_rank (0: not PowerSGD).
  std::vector<double> medians_ms = {};
  double bytes = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One round of one variant: a fresh DDP, the warm-up steps, then the timed ones.
void run_round(Variant& v, const std::vector<std::pair<std::string, tutti::Shape>>& shapes,
               std::int64_t elements, const Flags& flags) {
  auto state = std::make_shared<hooks::PowerSGDState>();
  state->matrix_approximation_rank = std::max(1, v.rank);
  state->start_powerSGD_iter = 2;
  nn::DistributedDataParallel ddp(std::make_shared<tutti::examples::GradientModel>(shapes, 1));
  if (v.make) ddp.register_comm_hook(v.make(state));
  std::vector<nn::Variable> params;
  for (auto& [name, p] : ddp.named_parameters()) params.push_back(p);
  tutti::optim::SGD sgd(params, {.lr = 1e-6});
  const nn::Variable input(tutti::Tensor(tutti::DataType::Float32, {1}));
  std::vector<double> times;
  for (int step = 0; step < flags.warmup + flags.iters; ++step) {
    tutti::barrier();
    const auto start = std::chrono::steady_clock::now();
    sgd.zero_grad();
    ddp.forward(input).backward();
    sgd.step();
    const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - start;
    if (step >= flags.warmup) times.push_back(ms.count());
  }
  v.medians_ms.push_back(median(times));
  if (v.rank > 0) {
    const int compressed = flags.warmup + flags.iters - state->start_powerSGD_iter;
    v.bytes = 4.0 * static_cast<double>(state->total_numel_after_compression) / compressed;
  } else {
    v.bytes = (v.name == "fp16" ? 2.0 : 4.0) * static_cast<double>(elements);
  }
}

int run(const Flags& flags) {
  const bool root = tutti::rank() == 0;
  const std::string machine = tutti::examples::machine_line();
  if (root) std::printf("%s\n", machine.c_str());
  const auto workload =
      tutti::examples::checked_workload(flags.grads, flags.tensors, "comm_hook_benchmark");
  if (!workload) return 1;
  const auto& shapes = *workload;
  std::int64_t elements = 0;
  for (const auto& [name, shape] : shapes) elements += tutti::num_elements(shape);
  if (root) {
    std::printf(
        "P12 workload: %zu tensors, %lld floats (%.1f MB), default 25 MiB buckets, "
        "%d ranks, %d rounds of %d steps after %d warm-up steps\n",
        shapes.size(), static_cast<long long>(elements), 4e-6 * elements, tutti::size(),
        flags.rounds, flags.iters, flags.warmup);
  }
  auto powersgd = [](auto s) { return hooks::powersgd(s); };
  std::vector<Variant> variants = {
      {"ddp", nullptr},
      {"allreduce", [](auto) { return hooks::allreduce(); }},
      {"fp16", [](auto) { return hooks::fp16_compress(); }},
      {"powersgd_r1", powersgd, 1},
      {"powersgd_r2", powersgd, 2},
      {"powersgd_r4", powersgd, 4},
      {"batched_powersgd_r1", [](auto s) { return hooks::batched_powersgd(s); }, 1},
  };
  for (int round = 0; round < flags.rounds; ++round) {
    for (Variant& v : variants) run_round(v, shapes, elements, flags);
  }
  const Variant& reference = variants[1];
  const double reference_ms = median(reference.medians_ms);
  for (const Variant& v : variants) {
    const double ms = median(v.medians_ms);
    if (root) {
      std::printf("P12 hook=%s step_ms=%.1f bytes=%.0f bytes_ratio=%.1f time_ratio=%.2f\n",
                  v.name.c_str(), ms, v.bytes, reference.bytes / v.bytes, ms / reference_ms);
    }
  }
  return 0;
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

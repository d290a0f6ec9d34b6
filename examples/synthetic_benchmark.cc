// SPDX-License-Identifier: Apache-2.0
// Horovod's synthetic benchmark on a small CNN with random data: training throughput with the
// gradient allreduces overlapping backward() (DistributedOptimizer), against the same steps
// with every gradient reduced only after backward() ends, and with no communication at all;
// and the ceiling of what overlap can win: the step synchronized (a 1-float allreduce after
// backward) with nothing sent, which waits for the slowest rank as every synchronous step does.
// With --wrapper ddp: DistributedDataParallel (gradient buckets reduced during backward())
// against the DistributedOptimizer and no communication, ending with DESIGN.md's P8 line
// "P8 ddp_ms=<x> optimizer_ms=<y> ratio=<x/y>" (median over the iterations of the time per
// training step, rank 0's clock).
//
// Usage: scripts/tuttirun -np 2 build/examples/synthetic_benchmark [--batch-size B]
//          [--num-warmup-batches W] [--num-batches-per-iter K] [--num-iters N]
//          [--wrapper optimizer|ddp] [--target-ci P] [--max-seconds S]
//   Defaults 32 (per rank), 10, 10, 10, as Horovod's pytorch_synthetic_benchmark.py; optimizer;
//   5 (percent); 300.
// Each pass runs W untimed steps, then at least N iterations of K timed steps; img/sec is
// reported as mean +- 1.96 sigma over the iterations (rank 0's clock), per rank and for all
// ranks. Unlike Horovod's script, the passes take turns iteration by iteration (each on its own
// copy of the model), so that load from other processes on a shared machine hits all of them
// alike, and the iterations go on (past N, for at most S seconds in all; 0 = exactly N) until
// the 95% confidence interval of the comparison is within P percent: of the overlap gain
// (overlap / no overlap, paired by iteration) and of each pass's mean. The last line is
// DESIGN.md's P5 (or P8 with --wrapper ddp) with that interval; P5 is preceded by
// "P5 detail synchronized_ms=<s> max_gain=<after_backward/s> hidden=<share>": the share of what
// reducing after backward added to the synchronized step that overlap took back.
// Model: conv 3->32, conv 32->64 (3x3, ReLU), max-pool 2, fc 16384->256, fc 256->10 on 32x32
// images: the 4.2M-parameter fc layer's gradient comes first in backward(), so its allreduce
// can run while the convolutions' gradients are still being computed.
// Exit status 1 if the ranks' weights differ after the synchronized passes, 2 for bad flags.
#include <tutti/nn.h>
#include <tutti/optim.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "examples/flag_reader.h"
#include "examples/machine_line.h"

namespace {

namespace nn = tutti::nn;
namespace optim = tutti::optim;

constexpr char kUsage[] =
    "usage: synthetic_benchmark [--batch-size B] [--num-warmup-batches W]\n"
    "                           [--num-batches-per-iter K] [--num-iters N]\n"
    "                           [--wrapper optimizer|ddp] [--target-ci PERCENT]\n"
    "                           [--max-seconds S]\n";

struct Flags {
  std::int64_t batch_size = 32;
  int warmup_batches = 10;
  int batches_per_iter = 10;
  int iters = 10;
  bool ddp = false;  // --wrapper ddp
  int target_ci_percent = 5;
  int max_seconds = 300;
};

// The flags, read strictly (examples/flag_reader.h), or the exit status after rank 0 printed
// the usage (stdout for --help) or the fault naming the flag.
std::optional<Flags> parse_flags(int argc, char** argv, int* status) {
  Flags f;
  tutti::examples::FlagReader flags("synthetic_benchmark", argc, argv);
  while (flags.next()) {
    if (flags.is("--wrapper")) {
      f.ddp = flags.choice({"optimizer", "ddp"}) == "ddp";
    } else if (flags.is("--batch-size")) {
      f.batch_size = flags.integer(1, 1'000'000);
    } else if (flags.is("--num-warmup-batches")) {
      f.warmup_batches = static_cast<int>(flags.integer(0, 1'000'000));
    } else if (flags.is("--num-batches-per-iter")) {
      f.batches_per_iter = static_cast<int>(flags.integer(1, 1'000'000));
    } else if (flags.is("--num-iters")) {
      f.iters = static_cast<int>(flags.integer(1, 1'000'000));
    } else if (flags.is("--target-ci")) {
      f.target_ci_percent = static_cast<int>(flags.integer(1, 1'000'000));
    } else if (flags.is("--max-seconds")) {
      f.max_seconds = static_cast<int>(flags.integer(0, 1'000'000));
    } else {
      flags.unknown();
    }
  }
  if (const std::optional<int> exit = flags.exit_status(kUsage, tutti::rank() == 0)) {
    *status = *exit;
    return std::nullopt;
  }
  return f;
}

std::shared_ptr<nn::Sequential> make_model() {
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Conv2d>(3, 32, 3, 1, 1)).add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1)).add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::MaxPool2d>(2)).add(std::make_shared<nn::Flatten>());
  model->add(std::make_shared<nn::Linear>(64 * 16 * 16, 256)).add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(256, 10));
  return model;
}

std::vector<nn::Variable> parameters(const nn::NamedParameters& named) {
  std::vector<nn::Variable> params;
  for (auto& [name, p] : named) params.push_back(p);
  return params;
}

// Half the 95% confidence interval of the mean of `samples` (1.96 standard errors), in percent
// of the mean; infinite for fewer than two samples.
double interval_percent(const std::vector<double>& samples) {
  const auto n = static_cast<double>(samples.size());
  if (samples.size() < 2) return INFINITY;
  double mean = 0;
  for (double x : samples) mean += x / n;
  double variance = 0;
  for (double x : samples) variance += (x - mean) * (x - mean) / (n - 1);
  return 1.96 * std::sqrt(variance / n) / mean * 100.0;
}

// One way of training, timed: its own copy of the model (rank 0's weights), its optimizer, its
// step, and the img/sec per rank of each iteration.
struct Pass {
  explicit Pass(const char* t) : title(t) { optim::broadcast_parameters(named, 0); }

  double mean() const {
    double sum = 0;
    for (double r : rates) sum += r;
    return sum / static_cast<double>(rates.size());
  }
  // Median over the iterations of the time per step: on a shared machine one iteration that
  // another process slowed down would dominate a mean.
  double step_ms(std::int64_t batch_size) const {
    std::vector<double> ms;
    for (double r : rates) ms.push_back(static_cast<double>(batch_size) / r * 1000.0);
    std::sort(ms.begin(), ms.end());
    const std::size_t n = ms.size();
    return n % 2 == 1 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  }
  double confidence() const {  // 1.96 sigma (population), as Horovod prints it.
    double variance = 0;
    for (double r : rates) variance += (r - mean()) * (r - mean());
    return 1.96 * std::sqrt(variance / static_cast<double>(rates.size()));
  }
  // Half the 95% confidence interval of the mean, in percent of it.
  double mean_ci_percent() const { return interval_percent(rates); }

  const char* title;
  std::shared_ptr<nn::Sequential> model = make_model();
  nn::NamedParameters named = model->named_parameters();
  optim::SGD sgd{parameters(named), {.lr = 0.001, .momentum = 0.9}};
  std::function<void()> step;
  std::vector<double> rates;
};

// The first two passes' img/sec per iteration, divided: their comparison with the load of that
// moment cancelled out.
std::vector<double> paired_ratios(const std::vector<Pass*>& passes) {
  std::vector<double> ratios;
  for (std::size_t i = 0; i < passes[0]->rates.size(); ++i)
    ratios.push_back(passes[0]->rates[i] / passes[1]->rates[i]);
  return ratios;
}

// Whether the comparison is precise enough (see the usage above): decided on rank 0, so that
// every rank runs the same number of iterations.
bool precise_enough(const Flags& flags, const std::vector<Pass*>& passes, double seconds) {
  std::int32_t done = 1;
  if (tutti::rank() == 0 && flags.max_seconds > 0 && seconds < flags.max_seconds) {
    const double target = flags.target_ci_percent;
    bool precise = interval_percent(paired_ratios(passes)) <= target;
    for (const Pass* pass : passes) precise = precise && pass->mean_ci_percent() <= target;
    done = precise ? 1 : 0;
  }
  tutti::broadcast(tutti::TensorView(&done, {}), 0, "synthetic.done");
  return done != 0;
}

// Horovod's method: warm-up steps, then timings of `batches_per_iter` steps each, the passes
// taking turns: `iters` of them, then more until precise_enough().
void measure(const Flags& flags, const std::vector<Pass*>& passes) {
  const bool root = tutti::rank() == 0;
  const auto started = std::chrono::steady_clock::now();
  if (root) std::printf("Running warmup...\n");
  for (Pass* pass : passes) {
    for (int i = 0; i < flags.warmup_batches; ++i) pass->step();
  }
  if (root) std::printf("Running benchmark...\n");
  for (int iter = 0;; ++iter) {
    if (iter >= flags.iters) {
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - started;
      if (precise_enough(flags, passes, elapsed.count())) break;
    }
    if (root) std::printf("Iter #%d:", iter);
    for (Pass* pass : passes) {
      // The ranks start each timing together. Without it the pass after the unsynchronized
      // local one paid, in its first step, for how far the ranks had drifted apart during it:
      // 4-6 % of the step at batch 8 on a 2-core AMD VM, all of it charged to the overlap pass.
      tutti::barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < flags.batches_per_iter; ++i) pass->step();
      const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
      pass->rates.push_back(static_cast<double>(flags.batch_size * flags.batches_per_iter) /
                            seconds.count());
      if (root) std::printf(" %.1f", pass->rates.back());
    }
    if (root) std::printf(" img/sec per rank\n");
  }
  for (const Pass* pass : passes) {
    if (!root) break;
    std::printf("\n== %s\nImg/sec per rank: %.1f +-%.1f\n", pass->title, pass->mean(),
                pass->confidence());
    std::printf("Total img/sec on %d rank(s): %.1f +-%.1f\n", tutti::size(),
                pass->mean() * tutti::size(), pass->confidence() * tutti::size());
  }
}

// True when every rank holds bit-identical weights: the checksum's min and max agree.
bool weights_agree(const nn::Module& model) {
  double checksum = 0;
  for (auto& [name, p] : model.named_parameters()) {
    for (float x : p.value().span<float>()) checksum += x;
  }
  double low = checksum, high = checksum;
  tutti::allreduce(tutti::TensorView(&low, {}), "check.min", {.op = tutti::ReduceOp::Min});
  tutti::allreduce(tutti::TensorView(&high, {}), "check.max", {.op = tutti::ReduceOp::Max});
  return low == high;
}

}  // namespace

int main(int argc, char** argv) {
  tutti::init();
  int status = 0;
  const std::optional<Flags> flags = parse_flags(argc, argv, &status);
  const bool root = tutti::rank() == 0;
  if (!flags) {
    tutti::shutdown();
    return status;
  }
  // First line: the machine (CPU model, MPI library, binding), as every benchmark prints it.
  {
    const std::string machine = tutti::examples::machine_line();
    if (tutti::rank() == 0) std::printf("%s\n", machine.c_str());
  }
  // Random but fixed data, as Horovod's benchmark: only the arithmetic and the traffic matter.
  std::mt19937 generator(tutti::rank());
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  tutti::Tensor images(tutti::DataType::Float32, {flags->batch_size, 3, 32, 32});
  tutti::Tensor labels(tutti::DataType::Int64, {flags->batch_size});
  for (float& x : images.span<float>()) x = uniform(generator);
  for (std::int64_t& y : labels.span<std::int64_t>()) y = generator() % 10;
  auto forward_backward = [&](Pass& pass) {
    nn::cross_entropy(pass.model->forward(images), labels).backward();
  };

  // Each parameter's hook starts the allreduce of its gradient as soon as backward() has it;
  // or, where the job's default is one group (TUTTI_GRADIENT_GROUPING, by default one where
  // ranks fill a host's cores), the last hook starts one grouped allreduce.
  Pass overlap(tutti::default_gradient_groups() == 1
                   ? "overlap: DistributedOptimizer, one gradient group (TUTTI_GRADIENT_GROUPING)"
                   : "overlap: DistributedOptimizer, each gradient alone");
  optim::DistributedOptimizer optimizer(overlap.sgd, overlap.named);
  overlap.step = [&] {
    optimizer.zero_grad();
    forward_backward(overlap);
    optimizer.step();
  };
  // The same reductions, started only after backward() has produced every gradient.
  std::unique_ptr<Pass> no_overlap;
  // DDP: buckets of gradients, each reduced the moment its last gradient is ready.
  std::unique_ptr<Pass> ddp_pass;
  std::unique_ptr<nn::DistributedDataParallel> ddp;
  if (flags->ddp) {
    ddp_pass = std::make_unique<Pass>("ddp: DistributedDataParallel");
    ddp = std::make_unique<nn::DistributedDataParallel>(ddp_pass->model);
    ddp_pass->step = [&] {
      ddp_pass->sgd.zero_grad();
      nn::cross_entropy(ddp->forward(images), labels).backward();  // Averaged on return.
      ddp_pass->sgd.step();
    };
  } else {
    no_overlap = std::make_unique<Pass>("no overlap: allreduce after backward");
    no_overlap->step = [&] {
      no_overlap->sgd.zero_grad();
      forward_backward(*no_overlap);
      std::vector<tutti::Handle> handles;
      for (auto& [name, p] : no_overlap->named) {
        handles.push_back(tutti::allreduce_async(p.grad(), "grad." + name));
      }
      for (tutti::Handle& h : handles) h.wait();
      no_overlap->sgd.step();
    };
  }
  // Each rank on its own, nothing sent: the reference of "scaling efficiency".
  Pass local("no communication (local SGD, reference)");
  local.step = [&] {
    local.sgd.zero_grad();
    forward_backward(local);
    local.sgd.step();
  };
  // Overlap's ceiling: a synchronous step can hide the gradients' transfer, not the wait for the
  // slowest rank's backward(), which one float allreduced after backward() also pays. Where the
  // ranks' steps vary (a shared or virtual machine), that wait is part of the communication's
  // share the local pass shows, and no overlap can win it.
  std::unique_ptr<Pass> synchronized;
  if (!flags->ddp) {
    synchronized = std::make_unique<Pass>("synchronized, nothing sent (overlap's ceiling)");
    synchronized->step = [&] {
      synchronized->sgd.zero_grad();
      forward_backward(*synchronized);
      float one = 1;
      tutti::allreduce(tutti::TensorView(&one, {}), "synthetic.synchronize",
                       {.op = tutti::ReduceOp::Sum});
      synchronized->sgd.step();
    };
  }
  Pass& second = flags->ddp ? *ddp_pass : *no_overlap;

  if (root) {
    long long parameter_count = 0;
    for (auto& [name, p] : local.named) parameter_count += p.value().num_elements();
    std::printf("Model: 2 conv + 2 fc, %lld parameters\nBatch size: %lld per rank\nRanks: %d\n",
                parameter_count, static_cast<long long>(flags->batch_size), tutti::size());
    std::printf("Passes: overlap, %s, no communication\n",
                flags->ddp ? "ddp" : "no overlap, synchronized");
  }
  std::vector<Pass*> passes = {&overlap, &second};
  if (synchronized) passes.push_back(synchronized.get());
  passes.push_back(&local);
  measure(*flags, passes);
  const bool agree = weights_agree(*overlap.model) && weights_agree(*second.model);

  if (root) {
    const int n = tutti::size();
    std::printf("\noverlap: %.1f img/sec total (+-%.1f)\n", overlap.mean() * n,
                overlap.confidence() * n);
    std::printf("%s: %.1f img/sec total (+-%.1f)\n", flags->ddp ? "ddp" : "no overlap",
                second.mean() * n, second.confidence() * n);
    std::printf("no communication: %.1f img/sec total (+-%.1f)\n", local.mean() * n,
                local.confidence() * n);
    if (flags->ddp) {
      const double ddp_ms = second.step_ms(flags->batch_size);
      const double optimizer_ms = overlap.step_ms(flags->batch_size);
      std::printf("P8 ddp_ms=%.2f optimizer_ms=%.2f ratio=%.3f\n", ddp_ms, optimizer_ms,
                  ddp_ms / optimizer_ms);
    } else {
      // The paired gain: overlap's img/sec over no overlap's, iteration by iteration.
      const std::vector<double> ratios = paired_ratios(passes);
      double gain = 0;
      for (double r : ratios) gain += r / static_cast<double>(ratios.size());
      const double ci = interval_percent(ratios) * gain;  // Percentage points of the gain.
      std::printf("gain: %+.1f%% +-%.1f%% (95%% confidence, %zu iterations)\n", (gain - 1) * 100,
                  ci, ratios.size());
      // Medians of step times: what after-backward reduction added to the synchronized step,
      // and the share of it the overlap took back (1 = all of it; below 0 = overlap lost).
      const double synchronized_ms = synchronized->step_ms(flags->batch_size);
      const double overlap_ms = overlap.step_ms(flags->batch_size);
      const double after_ms = second.step_ms(flags->batch_size);
      const double added_ms = after_ms - synchronized_ms;
      const double hidden = added_ms > 0 ? (after_ms - overlap_ms) / added_ms : NAN;
      std::printf("P5 detail synchronized_ms=%.2f max_gain=%.3f hidden=%.2f\n", synchronized_ms,
                  after_ms / synchronized_ms, hidden);
      std::printf("P5 overlap_ms=%.2f after_backward_ms=%.2f gain=%.3f ci=%.3f iters=%zu\n",
                  overlap_ms, after_ms, gain, ci / 100, ratios.size());
    }
    // Communication's cost at this rank count; compare with a -np 1 run for true scaling.
    std::printf("scaling efficiency vs no communication: %.1f%% (overlap), %.1f%% (%s)\n",
                overlap.mean() / local.mean() * 100, second.mean() / local.mean() * 100,
                flags->ddp ? "ddp" : "no overlap");
    if (!agree) std::fprintf(stderr, "synthetic_benchmark: ranks' weights differ\n");
  }
  tutti::shutdown();
  return agree ? 0 : 1;
}

// SPDX-License-Identifier: Apache-2.0
// Usage: elastic_program EPOCHS COMMIT_EVERY SLEEP_MS [SAMPLES]
// A deterministic elastic training loop, for the cluster suite's elastic tests: an MLP fitted
// to a synthetic regression set of SAMPLES (default 512) samples, batch 8 per rank, SGD with
// momentum through DistributedOptimizer at a learning rate scaled by the rank count (rescaled
// by a reset callback), a commit every COMMIT_EVERY steps and at each epoch's end, SLEEP_MS of
// sleep per step (so that a test can act mid-epoch). Rank 0 prints
//   "resumed at commit C: epoch E position P, R ranks"   (or "started: R ranks") once a launch
//                                                        has its state,
//   "step S"                                             after each step (S counts every step
//                                                        of the job, over its launches),
//   "commit C at step S"                                 as each commit starts,
//   "epoch E coverage: ok" / "... FAILED: ..."           whether every sample of the epoch was
//                                                        trained on exactly once (padding
//                                                        aside), over the launches,
//   "final parameters: fnv1a=0x..."                      a hash of the parameters' bytes.
// Exit status: 0, or elastic::run's kRelaunchExitCode (75), or 1 for a failed coverage check.
#include <tutti/data.h>
#include <tutti/elastic.h>
#include <tutti/nn.h>
#include <tutti/optim.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace nn = tutti::nn;
using tutti::Tensor;

constexpr std::size_t kBatch = 8;
constexpr std::int64_t kFeatures = 8;
constexpr double kLearningRate = 0.02;  // Per rank; scaled by the rank count.

// Sample i: x = sin(i·(j+1)·0.37) per feature j, y = Σ x_j·(j - 3.5)/4 + 0.1·cos(i).
float feature(std::size_t i, std::int64_t j) {
  return static_cast<float>(std::sin(static_cast<double>(i) * static_cast<double>(j + 1) * 0.37));
}
float target(std::size_t i) {
  double y = 0.1 * std::cos(static_cast<double>(i));
  for (std::int64_t j = 0; j < kFeatures; ++j)
    y += feature(i, j) * (static_cast<double>(j) - 3.5) / 4;
  return static_cast<float>(y);
}

std::uint64_t fnv1a(const nn::NamedParameters& parameters) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const auto& [name, p] : parameters) {
    const auto* bytes = static_cast<const unsigned char*>(p.value().data());
    for (std::size_t k = 0; k < p.value().byte_size(); ++k)
      hash = (hash ^ bytes[k]) * 1099511628211ull;
  }
  return hash;
}

struct Args {
  std::int64_t epochs = 2;
  std::int64_t commit_every = 10;
  int sleep_ms = 0;
  std::size_t samples = 512;
};

int train(const Args& args) {
  const bool root = tutti::rank() == 0;
  nn::manual_seed(7);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(kFeatures, 16))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(16, 1));
  const nn::NamedParameters parameters = model->named_parameters();
  std::vector<nn::Variable> variables;
  for (const auto& [name, p] : parameters) variables.push_back(p);
  tutti::optim::SGD sgd(variables, {.lr = kLearningRate * tutti::size(), .momentum = 0.9});
  tutti::optim::DistributedOptimizer optimizer(sgd, parameters);
  tutti::data::DistributedSampler sampler(args.samples, tutti::size(), tutti::rank(), true, 3);
  std::int64_t epoch = 0, step = 0;
  std::vector<std::uint8_t> visits(args.samples, 0);  // This epoch's, over the launches.

  tutti::elastic::State state;
  state.add("model", parameters);
  state.add("optimizer", optimizer);
  state.add("sampler", sampler);
  state.add("epoch", epoch);
  state.add("step", step);
  state.add("visits", visits);
  state.on_reset([&] { sgd.set_lr(kLearningRate * tutti::size()); });

  int status = 0;
  const int code = tutti::elastic::run(state, [&](tutti::elastic::State& s) {
    if (root && s.commits() > 0) {
      std::printf("resumed at commit %lld: epoch %lld position %zu, %d ranks\n",
                  static_cast<long long>(s.commits()), static_cast<long long>(epoch),
                  sampler.position(), tutti::size());
    } else if (root) {
      std::printf("started: %d ranks\n", tutti::size());
    }
    std::fflush(stdout);
    auto commit = [&] {  // Printed first: the commit that stops a launch throws.
      if (root)
        std::printf("commit %lld at step %lld\n", static_cast<long long>(s.commits() + 1),
                    static_cast<long long>(step));
      std::fflush(stdout);
      s.commit();
    };
    while (epoch < args.epochs) {
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));  // Keeps a resumed epoch's place.
      const std::vector<std::size_t> indices = sampler.indices();
      for (std::size_t begin = 0; begin < indices.size(); begin += kBatch) {
        const std::size_t n = std::min(kBatch, indices.size() - begin);
        Tensor x(tutti::DataType::Float32, {static_cast<std::int64_t>(n), kFeatures});
        Tensor y(tutti::DataType::Float32, {static_cast<std::int64_t>(n), 1});
        std::vector<std::int64_t> mine(kBatch, -1);
        for (std::size_t i = 0; i < n; ++i) {
          for (std::int64_t j = 0; j < kFeatures; ++j) {
            x.span<float>()[i * kFeatures + j] = feature(indices[begin + i], j);
          }
          y.span<float>()[i] = target(indices[begin + i]);
          mine[i] = static_cast<std::int64_t>(indices[begin + i]);
        }
        optimizer.zero_grad();
        nn::Variable loss = nn::mse_loss(model->forward(x), y);
        loss.backward();
        optimizer.step();
        sampler.advance(n);
        const Tensor all = tutti::allgather(tutti::TensorView(mine.data(), {kBatch}), "visits");
        for (std::int64_t i : all.span<std::int64_t>()) {
          if (i >= 0) visits[static_cast<std::size_t>(i)] += 1;
        }
        ++step;
        if (root) std::printf("step %lld\n", static_cast<long long>(step));
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::milliseconds(args.sleep_ms));
        if (step % args.commit_every == 0) commit();
      }
      // Every sample once; the padding of the tail repeats fewer than the rank count.
      std::size_t missing = 0, extra = 0;
      for (std::uint8_t v : visits) {
        missing += v == 0;
        extra += v > 1 ? v - 1 : 0;
      }
      const bool ok = missing == 0 && extra < static_cast<std::size_t>(tutti::size());
      if (!ok) status = 1;
      if (root) {
        std::printf("epoch %lld coverage: %s (missing %zu, repeated %zu)\n",
                    static_cast<long long>(epoch), ok ? "ok" : "FAILED", missing, extra);
      }
      std::fill(visits.begin(), visits.end(), 0);
      ++epoch;  // Before the commit: a relaunch starts the next epoch, not this one's end.
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));
      if (epoch < args.epochs) commit();
    }
    if (root)
      std::printf("final parameters: fnv1a=0x%016llx\n",
                  static_cast<unsigned long long>(fnv1a(parameters)));
  });
  return code != 0 ? code : status;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: elastic_program EPOCHS COMMIT_EVERY SLEEP_MS [SAMPLES]\n");
    return 2;
  }
  Args args;
  args.epochs = std::atoll(argv[1]);
  args.commit_every = std::max(1LL, std::atoll(argv[2]));
  args.sleep_ms = std::atoi(argv[3]);
  if (argc > 4) args.samples = static_cast<std::size_t>(std::atoll(argv[4]));
  tutti::init();
  int code = 1;
  try {
    code = train(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_program: rank %d: %s\n", tutti::rank(), e.what());
  }
  tutti::shutdown();
  return code;
}

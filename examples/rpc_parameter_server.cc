// SPDX-License-Identifier: Apache-2.0
// A parameter server over RPC (PyTorch's "Implementing a Parameter Server Using Distributed RPC
// Framework", in C++): rank 0 holds an MLP's layers and hands out RRefs to them; every other rank
// is a trainer that runs the forward pass on the server through RPC, the backward pass with
// distributed autograd, and steps with rpc::DistributedOptimizer. Trainers run asynchronously
// (HogWild-style), each on its share of Fashion-MNIST; at the end rank 0 prints the test accuracy.
//
// Usage: scripts/tuttirun -np 3 build/examples/rpc_parameter_server [--epochs N] [--batch-size B]
//          [--lr LR] [--data-dir DIR] [--limit N] [--min-accuracy PERCENT]
//   --epochs        1 to 10^6, default 3
//   --batch-size    per trainer, 1 to 10^6, default 64
//   --lr            SGD learning rate (above 0), default 0.1
//   --limit         train on the first N images only (N >= 1; smoke tests)
//   --min-accuracy  exit 1 if the final test accuracy is lower (0 to 100, default 0: never)
// Exit status: 0; 1 below --min-accuracy or without the data; 2 for bad flags or fewer than 2
// ranks.
#include <tutti/data.h>
#include <tutti/distributed_autograd.h>
#include <tutti/nn.h>
#include <tutti/optim.h>
#include <tutti/rpc.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "examples/flag_reader.h"

namespace {

namespace nn = tutti::nn;
namespace rpc = tutti::rpc;
using tutti::Tensor;
using tutti::examples::FlagReader;

constexpr char kUsage[] =
    "usage: rpc_parameter_server [--epochs N] [--batch-size B] [--lr LR] [--data-dir DIR]\n"
    "                            [--limit N] [--min-accuracy PERCENT]\n";
constexpr float kPixelMean = 0.2860f;  // Fashion-MNIST's, as examples/fashion_mnist.cc.
// The MLP: 784 -> 256 -> 128 -> 10 with ReLUs between.
constexpr std::pair<int, int> kLayers[] = {{784, 256}, {256, 128}, {128, 10}};
constexpr float kPixelStd = 0.3530f;

struct Flags {
  int epochs = 3;
  std::size_t batch_size = 64;
  double lr = 0.1;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::size_t limit = 0;
  double min_accuracy = 0;
};

// Reads the flags into `f`; a fault or --help ends the reading (FlagReader::exit_status).
void parse_flags(FlagReader& flags, Flags& f) {
  constexpr std::int64_t kMaxCount = 1'000'000;  // Epochs, images per batch: sanity bounds.
  constexpr std::int64_t kMaxImages = 1'000'000'000;
  while (flags.next()) {
    if (flags.is("--epochs"))
      f.epochs = static_cast<int>(flags.integer(1, kMaxCount));
    else if (flags.is("--batch-size"))
      f.batch_size = static_cast<std::size_t>(flags.integer(1, kMaxCount));
    else if (flags.is("--lr"))
      f.lr = flags.positive_real();
    else if (flags.is("--data-dir"))
      f.data_dir = flags.text();
    else if (flags.is("--limit"))
      f.limit = static_cast<std::size_t>(flags.integer(1, kMaxImages));
    else if (flags.is("--min-accuracy"))
      f.min_accuracy = flags.real(0, 100);
    else
      flags.unknown();
  }
}

// ---- The parameter server (rank 0) ----

// The model lives here. Forward passes read the parameters and steps replace them, under `mutex`;
// a step writes new tensors instead of updating in place, so the backward passes of forwards
// already made keep the weights they used (Linear captures its weight tensor).
struct Server {
  std::mutex mutex;
  std::vector<std::shared_ptr<nn::Linear>> layers;
};
Server& server() {
  static Server s;
  return s;
}

// "ps.layer": bytes = layer index; the value (kept by the RRef) is that layer's parameters.
rpc::Message layer_parameters(const rpc::Message& args) {
  const auto& layer = server().layers.at(std::stoul(args.bytes));
  return {.tensors = {layer->weight(), layer->bias()}, .rrefs = {}, .bytes = args.bytes};
}

// "ps.forward": tensors[0] = images [n, 784], rrefs = the layers (owned here, so each resolves
// to the server's own value). Recorded by distributed autograd: the logits carry gradients back.
rpc::Message forward(const rpc::Message& args) {
  nn::Variable x = args.tensors.at(0);
  std::lock_guard<std::mutex> lock(server().mutex);
  for (std::size_t i = 0; i < args.rrefs.size(); ++i) {
    const auto& layer = server().layers.at(std::stoul(args.rrefs[i].local_value().bytes));
    x = layer->forward(x);
    if (i + 1 < args.rrefs.size()) x = nn::relu(x);
  }
  return {.tensors = {x}, .rrefs = {}, .bytes = {}};
}

// The optimizer each trainer's DistributedOptimizer builds on the server: plain SGD that replaces
// each parameter's tensor under the server's lock (see Server).
class ReplacingSGD : public tutti::optim::Optimizer {
 public:
  ReplacingSGD(std::vector<nn::Variable> parameters, double lr)
      : Optimizer(std::move(parameters)), lr_(lr) {}
  void step() override {
    std::lock_guard<std::mutex> lock(server().mutex);
    for (nn::Variable p : parameters()) {
      Tensor next = p.value().clone();
      std::span<float> w = next.span<float>();
      std::span<const float> g = p.grad().span<float>();
      for (std::size_t i = 0; i < w.size(); ++i) w[i] -= static_cast<float>(lr_) * g[i];
      p.value() = next;
    }
  }

 private:
  double lr_;
};

// Normalized images [n, 784] and labels [n] of the samples indices[begin, end).
std::pair<Tensor, Tensor> make_batch(const tutti::data::ImageDataset& data,
                                     const std::vector<std::size_t>& indices, std::size_t begin,
                                     std::size_t end) {
  const auto n = static_cast<std::int64_t>(end - begin);
  Tensor images(tutti::DataType::Float32, {n, 784}), labels(tutti::DataType::Int64, {n});
  const float* src = data.images.span<float>().data();
  float* dst = images.span<float>().data();
  for (std::size_t i = begin; i < end; ++i) {
    const float* image = src + indices[i] * 784;
    for (std::size_t p = 0; p < 784; ++p) *dst++ = (image[p] - kPixelMean) / kPixelStd;
    labels.span<std::int64_t>()[i - begin] = data.labels.span<std::int64_t>()[indices[i]];
  }
  return {images, labels};
}

double test_accuracy(const tutti::data::ImageDataset& test) {
  std::vector<std::size_t> all(static_cast<std::size_t>(test.labels.num_elements()));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  std::int64_t correct = 0;
  std::lock_guard<std::mutex> lock(server().mutex);
  for (std::size_t begin = 0; begin < all.size(); begin += 1000) {
    auto [images, labels] = make_batch(test, all, begin, std::min(begin + 1000, all.size()));
    nn::Variable x = images;
    for (std::size_t i = 0; i < server().layers.size(); ++i) {
      x = server().layers[i]->forward(x);
      if (i + 1 < server().layers.size()) x = nn::relu(x);
    }
    std::span<const float> logits = x.value().span<float>();
    for (std::int64_t i = 0; i < labels.num_elements(); ++i) {
      const float* row = logits.data() + i * 10;
      correct += std::max_element(row, row + 10) - row == labels.span<std::int64_t>()[i];
    }
  }
  return 100.0 * static_cast<double>(correct) / static_cast<double>(all.size());
}

// ---- A trainer (every other rank) ----

void train(const Flags& flags, const tutti::data::ImageDataset& data) {
  const int trainers = tutti::size() - 1, me = tutti::rank() - 1;
  std::size_t n = static_cast<std::size_t>(data.labels.num_elements());
  if (flags.limit > 0) n = std::min(n, flags.limit);
  std::vector<rpc::RRef> layers;  // The server's layers, by reference.
  for (std::size_t i = 0; i < std::size(kLayers); ++i) {
    layers.push_back(
        rpc::remote("ps", "ps.layer", {.tensors = {}, .rrefs = {}, .bytes = std::to_string(i)}));
  }
  rpc::DistributedOptimizer optimizer("replacing_sgd", {{"lr", flags.lr}}, layers);
  tutti::data::DistributedSampler sampler(n, trainers, me, /*shuffle=*/true, /*seed=*/42);
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    const std::vector<std::size_t> indices = sampler.indices();
    double loss_sum = 0;
    std::size_t batches = 0;
    for (std::size_t begin = 0; begin < indices.size(); begin += flags.batch_size, ++batches) {
      auto [images, labels] =
          make_batch(data, indices, begin, std::min(begin + flags.batch_size, indices.size()));
      tutti::dist_autograd::Context context;
      nn::Variable logits =
          rpc::rpc_sync("ps", "ps.forward", {.tensors = {images}, .rrefs = layers, .bytes = {}})
              .tensors.at(0);
      nn::Variable loss = nn::cross_entropy(logits, labels);
      tutti::dist_autograd::backward(context.id(), {loss});
      optimizer.step(context.id());
      loss_sum += loss.value().span<float>()[0];
    }
    std::printf("[trainer%d] epoch %d: mean training loss %.4f over %zu batches\n", me + 1,
                epoch + 1, loss_sum / static_cast<double>(std::max<std::size_t>(batches, 1)),
                batches);
    std::fflush(stdout);
  }
}

// The data this rank needs (the server the test set, a trainer the training set), or nullopt
// on every rank after the first rank that could not load it said why. Collective, before RPC
// starts: a bad --data-dir ends the job with a message, not an uncaught exception on a trainer.
std::optional<tutti::data::ImageDataset> load_data(const Flags& flags) {
  std::optional<tutti::data::ImageDataset> data;
  std::string error;
  try {
    data = tutti::data::load_mnist_idx(flags.data_dir, /*train=*/tutti::rank() != 0);
  } catch (const tutti::Error& e) {
    error = e.what();
  }
  std::int32_t first_failed = error.empty() ? INT_MAX : tutti::rank();
  tutti::allreduce(tutti::TensorView(&first_failed, {}), "data.failed",
                   {.op = tutti::ReduceOp::Min});
  if (first_failed == tutti::rank()) {
    std::fprintf(stderr, "rpc_parameter_server: no usable Fashion-MNIST data in %s (%s)\n",
                 flags.data_dir.c_str(), error.c_str());
  }
  if (first_failed != INT_MAX) return std::nullopt;
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  FlagReader reader("rpc_parameter_server", argc, argv);
  parse_flags(reader, flags);
  if (const std::optional<int> exit_status = reader.exit_status(kUsage)) return *exit_status;
  tutti::init();
  if (tutti::size() < 2) {
    if (tutti::rank() == 0)
      std::fprintf(stderr, "rpc_parameter_server needs 2 or more ranks (1 server + trainers)\n");
    tutti::shutdown();
    return 2;
  }
  const std::optional<tutti::data::ImageDataset> data = load_data(flags);
  if (!data) {
    tutti::shutdown();
    return 1;
  }
  rpc::register_function("ps.layer", layer_parameters);
  rpc::register_function("ps.forward", forward);
  rpc::register_optimizer("replacing_sgd", [](std::vector<nn::Variable> parameters,
                                              const std::map<std::string, double>& o) {
    return std::make_unique<ReplacingSGD>(std::move(parameters), o.at("lr"));
  });
  int status = 0;
  if (tutti::rank() == 0) {
    nn::manual_seed(42);
    for (auto [in, out] : kLayers) {
      server().layers.push_back(std::make_shared<nn::Linear>(in, out));
    }
    rpc::init_rpc("ps");
    tutti::barrier();  // The trainers are done; the pool served them meanwhile.
    const double accuracy = test_accuracy(*data);
    std::printf(
        "rpc_parameter_server: final test accuracy: %.2f%% (1 server + %d trainers, %d epochs)\n",
        accuracy, tutti::size() - 1, flags.epochs);
    status = accuracy >= flags.min_accuracy ? 0 : 1;
  } else {
    rpc::init_rpc("trainer" + std::to_string(tutti::rank()));
    train(flags, *data);
    tutti::barrier();
  }
  rpc::shutdown();
  tutti::shutdown();
  return status;
}

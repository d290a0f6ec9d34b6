// SPDX-License-Identifier: Apache-2.0
// A LibTorch CNN trained data-parallel on Fashion-MNIST with Tutti's LibTorch adapter: the
// usual LibTorch loop (torch::data's MNIST reader, a DistributedRandomSampler over
// tutti::rank()/size()) plus the four Tutti lines marked "Tutti". Prints the test accuracy,
// counted over the ranks' shards of the test set with an allreduce of torch tensors.
//
// Usage: scripts/tuttirun -np 2 build/examples/libtorch_mnist [--epochs N] [--batch-size B]
//            [--lr LR] [--data-dir DIR] [--limit N] [--device cpu|cuda]
//   --data-dir  Fashion-MNIST idx files, plain or .gz; default /usr/share/datasets/fashion-mnist
//               (Debian package dataset-fashion-mnist). .gz files are unpacked once into a
//               temporary directory, since torch::data's reader wants the plain files.
//   --limit     train on the first N training images only (smoke tests)
//   --device    cuda: the model and batches on cuda:(local_rank % GPUs), gradients reduced as
//               CUDA tensors (NCCL with a GPU per rank, else MPI through host staging); needs
//               a LibTorch with CUDA and a Tutti built with CUDA. Default cpu.
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tutti/libtorch.h"
#include "tutti/tutti.h"

namespace {

const char* const kFiles[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// A directory holding the four plain idx files: `dir` itself, or a temporary one into which
// the .gz files are unpacked. Empty when neither exists.
std::string plain_idx_dir(const std::string& dir) {
  bool plain = true;
  for (const char* name : kFiles) plain = plain && std::filesystem::exists(dir + "/" + name);
  if (plain) return dir;
  const std::string out =
      (std::filesystem::temp_directory_path() /
       ("tutti-libtorch-mnist-" + std::to_string(::getpid()) + "-" + std::to_string(tutti::rank())))
          .string();
  std::filesystem::create_directories(out);
  for (const char* name : kFiles) {
    gzFile in = gzopen((dir + "/" + name + ".gz").c_str(), "rb");
    if (in == nullptr) return {};
    std::ofstream file(out + "/" + name, std::ios::binary);
    std::vector<char> buffer(1 << 16);
    int n = 0;
    while ((n = gzread(in, buffer.data(), static_cast<unsigned>(buffer.size()))) > 0) {
      file.write(buffer.data(), n);
    }
    gzclose(in);
  }
  return out;
}

// Normalized images and their labels, one example at a time for torch::data's loader.
class Images : public torch::data::datasets::Dataset<Images> {
 public:
  Images(torch::Tensor images, torch::Tensor labels)
      : images_(std::move(images)), labels_(std::move(labels)) {}
  torch::data::Example<> get(std::size_t index) override {
    const auto i = static_cast<std::int64_t>(index);
    return {images_[i], labels_[i]};
  }
  torch::optional<std::size_t> size() const override {
    return static_cast<std::size_t>(images_.size(0));
  }

 private:
  torch::Tensor images_;
  torch::Tensor labels_;
};

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)))),
        conv2(register_module("conv2",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

}  // namespace

int main(int argc, char** argv) {
  int epochs = 3;
  std::int64_t batch_size = 64;  // Per rank.
  double lr = 1e-3;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t limit = 0;
  std::string device_name = "cpu";
  bool bad_flags = argc % 2 == 0;  // Every flag takes a value.
  for (int i = 1; !bad_flags && i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--epochs") {
      epochs = std::stoi(value);
    } else if (flag == "--batch-size") {
      batch_size = std::stoll(value);
    } else if (flag == "--lr") {
      lr = std::stod(value);
    } else if (flag == "--data-dir") {
      data_dir = value;
    } else if (flag == "--limit") {
      limit = std::stoll(value);
    } else if (flag == "--device" && (value == "cpu" || value == "cuda")) {
      device_name = value;
    } else {
      bad_flags = true;
    }
  }
  if (bad_flags) {
    std::fprintf(stderr,
                 "usage: libtorch_mnist [--epochs N] [--batch-size B] [--lr LR] "
                 "[--data-dir DIR] [--limit N] [--device cpu|cuda]\n");
    return 2;
  }
  if (device_name == "cuda" && !(torch::cuda::is_available() && tutti::cuda_built())) {
    std::fprintf(stderr, "libtorch_mnist: --device cuda needs %s\n",
                 tutti::cuda_built() ? "a LibTorch with CUDA and a visible GPU"
                                     : "a Tutti built with CUDA (meson setup -Dcuda=enabled)");
    return 2;
  }

  tutti::init();              // Tutti (1/4)
  torch::set_num_threads(1);  // One core per rank.
  // One GPU per rank where there are enough, else ranks share them (Tutti then reduces
  // through host staging: NCCL refuses two ranks on one GPU).
  const torch::Device device =
      device_name == "cuda"
          ? torch::Device(torch::kCUDA,
                          static_cast<c10::DeviceIndex>(
                              tutti::local_rank() % static_cast<int>(torch::cuda::device_count())))
          : torch::Device(torch::kCPU);
  const std::string dir = plain_idx_dir(data_dir);
  if (dir.empty()) {
    std::fprintf(stderr,
                 "libtorch_mnist: no Fashion-MNIST in %s (apt-get install dataset-fashion-mnist, "
                 "or --data-dir DIR)\n",
                 data_dir.c_str());
    return 1;
  }

  auto train_set = torch::data::datasets::MNIST(dir, torch::data::datasets::MNIST::Mode::kTrain);
  torch::Tensor images = train_set.images();
  torch::Tensor labels = train_set.targets();
  if (limit > 0 && limit < images.size(0)) {
    images = images.slice(0, 0, limit);
    labels = labels.slice(0, 0, limit);
  }
  auto train = Images(torch::data::transforms::Normalize<>(0.2860, 0.3530)(images), labels)
                   .map(torch::data::transforms::Stack<>());
  torch::data::samplers::DistributedRandomSampler sampler(images.size(0), tutti::size(),
                                                          tutti::rank());
  auto loader = torch::data::make_data_loader(std::move(train), sampler,
                                              torch::data::DataLoaderOptions(batch_size));

  torch::manual_seed(static_cast<std::uint64_t>(tutti::rank()) + 1);  // Broadcast fixes it.
  Net model;
  model->to(device);  // Before the optimizer and the broadcast: they see the device tensors.
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(lr));
  tutti::libtorch::broadcast_parameters(model->named_parameters(), 0);               // Tutti (2/4)
  tutti::libtorch::broadcast_optimizer_state(adam, 0);                               // Tutti (3/4)
  tutti::libtorch::DistributedOptimizer optimizer(adam, model->named_parameters());  // (4/4)

  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(static_cast<std::size_t>(epoch));
    model->train();
    double loss_sum = 0;
    int batches = 0;
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      // Submitted on LibTorch's current stream, which the adapter hands to Tutti: no
      // synchronization anywhere in the loop.
      torch::Tensor loss = torch::nn::functional::cross_entropy(
          model->forward(batch.data.to(device)), batch.target.to(device));
      loss.backward();
      optimizer.step();
      loss_sum += loss.item<double>();
      ++batches;
    }
    if (tutti::rank() == 0) {
      std::printf("epoch %d: mean training loss %.4f (rank 0, %d batches)\n", epoch + 1,
                  loss_sum / std::max(batches, 1), batches);
      std::fflush(stdout);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Test accuracy: each rank scores its shard; the counts are summed with an allreduce.
  auto test_set = torch::data::datasets::MNIST(dir, torch::data::datasets::MNIST::Mode::kTest);
  const std::int64_t n = test_set.images().size(0);
  const std::int64_t begin = n * tutti::rank() / tutti::size();
  const std::int64_t end = n * (tutti::rank() + 1) / tutti::size();
  torch::Tensor counts = torch::zeros({2}, torch::kFloat64);  // Correct, total.
  {
    torch::NoGradGuard no_grad;
    model->eval();
    const torch::Tensor x = torch::data::transforms::Normalize<>(
        0.2860, 0.3530)(test_set.images().slice(0, begin, end));
    const torch::Tensor predicted = model->forward(x.to(device)).argmax(1);
    counts[0] =
        predicted.eq(test_set.targets().slice(0, begin, end).to(device)).sum().item<double>();
    counts[1] = static_cast<double>(end - begin);
  }
  tutti::allreduce(tutti::libtorch::view(counts), "libtorch_mnist.accuracy",
                   {.op = tutti::ReduceOp::Sum});
  const double accuracy = counts[0].item<double>() / counts[1].item<double>();
  if (tutti::rank() == 0) {
    std::printf("test accuracy %.4f (%d ranks, %d epochs, %.1f s training, %s)\n", accuracy,
                tutti::size(), epochs, seconds, device.str().c_str());
  }
  tutti::shutdown();
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// A LibTorch CNN trained data-parallel on Fashion-MNIST with Tutti's LibTorch adapter: the
// usual LibTorch loop (torch::data's MNIST reader, a DistributedRandomSampler over
// tutti::rank()/size()) plus the four Tutti lines marked "Tutti". Prints the test accuracy,
// counted over the ranks' shards of the test set with an allreduce of torch tensors. With
// --elastic the job survives losing a rank or a host (tuttirun's elastic mode relaunches it;
// README, Elastic training): the model and Adam join a tutti::elastic::State through
// tutti::libtorch::stateful().
//
// Usage: scripts/tuttirun -np 2 build/examples/libtorch_mnist [--epochs N] [--batch-size B]
//            [--lr LR] [--data-dir DIR] [--limit N] [--device cpu|cuda]
//            [--elastic [--commit-every N]]
//        scripts/tuttirun --host-discovery-script hosts.sh -np 2
//            build/examples/libtorch_mnist --elastic
//   --data-dir  Fashion-MNIST idx files, plain or .gz; default /usr/share/datasets/fashion-mnist
//               (Debian package dataset-fashion-mnist). .gz files are unpacked once into a
//               temporary directory, since torch::data's reader wants the plain files.
//   --limit     train on the first N training images only (smoke tests)
//   --device    cuda: the model and batches on cuda:(local_rank % GPUs), gradients reduced as
//               CUDA tensors (NCCL with a GPU per rank, else MPI through host staging); needs
//               a LibTorch with CUDA and a Tutti built with CUDA. Default cpu.
//   --elastic   commit the model, Adam's state, the sampler's place in the epoch (Tutti's
//               DistributedSampler, which continues an epoch at another rank count, in place
//               of torch's) and rank 0's loss of the epoch so far every --commit-every steps
//               (default 50) and at each epoch's end, under TUTTI_ELASTIC_DIR (which tuttirun's
//               elastic mode sets); a relaunched job resumes from the last commit. Rank 0
//               prints a line per commit, per epoch and, last, "final test accuracy: XX.XX%".
// Exit status: 0 (--help too); 1 for missing data or a runtime error; 2 for bad flags (a
// message naming the flag and the value); with --elastic, 75
// when the job stopped to be relaunched (tutti::elastic::kRelaunchExitCode).
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "tutti/data.h"
#include "tutti/elastic.h"
#include "tutti/libtorch.h"
#include "tutti/tutti.h"

namespace {

const char* const kFiles[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// A directory holding the four plain idx files: `dir` itself, or a temporary one into which
// the .gz files are unpacked, removed with the object (before, each run left 53 MB per rank
// in the temporary directory). path() is empty when neither exists.
class IdxDir {
 public:
  explicit IdxDir(const std::string& dir) {
    bool plain = true;
    for (const char* name : kFiles) plain = plain && std::filesystem::exists(dir + "/" + name);
    if (plain) {
      path_ = dir;
      return;
    }
    temporary_ = (std::filesystem::temp_directory_path() /
                  ("tutti-libtorch-mnist-" + std::to_string(::getpid()) + "-" +
                   std::to_string(tutti::rank())))
                     .string();
    std::filesystem::create_directories(temporary_);
    for (const char* name : kFiles) {
      gzFile in = gzopen((dir + "/" + name + ".gz").c_str(), "rb");
      if (in == nullptr) return;
      std::ofstream file(temporary_ + "/" + name, std::ios::binary);
      std::vector<char> buffer(1 << 16);
      int n = 0;
      while ((n = gzread(in, buffer.data(), static_cast<unsigned>(buffer.size()))) > 0) {
        file.write(buffer.data(), n);
      }
      gzclose(in);
    }
    path_ = temporary_;
  }
  ~IdxDir() {
    std::error_code ignored;
    if (!temporary_.empty()) std::filesystem::remove_all(temporary_, ignored);
  }
  IdxDir(const IdxDir&) = delete;
  IdxDir& operator=(const IdxDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string temporary_;  // Unpacked here, if not empty.
};

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

struct Flags {
  int epochs = 3;
  std::int64_t batch_size = 64;  // Per rank.
  double lr = 1e-3;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t limit = 0;
  std::string device = "cpu";
  bool elastic = false;
  std::int64_t commit_every = 50;  // Steps, with --elastic.
};

// `text` as a number, all of it ("8x" is not 8).
template <class T>
bool read_number(const std::string& text, T& out) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, out);
  return error == std::errc() && stop == end;
}

constexpr const char* kUsage =
    "usage: libtorch_mnist [--epochs N] [--batch-size B] [--lr LR] [--data-dir DIR] [--limit N] "
    "[--device cpu|cuda] [--elastic [--commit-every N]]\n";

// Reads the command line into `f` (a later flag overrides an earlier one). Returns what is
// wrong with it, or "" (with `help` set for --help).
std::string parse_flags(int argc, char** argv, Flags& f, bool& help) {
  bool commit_every = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help") {
      help = true;
      return "";
    }
    if (flag == "--elastic") {  // The one flag without a value.
      f.elastic = true;
      continue;
    }
    if (flag != "--epochs" && flag != "--batch-size" && flag != "--lr" && flag != "--data-dir" &&
        flag != "--limit" && flag != "--device" && flag != "--commit-every") {
      return "unknown flag '" + flag + "'";
    }
    if (i + 1 >= argc) return flag + " needs a value";
    const std::string value = argv[++i];
    bool ok = true;
    if (flag == "--epochs") {
      ok = read_number(value, f.epochs) && f.epochs >= 0;
    } else if (flag == "--batch-size") {
      ok = read_number(value, f.batch_size) && f.batch_size >= 1;
    } else if (flag == "--lr") {
      ok = read_number(value, f.lr) && f.lr > 0;
    } else if (flag == "--data-dir") {
      f.data_dir = value;
    } else if (flag == "--limit") {
      ok = read_number(value, f.limit) && f.limit >= 0;
    } else if (flag == "--device") {
      ok = value == "cpu" || value == "cuda";
      f.device = value;
    } else {
      ok = read_number(value, f.commit_every) && f.commit_every >= 1;
      commit_every = true;
    }
    if (!ok) return "bad " + flag + " '" + value + "'";
  }
  if (commit_every && !f.elastic) return "--commit-every needs --elastic";
  return "";
}

// The test accuracy: each rank scores its shard; the counts are summed with an allreduce.
double test_accuracy(Net& model, const std::string& dir, const torch::Device& device) {
  auto test_set = torch::data::datasets::MNIST(dir, torch::data::datasets::MNIST::Mode::kTest);
  const std::int64_t n = test_set.images().size(0);
  const std::int64_t begin = n * tutti::rank() / tutti::size();
  const std::int64_t end = n * (tutti::rank() + 1) / tutti::size();
  torch::Tensor counts = torch::zeros({2}, torch::kFloat64);  // Correct, total.
  {
    torch::NoGradGuard no_grad;
    model->eval();
    // In chunks of 25 images: the convolutions' scratch for a whole shard at once took
    // gigabytes, and at 500 images a chunk's (113 MB) was still above what glibc's malloc keeps
    // in its heap, so every chunk's came back from the kernel as fresh pages to clear: that
    // took half of a short run's time (2 ranks on 2 cores, --limit 512: 11.6 s, 6.4 s now).
    constexpr std::int64_t kChunk = 25;
    double correct = 0;
    for (std::int64_t at = begin; at < end; at += kChunk) {
      const std::int64_t stop = std::min(at + kChunk, end);
      const torch::Tensor x = torch::data::transforms::Normalize<>(
          0.2860, 0.3530)(test_set.images().slice(0, at, stop));
      const torch::Tensor predicted = model->forward(x.to(device)).argmax(1);
      correct +=
          predicted.eq(test_set.targets().slice(0, at, stop).to(device)).sum().item<double>();
    }
    counts[0] = correct;
    counts[1] = static_cast<double>(end - begin);
  }
  tutti::allreduce(tutti::libtorch::view(counts), "libtorch_mnist.accuracy",
                   {.op = tutti::ReduceOp::Sum});
  return counts[0].item<double>() / counts[1].item<double>();
}

// What both loops train: the normalized training images, their labels, the model and Adam on
// `device`.
struct Training {
  torch::Tensor images;
  torch::Tensor labels;
  torch::Device device;
  Net model;
  torch::optim::Adam adam;

  Training(torch::Tensor raw_images, torch::Tensor raw_labels, torch::Device on, double lr)
      : images(torch::data::transforms::Normalize<>(0.2860, 0.3530)(raw_images)),
        labels(std::move(raw_labels)),
        device(on),
        model(make_model(on)),
        adam(model->parameters(), torch::optim::AdamOptions(lr)) {}

  static Net make_model(const torch::Device& on) {
    torch::manual_seed(static_cast<std::uint64_t>(tutti::rank()) + 1);  // Broadcast fixes it.
    Net net;
    net->to(on);  // Before the optimizer and the broadcast: they see the device tensors.
    return net;
  }
  // One step on the images at `indices`; returns the loss.
  double step(tutti::libtorch::DistributedOptimizer& optimizer, const torch::Tensor& indices) {
    optimizer.zero_grad();
    // Submitted on LibTorch's current stream, which the adapter hands to Tutti: no
    // synchronization anywhere in the loop.
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        model->forward(images.index({indices}).to(device)), labels.index({indices}).to(device));
    loss.backward();
    optimizer.step();
    return loss.item<double>();
  }
};

// The usual LibTorch loop: torch's DataLoader over a DistributedRandomSampler.
void train(const Flags& flags, Training& t, const std::string& dir) {
  tutti::libtorch::broadcast_parameters(t.model->named_parameters(), 0);                 // (2/4)
  tutti::libtorch::broadcast_optimizer_state(t.adam, 0);                                 // (3/4)
  tutti::libtorch::DistributedOptimizer optimizer(t.adam, t.model->named_parameters());  // (4/4)
  auto dataset = Images(t.images, t.labels).map(torch::data::transforms::Stack<>());
  torch::data::samplers::DistributedRandomSampler sampler(t.images.size(0), tutti::size(),
                                                          tutti::rank());
  auto loader = torch::data::make_data_loader(std::move(dataset), sampler,
                                              torch::data::DataLoaderOptions(flags.batch_size));
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    sampler.set_epoch(static_cast<std::size_t>(epoch));
    t.model->train();
    double loss_sum = 0;
    int batches = 0;
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(
          t.model->forward(batch.data.to(t.device)), batch.target.to(t.device));
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
  const double accuracy = test_accuracy(t.model, dir, t.device);
  if (tutti::rank() == 0) {
    std::printf("test accuracy %.4f (%d ranks, %d epochs, %.1f s training, %s)\n", accuracy,
                tutti::size(), flags.epochs, seconds, t.device.str().c_str());
  }
}

// Rank 0's loss of the epoch so far, committed as an object of the program's own
// (elastic::Stateful), so that a resumed epoch prints the mean of all its steps.
struct EpochLoss {
  double sum = 0;
  std::int64_t steps = 0;

  tutti::elastic::Stateful stateful() {
    return {
        .save = [this] { return std::string(reinterpret_cast<const char*>(this), sizeof *this); },
        .prepare_load = [this](std::string_view bytes) -> std::function<void()> {
          if (bytes.size() != sizeof *this) throw std::runtime_error("not an epoch's loss");
          EpochLoss read;
          std::memcpy(&read, bytes.data(), sizeof read);
          return [this, read] { *this = read; };
        }};
  }
};

// --elastic: commits every --commit-every steps and at each epoch's end; a relaunched job
// resumes from the last commit, at whatever rank count it has. elastic::run restores the
// commit or, with none, syncs every rank from rank 0 (the broadcasts' place). Returns
// elastic::run's status (75: relaunch me), or 1 for a commit past --epochs.
int train_elastic(const Flags& flags, Training& t, const std::string& dir) {
  const bool root = tutti::rank() == 0;
  const auto samples = static_cast<std::size_t>(t.images.size(0));
  tutti::data::DistributedSampler sampler(samples, tutti::size(), tutti::rank());
  std::int64_t epoch = 0;
  EpochLoss loss;
  tutti::elastic::State state("libtorch_mnist");
  state.add("model", tutti::libtorch::stateful(*t.model));  // Parameters and buffers.
  state.add("adam", tutti::libtorch::stateful(t.adam));
  state.add("sampler", sampler);
  state.add("epoch", epoch);
  state.add("epoch_loss", loss.stateful());
  tutti::libtorch::DistributedOptimizer optimizer(t.adam, t.model->named_parameters());  // (4/4)
  int refused = 0;
  const int status = tutti::elastic::run(state, [&](tutti::elastic::State& s) {
    if (epoch > flags.epochs) {  // The run would be another one's.
      if (root) {
        std::fprintf(stderr,
                     "the commit in TUTTI_ELASTIC_DIR has %lld epochs done, more than "
                     "--epochs %d\n",
                     static_cast<long long>(epoch), flags.epochs);
      }
      refused = 1;
      return;
    }
    if (root && s.commits() > 0) {
      std::printf("resumed at commit %lld: epoch %lld, %zu of its %zu images done\n",
                  static_cast<long long>(s.commits()), static_cast<long long>(epoch + 1),
                  sampler.position(), samples);
      std::fflush(stdout);
    }
    std::int64_t steps_done = 0;  // In this launch: commits every --commit-every of them.
    while (epoch < flags.epochs) {
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));  // Keeps a resumed epoch's place.
      const std::vector<std::size_t> indices = sampler.indices();
      t.model->train();
      for (std::size_t begin = 0; begin < indices.size();
           begin += static_cast<std::size_t>(flags.batch_size)) {
        const std::size_t end =
            std::min(begin + static_cast<std::size_t>(flags.batch_size), indices.size());
        const std::vector<std::int64_t> batch(indices.begin() + static_cast<std::ptrdiff_t>(begin),
                                              indices.begin() + static_cast<std::ptrdiff_t>(end));
        loss.sum += t.step(optimizer, torch::tensor(batch, torch::kInt64));
        ++loss.steps;
        sampler.advance(end - begin);
        if (++steps_done % flags.commit_every == 0) {
          s.commit();
          if (root) {
            std::printf("epoch %lld [%zu/%zu images] committed\n",
                        static_cast<long long>(epoch + 1), sampler.position(), samples);
            std::fflush(stdout);
          }
        }
      }
      if (root) {
        std::printf("epoch %lld: train loss %.4f (rank 0, %lld batches)\n",
                    static_cast<long long>(epoch + 1),
                    loss.sum / static_cast<double>(std::max<std::int64_t>(loss.steps, 1)),
                    static_cast<long long>(loss.steps));
        std::fflush(stdout);
      }
      loss = {};
      ++epoch;  // Before the commit: a relaunch starts the next epoch, not this one's end.
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));
      s.commit();
    }
    const double accuracy = test_accuracy(t.model, dir, t.device);
    if (root) std::printf("final test accuracy: %.2f%%\n", 100 * accuracy);
  });
  return refused != 0 ? refused : status;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  bool help = false;
  const std::string problem = parse_flags(argc, argv, flags, help);
  if (help) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "libtorch_mnist: %s\n%s", problem.c_str(), kUsage);
    return 2;
  }
  if (flags.device == "cuda" && !(torch::cuda::is_available() && tutti::cuda_built())) {
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
      flags.device == "cuda"
          ? torch::Device(torch::kCUDA,
                          static_cast<c10::DeviceIndex>(
                              tutti::local_rank() % static_cast<int>(torch::cuda::device_count())))
          : torch::Device(torch::kCPU);
  const IdxDir idx_dir(flags.data_dir);
  const std::string& dir = idx_dir.path();
  if (dir.empty()) {
    std::fprintf(stderr,
                 "libtorch_mnist: no Fashion-MNIST in %s (apt-get install dataset-fashion-mnist, "
                 "or --data-dir DIR)\n",
                 flags.data_dir.c_str());
    tutti::shutdown();
    return 1;
  }

  auto train_set = torch::data::datasets::MNIST(dir, torch::data::datasets::MNIST::Mode::kTrain);
  torch::Tensor images = train_set.images();
  torch::Tensor labels = train_set.targets();
  if (flags.limit > 0 && flags.limit < images.size(0)) {
    images = images.slice(0, 0, flags.limit);
    labels = labels.slice(0, 0, flags.limit);
  }
  Training training(images, labels, device, flags.lr);
  int status = 0;
  if (flags.elastic) {
    status = train_elastic(flags, training, dir);
  } else {
    train(flags, training, dir);
  }
  tutti::shutdown();
  return status;
}

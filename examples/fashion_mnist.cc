// SPDX-License-Identifier: Apache-2.0
// Data-parallel training of an MLP or a small CNN on Fashion-MNIST: every rank trains on its
// DistributedSampler shard, the gradients are averaged while backward() runs (the Horovod way,
// DistributedOptimizer, or the PyTorch way, DistributedDataParallel), the learning rate is
// scaled by the number of ranks, and rank 0's initial (or checkpointed) state is broadcast to
// all.
//
// Usage: scripts/tuttirun -np 2 build/examples/fashion_mnist [--model mlp|cnn] [--epochs N]
//          [--batch-size B] [--lr LR] [--data-dir DIR] [--checkpoint FILE] [--seed S] [--limit N]
//          [--wrapper optimizer|ddp|localsgd] [--hook allreduce|fp16|powersgd]
//          [--powersgd-rank R] [--powersgd-start N] [--period K] [--warmup-steps W]
//   --model       mlp (784-512-256-10 with BatchNorm, default) or cnn (2 x conv-BN-ReLU-pool,
//                 fc 128, fc 10)
//   --wrapper     optimizer (default): optim::DistributedOptimizer around SGD; ddp:
//                 nn::DistributedDataParallel around the model, plain SGD (which also
//                 broadcasts rank 0's BatchNorm statistics before every step); localsgd: no
//                 gradient averaging, plain SGD on every rank and nn::PeriodicModelAverager
//                 averaging the parameters every --period steps after --warmup-steps (defaults
//                 4 and 0); the test accuracy is rank 0's replica's
//   --hook        with --wrapper ddp: a communication hook (nn::hooks) in place of DDP's own
//                 averaging: allreduce, fp16 (fp16_compress) or powersgd (error feedback and
//                 warm start, rank --powersgd-rank, default 1, from step --powersgd-start,
//                 default 100); rank 0 prints PowerSGD's compression ratio at the end
//   --epochs      default 5
//   --batch-size  per rank, default 64 (the global batch is B x ranks)
//   --lr          the single-rank learning rate (default 0.05), multiplied by the rank count
//   --data-dir    idx(.gz) files; default /usr/share/datasets/fashion-mnist (Debian package
//                 dataset-fashion-mnist); an MNIST directory works too
//   --checkpoint  resume from FILE if it exists; rank 0 rewrites it atomically after each epoch.
//                 A damaged file (CRC-32), another model's, an old-format one or one with more
//                 epochs done than --epochs is refused (exit 1) and left as it is
//   --seed        initial weights and shuffling, default 42
//   --limit       train on the first N images only (quick tests)
// Rank 0 prints progress, a line per epoch and, last, "final test accuracy: XX.XX%".
// Exit status: 0; 1 for missing data, a bad checkpoint or a runtime error; 2 for bad flags.
#include <tutti/data.h>
#include <tutti/nn.h>
#include <tutti/optim.h>
#include <tutti/tutti.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numbers>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace nn = tutti::nn;
namespace optim = tutti::optim;
using tutti::Tensor;
using tutti::TensorView;

constexpr char kUsage[] =
    "usage: fashion_mnist [--model mlp|cnn] [--epochs N] [--batch-size B] [--lr LR]\n"
    "                     [--data-dir DIR] [--checkpoint FILE] [--seed S] [--limit N]\n"
    "                     [--wrapper optimizer|ddp|localsgd] [--hook allreduce|fp16|powersgd]\n"
    "                     [--powersgd-rank R] [--powersgd-start N] [--period K]\n"
    "                     [--warmup-steps W]\n";
// Fashion-MNIST's training-set pixel mean and standard deviation: centred inputs train faster.
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;
constexpr char kMagic[] = "TUTTICK2";     // Checkpoint header and trailer (8 bytes).
constexpr char kOldMagic[] = "TUTTICK1";  // The format before the checksum: refused.

struct Flags {
  std::string model = "mlp";
  int epochs = 5;
  std::size_t batch_size = 64;
  double lr = 0.05;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string checkpoint;
  std::uint64_t seed = 42;
  std::size_t limit = 0;  // 0: every training image.
  std::string wrapper = "optimizer";
  std::string hook;  // Empty: none.
  int powersgd_rank = 1;
  int powersgd_start = 100;
  int period = 4;
  int warmup_steps = 0;
};

// The number in `text` if it is finite, >= `min` and (with `integer`) whole and at most 1e9.
std::optional<double> to_number(const std::string& text, double min, bool integer) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(x) || x < min) return std::nullopt;
  if (integer && (x != std::floor(x) || x > 1e9)) return std::nullopt;
  return x;
}

std::optional<Flags> parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    std::optional<double> x = 0.0;
    if (flag == "--model" && (value == "mlp" || value == "cnn"))
      f.model = value;
    else if (flag == "--epochs" && (x = to_number(value, 0, true)))
      f.epochs = static_cast<int>(*x);
    else if (flag == "--batch-size" && (x = to_number(value, 1, true)))
      f.batch_size = static_cast<std::size_t>(*x);
    else if (flag == "--lr" && (x = to_number(value, 0, false)))
      f.lr = *x;
    else if (flag == "--data-dir")
      f.data_dir = value;
    else if (flag == "--checkpoint")
      f.checkpoint = value;
    else if (flag == "--seed" && (x = to_number(value, 0, true)))
      f.seed = static_cast<std::uint64_t>(*x);
    else if (flag == "--limit" && (x = to_number(value, 1, true)))
      f.limit = static_cast<std::size_t>(*x);
    else if (flag == "--wrapper" && (value == "optimizer" || value == "ddp" || value == "localsgd"))
      f.wrapper = value;
    else if (flag == "--hook" && (value == "allreduce" || value == "fp16" || value == "powersgd"))
      f.hook = value;
    else if (flag == "--powersgd-rank" && (x = to_number(value, 1, true)))
      f.powersgd_rank = static_cast<int>(*x);
    else if (flag == "--powersgd-start" && (x = to_number(value, 2, true)))
      f.powersgd_start = static_cast<int>(*x);
    else if (flag == "--period" && (x = to_number(value, 1, true)))
      f.period = static_cast<int>(*x);
    else if (flag == "--warmup-steps" && (x = to_number(value, 0, true)))
      f.warmup_steps = static_cast<int>(*x);
    else
      return std::nullopt;
  }
  if (argc % 2 == 0) return std::nullopt;                          // A flag without its value.
  if (!f.hook.empty() && f.wrapper != "ddp") return std::nullopt;  // Hooks are DDP's.
  return f;
}

std::shared_ptr<nn::Sequential> make_model(const std::string& kind) {
  auto model = std::make_shared<nn::Sequential>();
  auto add = [&](auto layer) { model->add(std::move(layer)); };
  if (kind == "mlp") {
    add(std::make_shared<nn::Flatten>());
    // BatchNorm: 3 epochs reach 88.6-89.0% at 1, 2 and 4 ranks (88.0-88.5% without).
    add(std::make_shared<nn::Linear>(784, 512, /*bias=*/false));
    add(std::make_shared<nn::BatchNorm1d>(512));
    add(std::make_shared<nn::ReLU>());
    add(std::make_shared<nn::Linear>(512, 256, /*bias=*/false));
    add(std::make_shared<nn::BatchNorm1d>(256));
    add(std::make_shared<nn::ReLU>());
    add(std::make_shared<nn::Linear>(256, 10));
    return model;
  }
  // 28x28 -> 14x14 -> 7x7. BatchNorm lets the scaled learning rate train fast and stably.
  for (auto [in, out] : {std::pair<int, int>{1, 32}, {32, 64}}) {
    add(std::make_shared<nn::Conv2d>(in, out, 3, 1, 1, /*bias=*/false));
    add(std::make_shared<nn::BatchNorm2d>(out));
    add(std::make_shared<nn::ReLU>());
    add(std::make_shared<nn::MaxPool2d>(2));
  }
  add(std::make_shared<nn::Flatten>());
  add(std::make_shared<nn::Linear>(64 * 7 * 7, 128));
  add(std::make_shared<nn::ReLU>());
  add(std::make_shared<nn::Linear>(128, 10));
  return model;
}

// Normalized images [n, 1, 28, 28] and labels [n] of the samples indices[begin, end).
std::pair<Tensor, Tensor> make_batch(const tutti::data::ImageDataset& data,
                                     const std::vector<std::size_t>& indices, std::size_t begin,
                                     std::size_t end) {
  const auto n = static_cast<std::int64_t>(end - begin);
  tutti::Shape shape = data.images.shape();
  const std::size_t pixels = data.images.num_elements() / shape[0];
  shape[0] = n;
  Tensor images(tutti::DataType::Float32, shape), labels(tutti::DataType::Int64, {n});
  const float* src = data.images.span<float>().data();
  float* dst = images.span<float>().data();
  for (std::size_t i = begin; i < end; ++i) {
    const float* image = src + indices[i] * pixels;
    for (std::size_t p = 0; p < pixels; ++p) *dst++ = (image[p] - kPixelMean) / kPixelStd;
    labels.span<std::int64_t>()[i - begin] = data.labels.span<std::int64_t>()[indices[i]];
  }
  return {images, labels};
}

// Test accuracy in percent. Rank r evaluates exactly the images r, r + size, ... (not its
// DistributedSampler share, whose padding would count some images twice); correct counts are
// summed over the ranks.
double evaluate(nn::Module& model, const tutti::data::ImageDataset& test) {
  // BatchNorm's running statistics are local to each rank (no SyncBatchNorm): average them so
  // that every rank evaluates, and rank 0 saves, one model.
  std::vector<TensorView> buffers;
  for (auto& [name, buffer] : model.named_buffers()) buffers.push_back(buffer.value());
  if (!buffers.empty()) tutti::grouped_allreduce(buffers, "evaluate.buffers");
  model.train(false);
  const auto n = static_cast<std::size_t>(test.labels.num_elements());
  std::vector<std::size_t> shard;
  for (auto i = static_cast<std::size_t>(tutti::rank()); i < n; i += tutti::size()) {
    shard.push_back(i);
  }
  std::int64_t correct = 0;
  for (std::size_t begin = 0; begin < shard.size(); begin += 1000) {
    auto [images, labels] = make_batch(test, shard, begin, std::min(begin + 1000, shard.size()));
    const nn::Variable output = model.forward(images);  // Keeps the logits alive.
    const std::span<const float> logits = output.value().span<float>();
    for (std::int64_t i = 0; i < labels.num_elements(); ++i) {
      const float* row = logits.data() + i * 10;
      correct += std::max_element(row, row + 10) - row == labels.span<std::int64_t>()[i];
    }
  }
  tutti::allreduce(TensorView(&correct, {}), "evaluate.correct", {.op = tutti::ReduceOp::Sum});
  model.train(true);
  return 100.0 * static_cast<double>(correct) / static_cast<double>(n);
}

// Checkpoint file, native byte order: "TUTTICK2", int64 epochs done; float32 tensors as
// {uint32 name length, name, uint32 dims, int64 shape[dims], data} named "param.<name>",
// "buffer.<name>" (BatchNorm statistics) and "optim.<state key>", then an empty name; the
// optimizer's scalars as {name, float64}, then an empty name; "TUTTICK2" again; last, the
// uint32 CRC-32 (zlib's) of every byte before it, so that a damaged file is refused.
std::vector<std::pair<std::string, Tensor>> model_tensors(const nn::Module& model) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, p] : model.named_parameters()) tensors.emplace_back("param." + name, p.value());
  for (auto& [name, b] : model.named_buffers()) tensors.emplace_back("buffer." + name, b.value());
  return tensors;
}

std::uint32_t checksum(const char* data, std::size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {  // zlib's length is a uInt.
    const auto piece = static_cast<uInt>(std::min<std::size_t>(size, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), piece);
    data += piece;
    size -= piece;
  }
  return static_cast<std::uint32_t>(crc);
}

// Writes aside, flushes to disk, then renames: a crash leaves the old checkpoint or the new one.
void save_checkpoint(const std::string& path, std::int64_t epochs, const nn::Module& model,
                     const optim::Optimizer& optimizer) {
  const optim::StateDict state = optimizer.state_dict();
  std::vector<std::pair<std::string, Tensor>> tensors = model_tensors(model);
  for (auto& [key, t] : state.tensors) tensors.emplace_back("optim." + key, t);
  std::string bytes;  // The file, built in memory for its checksum.
  auto put = [&bytes](const void* data, std::size_t size) {
    bytes.append(static_cast<const char*>(data), size);
  };
  auto put_name = [&](const std::string& name) {
    const auto length = static_cast<std::uint32_t>(name.size());
    put(&length, sizeof length);
    put(name.data(), length);
  };
  put(kMagic, 8);
  put(&epochs, sizeof epochs);
  for (auto& [name, t] : tensors) {
    if (t.dtype() != tutti::DataType::Float32) throw std::runtime_error(name + " is not float32");
    const auto dims = static_cast<std::uint32_t>(t.dim());
    put_name(name);
    put(&dims, sizeof dims);
    put(t.shape().data(), dims * sizeof(std::int64_t));
    put(t.data(), t.byte_size());
  }
  put_name("");
  for (auto& [name, value] : state.scalars) {
    put_name(name);
    put(&value, sizeof value);
  }
  put_name("");
  put(kMagic, 8);
  const std::uint32_t crc = checksum(bytes.data(), bytes.size());
  put(&crc, sizeof crc);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  const bool written = std::ferror(f) == 0 && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot write checkpoint " + path + ": " + std::strerror(errno));
  }
}

// Loads `path` into the model and the optimizer and returns the epochs done, at most
// `max_epochs`. Throws std::runtime_error naming the file if it is damaged (checksum), of the
// old format, out of range or holds another model; the model is then untouched.
std::int64_t load_checkpoint(const std::string& path, nn::Module& model,
                             optim::Optimizer& optimizer, std::int64_t max_epochs) {
  auto fail = [&](const std::string& why) -> void {
    throw std::runtime_error("bad checkpoint " + path + ": " + why);
  };
  std::string bytes;
  {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (f == nullptr) fail(std::strerror(errno));
    char chunk[1 << 16];
    for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f.get())) > 0;) {
      bytes.append(chunk, n);
    }
    if (std::ferror(f.get())) fail(std::strerror(errno));
  }
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kOldMagic, 8) == 0) {
    fail("written in the old format TUTTICK1, which has no checksum; delete it to train anew");
  }
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    fail("not a Tutti checkpoint");
  }
  if (bytes.size() < 8 + 8 + 8 + sizeof(std::uint32_t)) fail("truncated");
  std::uint32_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - sizeof stored, sizeof stored);
  bytes.resize(bytes.size() - sizeof stored);
  if (checksum(bytes.data(), bytes.size()) != stored) {
    fail("checksum mismatch: the file is damaged");
  }
  std::size_t offset = 0;
  auto get = [&](void* data, std::size_t size) {
    if (size > bytes.size() - offset) fail("truncated");
    std::memcpy(data, bytes.data() + offset, size);
    offset += size;
  };
  auto get_name = [&] {
    std::uint32_t length = 0;
    get(&length, sizeof length);
    if (length > 4096) fail("bad name length");
    std::string name(length, '\0');
    get(name.data(), length);
    return name;
  };
  char magic[8] = {};
  std::int64_t epochs = 0;
  get(magic, 8);
  get(&epochs, sizeof epochs);
  if (epochs < 0 || epochs > max_epochs) {
    fail("epoch count " + std::to_string(epochs) + " outside 0 ... " + std::to_string(max_epochs) +
         " (--epochs)");
  }
  std::map<std::string, Tensor> tensors;
  optim::StateDict state;
  for (std::string name = get_name(); !name.empty(); name = get_name()) {
    std::uint32_t dims = 0;
    get(&dims, sizeof dims);
    if (dims > 8) fail("bad rank for " + name);
    tutti::Shape shape(dims);
    get(shape.data(), dims * sizeof(std::int64_t));
    std::int64_t count = 1;
    for (std::int64_t d : shape) {
      if (d < 0 || d > (1 << 28) || (count *= d) > (1 << 28)) fail("bad shape for " + name);
    }
    Tensor t(tutti::DataType::Float32, shape);
    get(t.data(), t.byte_size());
    if (name.starts_with("optim."))
      state.tensors.emplace_back(name.substr(6), t);
    else
      tensors[name] = t;
  }
  for (std::string name = get_name(); !name.empty(); name = get_name()) {
    get(&state.scalars[name], sizeof(double));
  }
  get(magic, 8);
  if (std::memcmp(magic, kMagic, 8) != 0 || offset != bytes.size()) fail("bad trailer");
  // Copy into the model's own tensors, which the optimizer shares.
  const std::vector<std::pair<std::string, Tensor>> targets = model_tensors(model);
  if (targets.size() != tensors.size()) fail("another model (see --model)");
  for (auto& [name, target] : targets) {
    auto it = tensors.find(name);
    if (it == tensors.end() || it->second.shape() != target.shape()) {
      fail("no " + name + " of the model's shape (another --model?)");
    }
    std::memcpy(target.data(), it->second.data(), target.byte_size());
  }
  optimizer.load_state_dict(state);
  return epochs;
}

// Horovod's recipe for a rate scaled by the rank count: warm up linearly from the single-rank
// rate over the first epoch, then decay to zero along a cosine. Ending at zero makes the final
// accuracy depend little on the rank count.
double learning_rate(const Flags& flags, std::size_t step, std::size_t steps_per_epoch) {
  const double peak = flags.lr * tutti::size();
  const double total = static_cast<double>(steps_per_epoch) * flags.epochs;
  const double t = static_cast<double>(step);
  const double warm = std::min(1.0, t / static_cast<double>(steps_per_epoch));
  return (flags.lr + (peak - flags.lr) * warm) * 0.5 * (1 + std::cos(std::numbers::pi * t / total));
}

int train(const Flags& flags) {
  const bool root = tutti::rank() == 0;
  // Every rank reads the files itself; agree on the outcome so no rank goes on alone.
  tutti::data::ImageDataset train_set, test_set;
  std::string error;
  try {
    train_set = tutti::data::load_mnist_idx(flags.data_dir, true);
    test_set = tutti::data::load_mnist_idx(flags.data_dir, false);
  } catch (const tutti::Error& e) {
    error = e.what();
  }
  std::int32_t first_failed = error.empty() ? INT_MAX : tutti::rank();
  tutti::allreduce(TensorView(&first_failed, {}), "data.failed", {.op = tutti::ReduceOp::Min});
  if (first_failed == tutti::rank()) {
    std::fprintf(stderr,
                 "fashion_mnist: no usable Fashion-MNIST data in %s (%s)\n"
                 "Install it with 'apt-get install dataset-fashion-mnist' (Debian package "
                 "dataset-fashion-mnist) or pass --data-dir DIR.\n",
                 flags.data_dir.c_str(), error.c_str());
  }
  if (first_failed != INT_MAX) return 1;

  nn::manual_seed(flags.seed);
  std::shared_ptr<nn::Sequential> model = make_model(flags.model);
  std::vector<nn::Variable> params;
  for (auto& [name, p] : model->named_parameters()) params.push_back(p);
  optim::SGD sgd(params, {.lr = flags.lr, .momentum = 0.9});
  // The Horovod way wraps the optimizer; the PyTorch way (below, after the checkpoint) wraps
  // the model and keeps the plain SGD.
  std::unique_ptr<optim::DistributedOptimizer> distributed;
  if (flags.wrapper == "optimizer") {
    distributed = std::make_unique<optim::DistributedOptimizer>(sgd, model->named_parameters());
  }
  optim::Optimizer& optimizer = distributed ? static_cast<optim::Optimizer&>(*distributed) : sgd;

  // Rank 0 resumes from the checkpoint, if any; the epoch count tells the others (-1: failed).
  std::int64_t start_epoch = 0;
  if (root && !flags.checkpoint.empty() && std::filesystem::exists(flags.checkpoint)) {
    try {
      start_epoch = load_checkpoint(flags.checkpoint, *model, optimizer, flags.epochs);
      std::printf("resuming from %s after epoch %lld\n", flags.checkpoint.c_str(),
                  static_cast<long long>(start_epoch));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
      start_epoch = -1;
    }
  }
  tutti::broadcast(TensorView(&start_epoch, {}), 0, "checkpoint.epoch");
  if (start_epoch < 0) return 1;
  // Every rank starts from rank 0's state: its initial weights or the checkpoint it loaded
  // (DDP's constructor broadcasts the parameters and buffers itself).
  std::unique_ptr<nn::DistributedDataParallel> ddp;
  auto powersgd = std::make_shared<nn::hooks::PowerSGDState>();
  if (flags.wrapper == "ddp") {
    ddp = std::make_unique<nn::DistributedDataParallel>(model);
    powersgd->matrix_approximation_rank = flags.powersgd_rank;
    powersgd->start_powerSGD_iter = flags.powersgd_start;
    if (flags.hook == "allreduce") ddp->register_comm_hook(nn::hooks::allreduce());
    if (flags.hook == "fp16") ddp->register_comm_hook(nn::hooks::fp16_compress());
    if (flags.hook == "powersgd") ddp->register_comm_hook(nn::hooks::powersgd(powersgd));
  } else {
    optim::broadcast_parameters(model->named_parameters(), 0);
    optim::broadcast_parameters(model->named_buffers(), 0);
  }
  optim::broadcast_optimizer_state(optimizer, 0);
  nn::Module& net = ddp ? static_cast<nn::Module&>(*ddp) : *model;
  std::optional<nn::PeriodicModelAverager> averager;
  if (flags.wrapper == "localsgd") averager.emplace(flags.period, flags.warmup_steps);

  const auto n_train = static_cast<std::size_t>(train_set.labels.num_elements());
  const std::size_t n = flags.limit > 0 ? std::min(flags.limit, n_train) : n_train;
  tutti::data::DistributedSampler sampler(n, tutti::size(), tutti::rank(), true, flags.seed);
  const std::size_t steps = (sampler.num_samples() + flags.batch_size - 1) / flags.batch_size;
  if (root) {
    const std::string wrapper =
        ddp ? "DistributedDataParallel" + (flags.hook.empty() ? "" : " (hook " + flags.hook + ")")
        : averager ? "local SGD, period " + std::to_string(flags.period) + " after " +
                         std::to_string(flags.warmup_steps) + " steps"
                   : "DistributedOptimizer";
    std::printf("%s, %s, %d ranks, %zu training images, batch %zu per rank, lr %g x %d\n",
                flags.model.c_str(), wrapper.c_str(), tutti::size(), n, flags.batch_size, flags.lr,
                tutti::size());
  }
  double accuracy = start_epoch < flags.epochs ? 0.0 : evaluate(*model, test_set);
  for (int epoch = static_cast<int>(start_epoch); epoch < flags.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    sampler.set_epoch(epoch);  // A new shuffle each epoch, the same on every rank.
    const std::vector<std::size_t> indices = sampler.indices();
    double loss_sum = 0, window_sum = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      sgd.set_lr(learning_rate(flags, epoch * steps + step, steps));
      const std::size_t begin = step * flags.batch_size;
      auto [images, labels] =
          make_batch(train_set, indices, begin, std::min(begin + flags.batch_size, indices.size()));
      optimizer.zero_grad();
      nn::Variable loss = nn::cross_entropy(net.forward(images), labels);
      loss.backward();  // The gradients' allreduces start here (per parameter, or per bucket).
      optimizer.step();
      if (averager) averager->average_parameters(model->named_parameters());
      const double value = loss.value().span<float>()[0];
      loss_sum += value;
      window_sum += value;
      if (root && (step + 1) % 100 == 0) {
        std::printf("epoch %d [%zu/%zu] loss %.3f\n", epoch + 1,
                    std::min((step + 1) * flags.batch_size * tutti::size(), n), n,
                    window_sum / 100);
        std::fflush(stdout);
        window_sum = 0;
      }
    }
    double mean_loss = loss_sum / static_cast<double>(steps);
    tutti::allreduce(TensorView(&mean_loss, {}), "train.loss");  // Averaged over the ranks.
    accuracy = evaluate(*model, test_set);
    if (!flags.checkpoint.empty()) {
      std::int32_t saved = 1;
      if (root) {
        try {
          save_checkpoint(flags.checkpoint, epoch + 1, *model, optimizer);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
          saved = 0;
        }
      }
      tutti::broadcast(TensorView(&saved, {}), 0, "checkpoint.saved");  // A failure stops all.
      if (!saved) return 1;
    }
    if (root) {  // The time covers training, evaluation and the checkpoint.
      const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
      std::printf("epoch %d: train loss %.4f, test accuracy %.2f%%, %.1f s\n", epoch + 1, mean_loss,
                  accuracy, seconds.count());
    }
  }
  if (root && flags.hook == "powersgd") {
    std::printf("PowerSGD rank %d: %.1fx fewer gradient elements sent in compressed steps\n",
                flags.powersgd_rank,
                static_cast<double>(powersgd->total_numel_before_compression) /
                    static_cast<double>(
                        std::max<std::int64_t>(1, powersgd->total_numel_after_compression)));
  }
  if (root && averager) {
    std::printf("local SGD: %lld parameter averages in %lld steps\n",
                static_cast<long long>(averager->num_averages()),
                static_cast<long long>(averager->step()));
  }
  if (root) std::printf("final test accuracy: %.2f%%\n", accuracy);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tutti::init();
  const std::optional<Flags> flags = parse_flags(argc, argv);
  if (!flags) {
    if (tutti::rank() == 0) std::fputs(kUsage, stderr);
    tutti::shutdown();
    return 2;
  }
  int status = 1;
  try {
    status = train(*flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: rank %d: %s\n", tutti::rank(), e.what());
  }
  tutti::shutdown();
  return status;
}

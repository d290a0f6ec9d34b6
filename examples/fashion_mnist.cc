// SPDX-License-Identifier: Apache-2.0
// Data-parallel training of an MLP or a small CNN on Fashion-MNIST: every rank trains on its
// DistributedSampler shard, the gradients are averaged while backward() runs (the Horovod way,
// DistributedOptimizer, or the PyTorch way, DistributedDataParallel), the learning rate is
// scaled by the number of ranks, and rank 0's initial (or checkpointed) state is broadcast to
// all. With --elastic the job survives losing a host and grows when one is added (tuttirun's
// elastic mode relaunches it; README, Elastic training).
//
// Usage: scripts/tuttirun -np 2 build/examples/fashion_mnist [--model mlp|cnn] [--epochs N]
//          [--batch-size B] [--lr LR] [--data-dir DIR] [--checkpoint FILE] [--seed S] [--limit N]
//          [--wrapper optimizer|ddp|localsgd|zero] [--hook allreduce|fp16|powersgd]
//          [--powersgd-rank R] [--powersgd-start N] [--period K] [--warmup-steps W]
//          [--elastic [--commit-every N]]
//        scripts/tuttirun --host-discovery-script hosts.sh --min-np 1
//          build/examples/fashion_mnist --elastic
//   --model       mlp (784-512-256-10 with BatchNorm, default) or cnn (2 x conv-BN-ReLU-pool,
//                 fc 128, fc 10)
//   --wrapper     optimizer (default): optim::DistributedOptimizer around SGD; ddp:
//                 nn::DistributedDataParallel around the model, plain SGD (which also
//                 broadcasts rank 0's BatchNorm statistics before every step); localsgd: no
//                 gradient averaging, plain SGD on every rank and nn::PeriodicModelAverager
//                 averaging the parameters every --period steps after --warmup-steps (defaults
//                 4 and 0); the test accuracy is rank 0's replica's; zero:
//                 optim::ZeroRedundancyOptimizer around SGD, stage 2 (it averages the
//                 gradients itself, each rank keeps the momentum of its shard of the
//                 parameters); not with --checkpoint (--elastic commits its state)
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
//                 epochs done than --epochs is refused (exit 1) and left as it is. It holds the
//                 model and the SGD state: a resumed run ends bit-identical to an uninterrupted
//                 one with the default wrapper and with ddp, but the averager's step count
//                 (localsgd) and PowerSGD's state start afresh, warm-up included, so those
//                 runs end slightly differently
//   --seed        initial weights and shuffling, default 42
//   --limit       train on the first N images only (quick tests)
//   --elastic     commit the training state (tutti::elastic::State) every --commit-every steps
//                 (default 100) and at each epoch's end, under TUTTI_ELASTIC_DIR (which
//                 tuttirun's elastic mode sets), and resume from the last commit when
//                 relaunched, at any rank count; not with --checkpoint. PowerSGD's error
//                 feedback and the averager's step count are not committed: a relaunched job
//                 starts them afresh (PowerSGD's warm-up of plain allreduces included). The
//                 epoch's loss so far is committed too, so a resumed epoch prints the mean of
//                 all its steps
// Rank 0 prints progress, a line per epoch and, last, "final test accuracy: XX.XX%".
// Exit status: 0 (--help too); 1 for missing data, a bad checkpoint or a runtime error; 2 for
// bad flags (a flag of a wrapper or hook not chosen included, such as --period without
// --wrapper localsgd, which would be ignored); with --elastic, 75 when the job stopped to be
// relaunched (tutti::elastic::kRelaunchExitCode).
#include <tutti/data.h>
#include <tutti/elastic.h>
#include <tutti/nn.h>
#include <tutti/optim.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "examples/flag_reader.h"
#include "fashion_mnist_checkpoint.h"

namespace {

namespace nn = tutti::nn;
namespace optim = tutti::optim;
using tutti::Tensor;
using tutti::TensorView;
using tutti::examples::FlagReader;

constexpr char kUsage[] =
    "usage: fashion_mnist [--model mlp|cnn] [--epochs N] [--batch-size B] [--lr LR]\n"
    "                     [--data-dir DIR] [--checkpoint FILE] [--seed S] [--limit N]\n"
    "                     [--wrapper optimizer|ddp|localsgd|zero]\n"
    "                     [--hook allreduce|fp16|powersgd]\n"
    "                     [--powersgd-rank R] [--powersgd-start N] [--period K]\n"
    "                     [--warmup-steps W] [--elastic [--commit-every N]]\n";
// Fashion-MNIST's training-set pixel mean and standard deviation: centred inputs train faster.
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;

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
  bool elastic = false;
  std::size_t commit_every = 100;  // Steps, with --elastic.
};

constexpr std::int64_t kMaxCount = 1'000'000'000;  // Epochs, steps, images, seeds: a sanity bound.

// Why the flags given ask for something this run would not do (a flag of a mode not chosen,
// which it would ignore); empty if nothing.
std::string combination_fault(const Flags& f, const FlagReader& given) {
  if (given.given("--commit-every") && !f.elastic) return "--commit-every needs --elastic";
  if (f.elastic && !f.checkpoint.empty()) return "--elastic keeps its own state: no --checkpoint";
  if (f.wrapper == "zero" && !f.checkpoint.empty())
    return "--wrapper zero shards the optimizer state: --elastic commits it, --checkpoint does not";
  if (!f.hook.empty() && f.wrapper != "ddp") return "--hook needs --wrapper ddp";
  for (const char* flag : {"--period", "--warmup-steps"}) {
    if (given.given(flag) && f.wrapper != "localsgd")
      return std::string(flag) + " needs --wrapper localsgd";
  }
  for (const char* flag : {"--powersgd-rank", "--powersgd-start"}) {
    if (given.given(flag) && f.hook != "powersgd")
      return std::string(flag) + " needs --hook powersgd";
  }
  return "";
}

// Reads the flags into `f`; a fault or --help ends the reading (FlagReader::exit_status).
void parse_flags(FlagReader& flags, Flags& f) {
  const auto count = [&](std::int64_t min) { return flags.integer(min, kMaxCount); };
  while (flags.next()) {
    if (flags.is("--elastic"))  // The one flag without a value.
      f.elastic = true;
    else if (flags.is("--model"))
      f.model = flags.choice({"mlp", "cnn"});
    else if (flags.is("--epochs"))
      f.epochs = static_cast<int>(count(0));
    else if (flags.is("--batch-size"))
      f.batch_size = static_cast<std::size_t>(count(1));
    else if (flags.is("--lr"))
      f.lr = flags.positive_real();
    else if (flags.is("--data-dir"))
      f.data_dir = flags.text();
    else if (flags.is("--checkpoint"))
      f.checkpoint = flags.text();
    else if (flags.is("--seed"))
      f.seed = static_cast<std::uint64_t>(count(0));
    else if (flags.is("--limit"))
      f.limit = static_cast<std::size_t>(count(1));
    else if (flags.is("--wrapper"))
      f.wrapper = flags.choice({"optimizer", "ddp", "localsgd", "zero"});
    else if (flags.is("--hook"))
      f.hook = flags.choice({"allreduce", "fp16", "powersgd"});
    else if (flags.is("--powersgd-rank"))
      f.powersgd_rank = static_cast<int>(count(1));
    else if (flags.is("--powersgd-start"))
      f.powersgd_start = static_cast<int>(count(2));
    else if (flags.is("--period"))
      f.period = static_cast<int>(count(1));
    else if (flags.is("--warmup-steps"))
      f.warmup_steps = static_cast<int>(count(0));
    else if (flags.is("--commit-every"))
      f.commit_every = static_cast<std::size_t>(count(1));
    else
      flags.unknown();
  }
  flags.fail(combination_fault(f, flags));
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

// Horovod's recipe for a rate scaled by the rank count: warm up linearly from the single-rank
// rate over the first epoch, then decay to zero along a cosine. Ending at zero makes the final
// accuracy depend little on the rank count. `progress` counts epochs done (fractions too), so
// an elastic job that changes its rank count mid-epoch stays on the same curve.
double learning_rate(const Flags& flags, double progress) {
  const double peak = flags.lr * tutti::size();
  const double warm = std::min(1.0, progress);
  return (flags.lr + (peak - flags.lr) * warm) * 0.5 *
         (1 + std::cos(std::numbers::pi * progress / flags.epochs));
}

// The data, the model and its optimizer on this rank; what both training loops share.
class Training {
 public:
  explicit Training(const Flags& flags) : flags_(flags) {}

  // Every rank reads the files itself; agree on the outcome so no rank goes on alone. False
  // (on every rank) if any rank has no data.
  bool load_data() {
    std::string error;
    try {
      train_set = tutti::data::load_mnist_idx(flags_.data_dir, true);
      test_set = tutti::data::load_mnist_idx(flags_.data_dir, false);
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
                   flags_.data_dir.c_str(), error.c_str());
    }
    const auto n_train = static_cast<std::size_t>(train_set.labels.num_elements());
    samples = flags_.limit > 0 ? std::min(flags_.limit, n_train) : n_train;
    return first_failed == INT_MAX;
  }

  // The Horovod way wraps the optimizer; the PyTorch way (wrap_model(), after the state is
  // loaded) wraps the model and keeps the plain SGD.
  void build_model() {
    nn::manual_seed(flags_.seed);
    model = make_model(flags_.model);
    const optim::SGDOptions options{.lr = flags_.lr, .momentum = 0.9};
    if (flags_.wrapper == "zero") {
      // Stage 2: the model is not wrapped; step() averages each gradient into its owner.
      zero = std::make_unique<optim::ZeroRedundancyOptimizer>(
          model->named_parameters(),
          [options](std::vector<nn::Variable> shard) {
            return std::make_unique<optim::SGD>(std::move(shard), options);
          },
          optim::ZeroOptions{.shard_gradients = true});
      return;
    }
    std::vector<nn::Variable> params;
    for (auto& [name, p] : model->named_parameters()) params.push_back(p);
    sgd = std::make_unique<optim::SGD>(params, options);
    if (flags_.wrapper == "optimizer") {
      distributed = std::make_unique<optim::DistributedOptimizer>(*sgd, model->named_parameters());
    }
  }
  optim::Optimizer& optimizer() const {
    if (zero) return *zero;
    return distributed ? static_cast<optim::Optimizer&>(*distributed) : *sgd;
  }
  // The SGD whose learning rate the schedule sets: with ZeRO, the one over this rank's shard.
  optim::SGD& rate_sgd() const {
    return zero ? static_cast<optim::SGD&>(zero->local_optimizer()) : *sgd;
  }
  // DDP's constructor broadcasts the parameters and buffers itself; --hook replaces its own
  // averaging. Local SGD averages the parameters after the steps instead.
  void wrap_model() {
    if (flags_.wrapper == "ddp") {
      ddp = std::make_unique<nn::DistributedDataParallel>(model);
      powersgd->matrix_approximation_rank = flags_.powersgd_rank;
      powersgd->start_powerSGD_iter = flags_.powersgd_start;
      if (flags_.hook == "allreduce") ddp->register_comm_hook(nn::hooks::allreduce());
      if (flags_.hook == "fp16") ddp->register_comm_hook(nn::hooks::fp16_compress());
      if (flags_.hook == "powersgd") ddp->register_comm_hook(nn::hooks::powersgd(powersgd));
    }
    if (flags_.wrapper == "localsgd") averager.emplace(flags_.period, flags_.warmup_steps);
  }
  void print_setup() const {
    if (tutti::rank() != 0) return;
    const std::string wrapper =
        ddp ? "DistributedDataParallel" + (flags_.hook.empty() ? "" : " (hook " + flags_.hook + ")")
        : averager ? "local SGD, period " + std::to_string(flags_.period) + " after " +
                         std::to_string(flags_.warmup_steps) + " steps"
        : zero ? "ZeroRedundancyOptimizer (stage 2)"
               : "DistributedOptimizer";
    std::printf("%s, %s, %d ranks, %zu training images, batch %zu per rank, lr %g x %d\n",
                flags_.model.c_str(), wrapper.c_str(), tutti::size(), samples, flags_.batch_size,
                flags_.lr, tutti::size());
  }
  // Rank 0's summary of the hook's or the averager's work, at the end.
  void print_communication() const {
    if (tutti::rank() != 0) return;
    if (flags_.hook == "powersgd") {
      std::printf("PowerSGD rank %d: %.1fx fewer gradient elements sent in compressed steps\n",
                  flags_.powersgd_rank,
                  static_cast<double>(powersgd->total_numel_before_compression) /
                      static_cast<double>(
                          std::max<std::int64_t>(1, powersgd->total_numel_after_compression)));
    }
    if (averager) {
      std::printf("local SGD: %lld parameter averages in %lld steps\n",
                  static_cast<long long>(averager->num_averages()),
                  static_cast<long long>(averager->step()));
    }
  }

  // One step on indices[begin, end) at the rate for `progress`; returns the batch's loss.
  double step(const std::vector<std::size_t>& indices, std::size_t begin, std::size_t end,
              double progress) {
    rate_sgd().set_lr(learning_rate(flags_, progress));
    auto [images, labels] = make_batch(train_set, indices, begin, end);
    optim::Optimizer& o = optimizer();
    o.zero_grad();
    nn::Module& net = ddp ? static_cast<nn::Module&>(*ddp) : *model;
    nn::Variable loss = nn::cross_entropy(net.forward(images), labels);
    loss.backward();  // The gradients' allreduces start here (per parameter, or per bucket).
    o.step();
    if (averager) averager->average_parameters(model->named_parameters());
    return loss.value().span<float>()[0];
  }

  // Rank 0's line of progress every 100 steps, and the mean loss of an epoch's steps.
  void note_loss(double loss, std::size_t step, int epoch, std::size_t seen) {
    loss_sum_ += loss;
    window_sum_ += loss;
    ++steps_;
    if (tutti::rank() == 0 && (step + 1) % 100 == 0) {
      std::printf("epoch %d [%zu/%zu] loss %.3f\n", epoch + 1, seen, samples, window_sum_ / 100);
      std::fflush(stdout);
      window_sum_ = 0;
    }
  }
  // With --elastic, before each commit (collective): moves the steps since the last fold into
  // `committed_loss`, their loss sum averaged over the ranks (every rank makes as many steps:
  // the sampler pads), so that a relaunched job's end_epoch() counts the steps before it.
  void fold_loss() {
    double sum = loss_sum_;
    tutti::allreduce(TensorView(&sum, {}), "train.loss.fold");  // Averaged over the ranks.
    double folded_sum = 0;
    std::int64_t folded_steps = 0;
    read_committed_loss(folded_sum, folded_steps);
    folded_sum += sum;
    folded_steps += static_cast<std::int64_t>(steps_);
    std::memcpy(committed_loss.data(), &folded_sum, sizeof folded_sum);
    std::memcpy(committed_loss.data() + sizeof folded_sum, &folded_steps, sizeof folded_steps);
    loss_sum_ = 0;
    steps_ = 0;
  }

  // Ends an epoch: the mean loss of its steps over the ranks, and the test accuracy.
  double end_epoch(int epoch, std::chrono::steady_clock::time_point start) {
    double sum = loss_sum_;
    tutti::allreduce(TensorView(&sum, {}), "train.loss");  // Averaged over the ranks.
    double folded_sum = 0;
    std::int64_t folded_steps = 0;
    read_committed_loss(folded_sum, folded_steps);
    const std::int64_t steps = folded_steps + static_cast<std::int64_t>(steps_);
    const double mean_loss = steps > 0 ? (folded_sum + sum) / static_cast<double>(steps) : 0.0;
    std::fill(committed_loss.begin(), committed_loss.end(), 0);
    loss_sum_ = window_sum_ = 0;
    steps_ = 0;
    const double accuracy = evaluate(*model, test_set);
    if (tutti::rank() == 0) {  // The time covers training and evaluation.
      const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
      std::printf("epoch %d: train loss %.4f, test accuracy %.2f%%, %.1f s\n", epoch + 1, mean_loss,
                  accuracy, seconds.count());
    }
    return accuracy;
  }

  tutti::data::ImageDataset train_set, test_set;
  std::size_t samples = 0;  // Training images used (--limit).
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::SGD> sgd;
  std::unique_ptr<optim::DistributedOptimizer> distributed;
  std::unique_ptr<optim::ZeroRedundancyOptimizer> zero;  // --wrapper zero; then no sgd.
  std::unique_ptr<nn::DistributedDataParallel> ddp;
  std::shared_ptr<nn::hooks::PowerSGDState> powersgd = std::make_shared<nn::hooks::PowerSGDState>();
  std::optional<nn::PeriodicModelAverager> averager;  // --wrapper localsgd.
  // The epoch's steps before the last fold_loss(): their loss sum (averaged over the ranks),
  // then their count, as a double and an int64 (bytes, which elastic::State commits).
  std::vector<std::uint8_t> committed_loss = std::vector<std::uint8_t>(16, 0);

 private:
  void read_committed_loss(double& sum, std::int64_t& steps) const {
    std::memcpy(&sum, committed_loss.data(), sizeof sum);
    std::memcpy(&steps, committed_loss.data() + sizeof sum, sizeof steps);
  }

  const Flags& flags_;
  double loss_sum_ = 0, window_sum_ = 0;
  std::size_t steps_ = 0;
};

// The plain loop: rank 0 resumes from --checkpoint, if any, and rewrites it after each epoch.
int train(const Flags& flags, Training& t) {
  const bool root = tutti::rank() == 0;
  optim::Optimizer& optimizer = t.optimizer();
  // Rank 0 resumes from the checkpoint, if any; the epoch count tells the others (-1: failed).
  std::int64_t start_epoch = 0;
  if (root && !flags.checkpoint.empty() && std::filesystem::exists(flags.checkpoint)) {
    try {
      start_epoch =
          fashion_mnist::load_checkpoint(flags.checkpoint, *t.model, optimizer, flags.epochs);
      std::printf("resuming from %s after epoch %lld\n", flags.checkpoint.c_str(),
                  static_cast<long long>(start_epoch));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
      start_epoch = -1;
    }
  }
  tutti::broadcast(TensorView(&start_epoch, {}), 0, "checkpoint.epoch");
  if (start_epoch < 0) return 1;
  // Every rank starts from rank 0's state: its initial weights or the checkpoint it loaded.
  t.wrap_model();
  if (!t.ddp) {
    optim::broadcast_parameters(t.model->named_parameters(), 0);
    optim::broadcast_parameters(t.model->named_buffers(), 0);
  }
  // ZeRO's state starts empty on every rank (and is sharded: no checkpoint to send).
  if (!t.zero) optim::broadcast_optimizer_state(optimizer, 0);
  tutti::data::DistributedSampler sampler(t.samples, tutti::size(), tutti::rank(), true,
                                          flags.seed);
  const std::size_t steps = (sampler.num_samples() + flags.batch_size - 1) / flags.batch_size;
  t.print_setup();
  double accuracy = start_epoch < flags.epochs ? 0.0 : evaluate(*t.model, t.test_set);
  for (int epoch = static_cast<int>(start_epoch); epoch < flags.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    sampler.set_epoch(epoch);  // A new shuffle each epoch, the same on every rank.
    const std::vector<std::size_t> indices = sampler.indices();
    for (std::size_t step = 0; step < steps; ++step) {
      const std::size_t begin = step * flags.batch_size;
      const std::size_t end = std::min(begin + flags.batch_size, indices.size());
      const double progress = epoch + static_cast<double>(step) / static_cast<double>(steps);
      t.note_loss(t.step(indices, begin, end, progress), step, epoch,
                  std::min((step + 1) * flags.batch_size * tutti::size(), t.samples));
    }
    accuracy = t.end_epoch(epoch, start);
    if (!flags.checkpoint.empty()) {
      std::int32_t saved = 1;
      if (root) {
        try {
          fashion_mnist::save_checkpoint(flags.checkpoint, epoch + 1, *t.model, optimizer);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
          saved = 0;
        }
      }
      tutti::broadcast(TensorView(&saved, {}), 0, "checkpoint.saved");  // A failure stops all.
      if (!saved) return 1;
    }
  }
  t.print_communication();
  if (root) std::printf("final test accuracy: %.2f%%\n", accuracy);
  return 0;
}

// The elastic loop (--elastic): the model, its BatchNorm statistics, the optimizer, the
// sampler's place in the epoch and the epoch are committed every --commit-every steps and at
// each epoch's end; a relaunched job (tuttirun's elastic mode) resumes from the last commit,
// at whatever rank count it has. Returns elastic::run's status (75: relaunch me).
int train_elastic(const Flags& flags, Training& t) {
  const bool root = tutti::rank() == 0;
  t.wrap_model();
  tutti::data::DistributedSampler sampler(t.samples, tutti::size(), tutti::rank(), true,
                                          flags.seed);
  std::int64_t epoch = 0;
  tutti::elastic::State state("fashion_mnist");
  state.add("model", t.model->named_parameters());
  state.add("buffers", t.model->named_buffers());
  state.add("optimizer", t.optimizer());
  state.add("sampler", sampler);
  state.add("epoch", epoch);
  state.add("epoch_loss", t.committed_loss);
  // No reset callback is needed: the learning rate follows tutti::size() at every step, and
  // the sampler is built for this launch's ranks.
  int refused = 0;  // 1: the commit found is past --epochs (every rank restored the same).
  const int status = tutti::elastic::run(state, [&](tutti::elastic::State& s) {
    if (epoch > flags.epochs) {  // As --checkpoint refuses it: the run would be another one's.
      if (root) {
        std::fprintf(stderr,
                     "the commit in TUTTI_ELASTIC_DIR has %lld epochs done, more than "
                     "--epochs %d\n",
                     static_cast<long long>(epoch), flags.epochs);
      }
      refused = 1;
      return;
    }
    t.print_setup();
    if (root && s.commits() > 0) {
      std::printf("resumed at commit %lld: epoch %lld, %zu of its %zu images done\n",
                  static_cast<long long>(s.commits()), static_cast<long long>(epoch + 1),
                  sampler.position(), t.samples);
    }
    double accuracy = -1;
    std::size_t steps_done = 0;  // In this launch: commits every --commit-every of them.
    while (epoch < flags.epochs) {
      const auto start = std::chrono::steady_clock::now();
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));  // Keeps a resumed epoch's place.
      const std::vector<std::size_t> indices = sampler.indices();
      for (std::size_t begin = 0, step = 0; begin < indices.size();
           begin += flags.batch_size, ++step) {
        const std::size_t end = std::min(begin + flags.batch_size, indices.size());
        const double progress =
            static_cast<double>(epoch) +
            static_cast<double>(sampler.position()) / static_cast<double>(t.samples);
        const double loss = t.step(indices, begin, end, progress);
        sampler.advance(end - begin);
        t.note_loss(loss, step, static_cast<int>(epoch), sampler.position());
        if (++steps_done % flags.commit_every == 0) {
          t.fold_loss();
          s.commit();
        }
      }
      accuracy = t.end_epoch(static_cast<int>(epoch), start);
      ++epoch;  // Before the commit: a relaunch starts the next epoch, not this one's end.
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));
      s.commit();
    }
    if (accuracy < 0) accuracy = evaluate(*t.model, t.test_set);  // Relaunched after the end.
    t.print_communication();
    if (root) std::printf("final test accuracy: %.2f%%\n", accuracy);
  });
  return refused != 0 ? refused : status;
}

}  // namespace

int main(int argc, char** argv) {
  tutti::init();
  FlagReader reader("fashion_mnist", argc, argv);
  Flags flags;
  parse_flags(reader, flags);
  if (const std::optional<int> exit_status = reader.exit_status(kUsage, tutti::rank() == 0)) {
    tutti::shutdown();
    return *exit_status;
  }
  int status = 1;
  try {
    Training training(flags);
    if (training.load_data()) {
      training.build_model();
      status = flags.elastic ? train_elastic(flags, training) : train(flags, training);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: rank %d: %s\n", tutti::rank(), e.what());
  }
  tutti::shutdown();
  return status;
}

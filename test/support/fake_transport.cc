// SPDX-License-Identifier: Apache-2.0
#include "test/support/fake_transport.h"

#include <cstring>
#include <map>

#include "ops/convert.h"

namespace tutti::test {

struct FakeWorld::Shared {
  explicit Shared(int n) : size(n), mailboxes(static_cast<std::size_t>(n)) {}
  int size;
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::deque<ops::Message>> mailboxes;
  std::vector<std::deque<ops::Message>> rpc_mailboxes{
      static_cast<std::size_t>(size)};  // take_rpc_plane()'s.

  // One collective at a time per group of ranks: each rank posts its pointers, the last one
  // to arrive lets everyone compute, and the round ends when all have read.
  struct Round {
    int arrived = 0;
    int departed = 0;
    std::vector<const void*> inputs;
    std::vector<std::size_t> counts;
  };
  std::map<std::vector<int>, Round> rounds;
  std::map<std::vector<int>, std::uint64_t> generation;
};

namespace {

class FakeControlPlane final : public ops::ControlPlane {
 public:
  // `rpc` picks the mailboxes of the RPC planes, apart from negotiation's.
  FakeControlPlane(std::shared_ptr<FakeWorld::Shared> shared, int rank, bool rpc = false)
      : shared_(std::move(shared)),
        rank_(rank),
        boxes_(rpc ? &shared_->rpc_mailboxes : &shared_->mailboxes) {}
  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }
  Status send(int destination, std::string bytes) override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    (*boxes_)[static_cast<std::size_t>(destination)].push_back(
        ops::Message{.source = rank_, .bytes = std::move(bytes)});
    return Status();
  }
  Result<std::optional<ops::Message>> poll() override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    auto& box = (*boxes_)[static_cast<std::size_t>(rank_)];
    if (box.empty()) return std::optional<ops::Message>();
    ops::Message message = std::move(box.front());
    box.pop_front();
    return std::optional<ops::Message>(std::move(message));
  }
  bool sends_done() override { return true; }
  bool receiving() const override { return false; }  // Messages arrive whole.

 private:
  std::shared_ptr<FakeWorld::Shared> shared_;
  int rank_;
  std::vector<std::deque<ops::Message>>* boxes_;  // In *shared_; guarded by its mutex.
};

// Collectives through shared memory: every member publishes its input, then reads everyone's.
class FakeBackend final : public ops::Backend {
 public:
  FakeBackend(std::shared_ptr<FakeWorld::Shared> shared, std::vector<int> ranks, int rank)
      : shared_(std::move(shared)), ranks_(std::move(ranks)) {
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i] == rank) set_rank_ = static_cast<int>(i);
    }
  }
  std::string_view name() const override { return "fake"; }
  int rank() const override { return set_rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }

  Status allreduce(void* data, std::size_t count, DataType dtype, ops::WireOp op) override {
    std::vector<std::byte> result(count * element_size(dtype));
    exchange(data, count,
             [&](const std::vector<const void*>& inputs, const std::vector<std::size_t>&) {
               reduce(result.data(), inputs, 0, count, dtype, op);
             });
    if (count) std::memcpy(data, result.data(), result.size());
    return Status();
  }
  Status allgatherv(const void* input, void* output, std::span<const std::size_t> counts,
                    DataType dtype) override {
    return allgatherv_into(input, output, counts, dtype);
  }
  Status broadcast(void* data, std::size_t count, DataType dtype, int root) override {
    std::vector<std::byte> copy(count * element_size(dtype));
    exchange(data, count,
             [&](const std::vector<const void*>& inputs, const std::vector<std::size_t>&) {
               if (count)
                 std::memcpy(copy.data(), inputs[static_cast<std::size_t>(root)], copy.size());
             });
    if (count) std::memcpy(data, copy.data(), copy.size());
    return Status();
  }
  Status alltoallv(const void*, std::span<const std::size_t>, void*, std::span<const std::size_t>,
                   DataType) override {
    return Status(ErrorCode::Internal, "fake alltoallv is not implemented");
  }
  Status reducescatter(const void* input, void* output, std::span<const std::size_t> recv_counts,
                       DataType dtype, ops::WireOp op) override {
    std::size_t first = 0;
    for (int r = 0; r < set_rank_; ++r) first += recv_counts[static_cast<std::size_t>(r)];
    const std::size_t count = recv_counts[static_cast<std::size_t>(set_rank_)];
    exchange(input, 0,
             [&](const std::vector<const void*>& inputs, const std::vector<std::size_t>&) {
               reduce(output, inputs, first, count, dtype, op);
             });
    return Status();
  }
  Status barrier() override {
    exchange(nullptr, 0, [](const auto&, const auto&) {});
    return Status();
  }
  Status reduce(const void* input, void* output, std::size_t count, DataType dtype, ops::WireOp op,
                int root) override {
    std::vector<std::byte> result(count * element_size(dtype));
    exchange(input, count,
             [&](const std::vector<const void*>& inputs, const std::vector<std::size_t>&) {
               if (set_rank_ == root) reduce(result.data(), inputs, 0, count, dtype, op);
             });
    // After the exchange: the root's output may be its input, which the others read.
    if (set_rank_ == root && count) std::memcpy(output, result.data(), result.size());
    return Status();
  }
  Status gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                 DataType dtype, int root) override {
    if (set_rank_ != root) return allgatherv_into(input, nullptr, counts, dtype);
    return allgatherv_into(input, output, counts, dtype);
  }
  Status scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                  DataType dtype, int root) override {
    const std::size_t bytes = element_size(dtype);
    std::size_t first = 0;
    for (int r = 0; r < set_rank_; ++r) first += counts[static_cast<std::size_t>(r)];
    const std::size_t mine = counts[static_cast<std::size_t>(set_rank_)] * bytes;
    exchange(
        input, 0, [&](const std::vector<const void*>& inputs, const std::vector<std::size_t>&) {
          const auto* from = static_cast<const std::byte*>(inputs[static_cast<std::size_t>(root)]);
          if (mine) std::memcpy(output, from + first * bytes, mine);
        });
    return Status();
  }

 private:
  // Every member's input concatenated into `output`, unless it is null (a gather's non-root).
  Status allgatherv_into(const void* input, void* output, std::span<const std::size_t> counts,
                         DataType dtype) {
    const std::size_t bytes = element_size(dtype);
    exchange(input, counts[static_cast<std::size_t>(set_rank_)],
             [&](const std::vector<const void*>& inputs, const std::vector<std::size_t>& sizes) {
               auto* out = static_cast<std::byte*>(output);
               if (out == nullptr) return;
               for (std::size_t r = 0; r < inputs.size(); ++r) {
                 if (sizes[r]) std::memcpy(out, inputs[r], sizes[r] * bytes);
                 out += sizes[r] * bytes;
               }
             });
    return Status();
  }

  // Reduces elements [first, first + count) of every member's input into `output`, in double.
  static void reduce(void* output, const std::vector<const void*>& inputs, std::size_t first,
                     std::size_t count, DataType dtype, ops::WireOp op) {
    std::vector<double> acc(count), x(count);
    for (std::size_t r = 0; r < inputs.size(); ++r) {
      const auto* from = static_cast<const std::byte*>(inputs[r]) + first * element_size(dtype);
      ops::cpu::convert_scale(x.data(), DataType::Float64, from, dtype, count, 1.0);
      for (std::size_t i = 0; i < count; ++i) {
        if (r == 0)
          acc[i] = x[i];
        else if (op == ops::WireOp::Sum)
          acc[i] += x[i];
        else if (op == ops::WireOp::Min)
          acc[i] = std::min(acc[i], x[i]);
        else if (op == ops::WireOp::Max)
          acc[i] = std::max(acc[i], x[i]);
        else
          acc[i] *= x[i];
      }
    }
    ops::cpu::convert_scale(output, dtype, acc.data(), DataType::Float64, count, 1.0);
  }

  // Publishes (input, count), waits for every member, runs `read` over all inputs, and waits
  // until every member has read before anyone may reuse its buffer.
  template <class F>
  void exchange(const void* input, std::size_t count, F&& read) {
    std::unique_lock<std::mutex> lock(shared_->mutex);
    const std::uint64_t round_id = shared_->generation[ranks_];
    auto& round = shared_->rounds[ranks_];
    if (round.arrived == 0) {
      round.inputs.assign(ranks_.size(), nullptr);
      round.counts.assign(ranks_.size(), 0);
    }
    round.inputs[static_cast<std::size_t>(set_rank_)] = input;
    round.counts[static_cast<std::size_t>(set_rank_)] = count;
    if (++round.arrived == size()) shared_->cv.notify_all();
    shared_->cv.wait(
        lock, [&] { return round.arrived == size() || shared_->generation[ranks_] != round_id; });
    read(round.inputs, round.counts);
    if (++round.departed == size()) {
      round = {};
      ++shared_->generation[ranks_];
      shared_->cv.notify_all();
    } else {
      shared_->cv.wait(lock, [&] { return shared_->generation[ranks_] != round_id; });
    }
  }

  std::shared_ptr<FakeWorld::Shared> shared_;
  std::vector<int> ranks_;
  int set_rank_ = -1;
};

class FakeTransport final : public ops::Transport {
 public:
  FakeTransport(std::shared_ptr<FakeWorld::Shared> shared, int rank)
      : shared_(shared), plane_(shared, rank) {
    topology_.rank = rank;
    topology_.size = shared->size;
    topology_.local_rank = rank;
    topology_.local_size = shared->size;
  }
  const ops::Topology& topology() const override { return topology_; }
  ops::ControlPlane& control_plane() override { return plane_; }
  std::unique_ptr<ops::ControlPlane> take_rpc_plane() override {
    if (rpc_taken_) return nullptr;
    rpc_taken_ = true;
    return std::make_unique<FakeControlPlane>(shared_, topology_.rank, /*rpc=*/true);
  }
  Result<std::unique_ptr<ops::Backend>> create_backend(const std::vector<int>& ranks,
                                                       const ops::BackendOptions&) override {
    for (int r : ranks) {
      if (r == topology_.rank)
        return std::unique_ptr<ops::Backend>(std::make_unique<FakeBackend>(shared_, ranks, r));
    }
    return std::unique_ptr<ops::Backend>();
  }

 private:
  std::shared_ptr<FakeWorld::Shared> shared_;
  FakeControlPlane plane_;
  ops::Topology topology_;
  bool rpc_taken_ = false;
};

}  // namespace

FakeWorld::FakeWorld(int size) : size_(size), shared_(std::make_shared<Shared>(size)) {}

std::unique_ptr<ops::Transport> FakeWorld::transport(int rank) {
  return std::make_unique<FakeTransport>(shared_, rank);
}

void run_ranks(int size, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

}  // namespace tutti::test

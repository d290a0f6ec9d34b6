// SPDX-License-Identifier: Apache-2.0
// producer_streams() on a GPU (test/support/producer_stream.h): the legacy default stream and a
// non-blocking stream of the test's own. hold() enqueues a host function that blocks the stream
// until release(); write() enqueues cudaMemcpyAsync from page-locked memory, so the data lands
// only after the gate opens, as a slow kernel's output would.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "test/gpu/gpu_test_util.h"
#include "test/support/producer_stream.h"

namespace tutti::test {
namespace {

// Staging for the writes, allocated before any hold(): cudaMallocHost may wait for the device,
// and a held stream would never let it return.
constexpr std::size_t kStagingBytes = std::size_t{1} << 20;

// Opened by release(); the stream's host function waits on it (CUDA allows a host function to
// block; it holds back only the work behind it on that stream). At most kGateLimit: should a
// CUDA call of the test thread wait for the held stream (a driver that synchronizes inside
// cudaMalloc, say), the test then fails on its timing instead of hanging.
constexpr std::chrono::seconds kGateLimit{10};

struct Gate {
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;

  static void CUDART_CB wait(void* gate) {
    auto* self = static_cast<Gate*>(gate);
    std::unique_lock<std::mutex> lock(self->mutex);
    self->opened.wait_for(lock, kGateLimit, [self] { return self->open; });
  }
};

class CudaProducer final : public ProducerStream {
 public:
  CudaProducer(bool own_stream, std::string name) : name_(std::move(name)) {
    cuda_check(cudaSetDevice(test_device().index), "cudaSetDevice");
    if (own_stream) {
      cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags");
    }
    void* staging = nullptr;
    cuda_check(cudaMallocHost(&staging, kStagingBytes), "cudaMallocHost");
    staging_ = static_cast<std::byte*>(staging);
  }
  ~CudaProducer() override {
    // Destructors cannot report: open a gate a failed test left closed, then let the work
    // behind it finish before the stream and the staging memory go.
    try {
      release();
    } catch (const std::exception&) {
    }
    static_cast<void>(cudaStreamSynchronize(native()));
    if (stream_ != nullptr) static_cast<void>(cudaStreamDestroy(stream_));
    static_cast<void>(cudaFreeHost(staging_));
  }
  CudaProducer(const CudaProducer&) = delete;
  CudaProducer& operator=(const CudaProducer&) = delete;

  void* handle() override { return stream_; }
  std::string name() const override { return name_; }
  void hold() override {
    gate_ = std::make_unique<Gate>();
    cuda_check(cudaLaunchHostFunc(native(), &Gate::wait, gate_.get()), "cudaLaunchHostFunc");
  }
  void write(void* destination, const std::vector<std::byte>& bytes) override {
    if (bytes.empty()) return;
    if (used_ + bytes.size() > kStagingBytes) throw std::runtime_error("producer staging is full");
    std::memcpy(staging_ + used_, bytes.data(), bytes.size());
    cuda_check(cudaMemcpyAsync(destination, staging_ + used_, bytes.size(), cudaMemcpyHostToDevice,
                               native()),
               "cudaMemcpyAsync");
    used_ += (bytes.size() + 255) / 256 * 256;
  }
  void release() override {
    if (gate_ == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(gate_->mutex);
      gate_->open = true;
    }
    gate_->opened.notify_all();
    // The gate must outlive the host function: wait for the writes behind it too, then the
    // staging memory may be written again.
    cuda_check(cudaStreamSynchronize(native()), "cudaStreamSynchronize");
    gate_.reset();
    used_ = 0;
  }

 private:
  cudaStream_t native() const { return stream_ == nullptr ? cudaStreamLegacy : stream_; }

  std::string name_;
  cudaStream_t stream_ = nullptr;  // nullptr: the legacy default stream.
  std::byte* staging_ = nullptr;
  std::size_t used_ = 0;
  std::unique_ptr<Gate> gate_;
};

}  // namespace

std::vector<std::unique_ptr<ProducerStream>> producer_streams() {
  std::vector<std::unique_ptr<ProducerStream>> streams;
  streams.push_back(std::make_unique<CudaProducer>(false, "the legacy default stream"));
  streams.push_back(std::make_unique<CudaProducer>(true, "a stream of the application"));
  return streams;
}

}  // namespace tutti::test

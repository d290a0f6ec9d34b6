// SPDX-License-Identifier: Apache-2.0
// Collectives over device buffers through host memory: each call copies its device input to
// page-locked host memory, runs the host backend's collective (MPI) on it, and enqueues the
// copy of the result back. Works where NCCL cannot: without NCCL in the build, or with
// several ranks on one GPU (NCCL refuses two ranks on one device). Written against
// ops::DeviceOps only, so it is built everywhere and tested on the CPU over a simulated device.
#pragma once

#include <memory>

#include "ops/backend.h"
#include "ops/device_ops.h"

namespace tutti::ops::mpi {

// Communication thread only; calls are collective over `host`'s set, as every Backend's.
// Each call waits for the stream's earlier work (the fusion pack) before its host collective,
// and returns with the copy of the result into the device buffer enqueued on the stream:
// record an event on it to learn when the result is there (Note [Stream ordering] in
// ops/cuda/stream.h).
class HostStagedBackend final : public Backend {
 public:
  // `host` runs the collectives on host memory (the set's MPI backend); it must outlive this
  // backend. Local: communicates nothing.
  HostStagedBackend(Backend& host, DeviceStream stream) : host_(host), stream_(stream) {}

  std::string_view name() const override { return "MPI (host-staged device buffers)"; }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  Status allreduce(void* data, std::size_t count, DataType dtype, WireOp op) override;
  Status allgatherv(const void* input, void* output, std::span<const std::size_t> counts,
                    DataType dtype) override;
  Status broadcast(void* data, std::size_t count, DataType dtype, int root) override;
  Status alltoallv(const void* input, std::span<const std::size_t> send_counts, void* output,
                   std::span<const std::size_t> recv_counts, DataType dtype) override;
  Status reducescatter(const void* input, void* output, std::span<const std::size_t> recv_counts,
                       DataType dtype, WireOp op) override;
  Status barrier() override;
  Status reduce(const void* input, void* output, std::size_t count, DataType dtype, WireOp op,
                int root) override;
  Status gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                 DataType dtype, int root) override;
  Status scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                  DataType dtype, int root) override;
  Status adasum(void* data, std::span<const std::size_t> tensor_counts, DataType dtype) override;

 private:
  // A page-locked host buffer that grows to the largest call.
  struct Staging {
    std::shared_ptr<void> memory;
    std::size_t capacity = 0;
    void* get() const { return memory.get(); }
  };

  // Makes `staging` hold `bytes`. Growing frees the old memory, so it first waits for the
  // stream: the previous call's copy back may still read it.
  Status reserve(Staging& staging, std::size_t bytes);
  // Copies `bytes` of device memory into `staging` (reserved) and waits for the stream (and
  // so for everything enqueued before: the pack kernel, the last call's copy back).
  Status download(Staging& staging, const void* device_data, std::size_t bytes);
  // Enqueues the copy of `bytes` of `staging` into device memory.
  Status upload(void* device_data, const Staging& staging, std::size_t bytes);

  Backend& host_;
  DeviceStream stream_;
  Staging send_;
  Staging receive_;
};

}  // namespace tutti::ops::mpi

// SPDX-License-Identifier: Apache-2.0
// The Mover of one of Tutti's device streams: a device fusion buffer that grows to the
// largest batch, and copies gathered into one batched kernel launch per flush.
#pragma once

#include <memory>
#include <vector>

#include "ops/device_ops.h"
#include "src/core/execution/mover.h"

namespace tutti::core {

// Communication thread only. Every call enqueues on `stream` and returns; the batch's results
// are in place once an event recorded on the stream after it completes.
class DeviceMover final : public Mover {
 public:
  explicit DeviceMover(ops::DeviceStream stream) : stream_(stream) {}

  Result<std::byte*> scratch(std::size_t bytes) override;
  void copy(const ops::CopySpec& copy) override;
  Status zero(void* data, std::size_t bytes) override;
  Status flush() override;
  Result<Tensor> new_tensor(DataType dtype, Shape shape) override;
  std::size_t piece_bytes() const override { return 0; }

  ops::DeviceStream stream() const { return stream_; }
  // The fusion buffer, for an op in flight to keep alive until its event completes (growing
  // the buffer replaces it; the old one must outlive the work that reads it).
  std::shared_ptr<void> buffer() const { return buffer_; }

 private:
  ops::DeviceStream stream_;
  std::shared_ptr<void> buffer_;
  std::size_t capacity_ = 0;
  std::vector<ops::CopySpec> pending_;
};

}  // namespace tutti::core

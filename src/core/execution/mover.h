// SPDX-License-Identifier: Apache-2.0
// Where an executor's copies and scratch memory live: host memory (HostMover, copies run at
// once) or one of Tutti's device streams (DeviceMover, copies are gathered and launched as one
// batched kernel). The executor computes one layout per collective and moves data through
// this seam, so CPU and CUDA tensors share every line of it.
#pragma once

#include <cstddef>
#include <cstring>

#include "ops/convert.h"
#include "ops/device_ops.h"
#include "src/common/status.h"
#include "src/core/execution/fusion_buffer.h"
#include "tutti/tensor.h"

namespace tutti::core {

// Communication thread only.
class Mover {
 public:
  virtual ~Mover() = default;
  // Scratch memory of at least `bytes` (a fusion buffer), in this mover's memory and aligned
  // for any dtype; valid until the next call. Call it before the copies of a collective.
  virtual Result<std::byte*> scratch(std::size_t bytes) = 0;
  // destination[i] = destination_type(source[i] * factor), as ops::CopySpec describes; on a
  // device it runs at the next flush().
  virtual void copy(const ops::CopySpec& copy) = 0;
  // Zeroes `bytes` at `data` (a joined rank's contribution); ordered before the next flush's
  // collective.
  virtual Status zero(void* data, std::size_t bytes) = 0;
  // Runs (on a device: launches) every copy since the last flush. Call it before a backend
  // call reads their destinations, and after the last copy of a collective.
  virtual Status flush() = 0;
  // A new tensor in this mover's memory, for an op's output, which the op then writes whole
  // (its contents before are unspecified).
  virtual Result<Tensor> new_tensor(DataType dtype, Shape shape) = 0;
  // Bytes per piece when a large tensor is reduced in place (0 = whole): on the host pieces
  // that stay in cache between reduction and scaling pay off, on a device they do not.
  virtual std::size_t piece_bytes() const = 0;
};

class HostMover final : public Mover {
 public:
  explicit HostMover(std::size_t piece_bytes) : piece_bytes_(piece_bytes) {}

  Result<std::byte*> scratch(std::size_t bytes) override { return buffer_.get(bytes); }
  void copy(const ops::CopySpec& c) override {
    ops::cpu::convert_scale(c.destination, c.destination_type, c.source, c.source_type, c.count,
                            c.factor);
  }
  Status zero(void* data, std::size_t bytes) override {
    std::memset(data, 0, bytes);
    return Status();
  }
  Status flush() override { return Status(); }
  // Not zero-filled: every collective writes its output whole.
  Result<Tensor> new_tensor(DataType dtype, Shape shape) override {
    return Tensor::empty(dtype, std::move(shape));
  }
  std::size_t piece_bytes() const override { return piece_bytes_; }
  // Autotune's new piece size (the fusion threshold), from the next collective on.
  void set_piece_bytes(std::size_t piece_bytes) { piece_bytes_ = piece_bytes; }

 private:
  std::size_t piece_bytes_;
  FusionBuffer buffer_;
};

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// Helpers of tests that run Tutti's collectives over device tensors, on a real GPU (the gpu
// suite) or on the simulated device (test/support/sim_device.h, the mpi suite): values of any
// dtype to and from device memory through ops::DeviceOps, converted by ops::cpu::convert_scale
// (the CPU reference).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/convert.h"
#include "ops/device_ops.h"
#include "tutti/tensor.h"

namespace tutti::test {

// The device this rank's tensors go on. Defined by the test binary's main.
Device test_device();

// `values` in `dtype` (saturating, as the CPU conversion does).
inline std::vector<std::byte> encode(const std::vector<double>& values, DataType dtype) {
  std::vector<std::byte> bytes(values.size() * element_size(dtype));
  ops::cpu::convert_scale(bytes.data(), dtype, values.data(), DataType::Float64, values.size(),
                          1.0);
  return bytes;
}

inline std::vector<double> decode(const std::vector<std::byte>& bytes, DataType dtype) {
  std::vector<double> values(bytes.size() / element_size(dtype));
  ops::cpu::convert_scale(values.data(), DataType::Float64, bytes.data(), dtype, values.size(),
                          1.0);
  return values;
}

// Throws (failing the test case) when a device call made by a test fails.
inline void device_check(const Status& status, const char* what) {
  if (!status.ok())
    throw std::runtime_error(std::string(what) + ": " + std::string(status.message()));
}

// A tensor on test_device() holding `values` as `dtype`.
inline Tensor device_tensor(const std::vector<double>& values, DataType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape), test_device());
  const std::vector<std::byte> bytes = encode(values, dtype);
  if (!bytes.empty()) {
    device_check(ops::device_ops().copy_to_device(t.data(), bytes.data(), bytes.size(), t.device()),
                 "copy_to_device");
  }
  return t;
}

// The elements of a device tensor, as doubles.
inline std::vector<double> device_values(const TensorView& t) {
  std::vector<std::byte> bytes(t.byte_size());
  if (!bytes.empty()) {
    device_check(ops::device_ops().copy_to_host(bytes.data(), t.data(), bytes.size(), t.device()),
                 "copy_to_host");
  }
  return decode(bytes, t.dtype());
}

}  // namespace tutti::test

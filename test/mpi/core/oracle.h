// SPDX-License-Identifier: Apache-2.0
// Test data of any dtype and the plain-MPI oracle for allreduce (API.md's formula:
// postscale * sum(prescale * x) [/ size], truncated for integers that are scaled or averaged).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <mpi.h>

#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {

inline const std::vector<DataType> kAllDtypes = {
    DataType::UInt8,   DataType::Int8,    DataType::UInt16,  DataType::Int16,
    DataType::Int32,   DataType::Int64,   DataType::Float16, DataType::BFloat16,
    DataType::Float32, DataType::Float64, DataType::Bool};

inline double load(const std::byte* p, DataType dtype) {
  switch (dtype) {
    case DataType::UInt8: return *reinterpret_cast<const std::uint8_t*>(p);
    case DataType::Int8: return *reinterpret_cast<const std::int8_t*>(p);
    case DataType::UInt16: return *reinterpret_cast<const std::uint16_t*>(p);
    case DataType::Int16: return *reinterpret_cast<const std::int16_t*>(p);
    case DataType::Int32: return *reinterpret_cast<const std::int32_t*>(p);
    case DataType::Int64: return static_cast<double>(*reinterpret_cast<const std::int64_t*>(p));
    case DataType::Float16: return static_cast<float>(*reinterpret_cast<const float16*>(p));
    case DataType::BFloat16: return static_cast<float>(*reinterpret_cast<const bfloat16*>(p));
    case DataType::Float32: return *reinterpret_cast<const float*>(p);
    case DataType::Float64: return *reinterpret_cast<const double*>(p);
    case DataType::Bool: return *reinterpret_cast<const std::uint8_t*>(p);
  }
  return 0;
}

inline void store(std::byte* p, DataType dtype, double v) {
  switch (dtype) {
    case DataType::UInt8: *reinterpret_cast<std::uint8_t*>(p) = static_cast<std::uint8_t>(v); break;
    case DataType::Int8: *reinterpret_cast<std::int8_t*>(p) = static_cast<std::int8_t>(v); break;
    case DataType::UInt16:
      *reinterpret_cast<std::uint16_t*>(p) = static_cast<std::uint16_t>(v);
      break;
    case DataType::Int16: *reinterpret_cast<std::int16_t*>(p) = static_cast<std::int16_t>(v); break;
    case DataType::Int32: *reinterpret_cast<std::int32_t*>(p) = static_cast<std::int32_t>(v); break;
    case DataType::Int64: *reinterpret_cast<std::int64_t*>(p) = static_cast<std::int64_t>(v); break;
    case DataType::Float16: *reinterpret_cast<float16*>(p) = float16(static_cast<float>(v)); break;
    case DataType::BFloat16:
      *reinterpret_cast<bfloat16*>(p) = bfloat16(static_cast<float>(v));
      break;
    case DataType::Float32: *reinterpret_cast<float*>(p) = static_cast<float>(v); break;
    case DataType::Float64: *reinterpret_cast<double*>(p) = v; break;
    case DataType::Bool: *reinterpret_cast<std::uint8_t*>(p) = v != 0 ? 1 : 0; break;
  }
}

// Contiguous host data of any dtype, filled with small non-negative integers (or 1 and 2 for
// products) that depend on `seed` (usually the rank).
class HostTensor {
 public:
  HostTensor(DataType dtype, Shape shape, int seed, bool for_product)
      : dtype_(dtype), shape_(std::move(shape)) {
    const auto n = static_cast<std::size_t>(num_elements(shape_));
    bytes_.resize(std::max<std::size_t>(1, n * element_size(dtype_)));
    for (std::size_t i = 0; i < n; ++i) {
      const double v =
          dtype == DataType::Bool ? static_cast<double>((i + static_cast<std::size_t>(seed)) % 2)
          : for_product ? static_cast<double>((i + static_cast<std::size_t>(seed)) % 2 + 1)
                        : static_cast<double>((i * 3 + static_cast<std::size_t>(seed)) % 11);
      store(at(i), dtype_, v);
    }
  }
  TensorView view() { return TensorView(bytes_.data(), dtype_, shape_); }
  DataType dtype() const { return dtype_; }
  std::size_t count() const { return static_cast<std::size_t>(num_elements(shape_)); }
  std::vector<double> values() const {
    std::vector<double> out(count());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = load(at(i), dtype_);
    return out;
  }
  // Empty if every element equals `expected` (within the dtype's precision), else the first
  // difference.
  std::string compare(const std::vector<double>& expected) const {
    const std::vector<double> got = values();
    if (got.size() != expected.size()) return "size differs";
    const double tolerance = dtype_ == DataType::Float16 || dtype_ == DataType::BFloat16 ? 1e-2
                             : dtype_ == DataType::Float32                               ? 1e-6
                             : dtype_ == DataType::Float64                               ? 1e-12
                                                                                         : 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::abs(got[i] - expected[i]) > tolerance * std::max(1.0, std::abs(expected[i]))) {
        return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", expected " +
               std::to_string(expected[i]);
      }
    }
    return "";
  }

 private:
  std::byte* at(std::size_t i) { return bytes_.data() + i * element_size(dtype_); }
  const std::byte* at(std::size_t i) const { return bytes_.data() + i * element_size(dtype_); }
  DataType dtype_;
  Shape shape_;
  std::vector<std::byte> bytes_;
};

// The expected allreduce result of `t` (this rank's input) by plain MPI on MPI_COMM_WORLD.
// Collective.
inline std::vector<double> oracle_allreduce(const HostTensor& t, ReduceOp op, double prescale,
                                            double postscale, int size) {
  std::vector<double> v = t.values();
  MPI_Op mpi_op = op == ReduceOp::Min       ? MPI_MIN
                  : op == ReduceOp::Max     ? MPI_MAX
                  : op == ReduceOp::Product ? MPI_PROD
                                            : MPI_SUM;
  if (mpi_op == MPI_SUM) {
    for (double& x : v) x *= prescale;
  }
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, mpi_op,
                MPI_COMM_WORLD);
  const bool floating = is_floating(t.dtype());
  const bool scaled = op == ReduceOp::Average || prescale != 1.0 || postscale != 1.0;
  for (double& x : v) {
    if (mpi_op == MPI_SUM) x = x * postscale / (op == ReduceOp::Average ? size : 1);
    if (!floating && t.dtype() != DataType::Bool && scaled) x = std::trunc(x);
  }
  return v;
}

// Allreduces one tensor of every dtype, op and shape in `shapes` under `name` and compares
// each with oracle_allreduce. Empty if all match, else the first mismatch. Collective: every
// rank runs every case whatever it found, so that a mismatch on one rank cannot leave the
// others waiting in a collective it skipped.
inline std::string sweep_against_oracle(const std::vector<Shape>& shapes, const std::string& name) {
  std::string first_failure;
  for (DataType dtype : kAllDtypes) {
    for (ReduceOp op :
         {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
      if (dtype == DataType::Bool && op != ReduceOp::Min && op != ReduceOp::Max) continue;
      for (const Shape& shape : shapes) {
        HostTensor t(dtype, shape, world_rank(), op == ReduceOp::Product);
        const std::vector<double> expected = oracle_allreduce(t, op, 1.0, 1.0, world_size());
        tutti::allreduce(t.view(), name, {.op = op});
        const std::string failure = t.compare(expected);
        if (!failure.empty() && first_failure.empty()) {
          first_failure = std::string(to_string(dtype)) + " " + std::string(to_string(op)) + ", " +
                          std::to_string(shape.size()) + "-d, " + std::to_string(t.count()) +
                          " elements: " + failure;
        }
      }
    }
  }
  return first_failure;
}

}  // namespace tutti::test

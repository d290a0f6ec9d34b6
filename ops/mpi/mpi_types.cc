// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/mpi_types.h"

#include <atomic>
#include <climits>

#include "src/common/check.h"

namespace tutti::ops::mpi {

MPI_Datatype to_mpi_type(DataType dtype) {
  switch (dtype) {
    case DataType::UInt8: return MPI_UINT8_T;
    case DataType::Int8: return MPI_INT8_T;
    case DataType::UInt16: return MPI_UINT16_T;
    case DataType::Int16: return MPI_INT16_T;
    case DataType::Int32: return MPI_INT32_T;
    case DataType::Int64: return MPI_INT64_T;
    // Moved as raw 2-byte words; core never asks MPI to reduce them.
    case DataType::Float16:
    case DataType::BFloat16: return MPI_UINT16_T;
    case DataType::Float32: return MPI_FLOAT;
    case DataType::Float64: return MPI_DOUBLE;
    // MPI_C_BOOL admits only logical ops; 0/1 bytes under MIN/MAX are AND/OR.
    case DataType::Bool: return MPI_UINT8_T;
  }
  TUTTI_CHECK(false, "DataType ", static_cast<int>(dtype), " has no MPI type");
}

MPI_Op to_mpi_op(WireOp op) {
  switch (op) {
    case WireOp::Sum: return MPI_SUM;
    case WireOp::Min: return MPI_MIN;
    case WireOp::Max: return MPI_MAX;
    case WireOp::Product: return MPI_PROD;
  }
  TUTTI_CHECK(false, "WireOp ", static_cast<int>(op), " has no MPI_Op");
}

namespace {

constexpr std::size_t kDefaultMaxMpiCount = std::size_t{1} << 30;
std::atomic<std::size_t> g_max_mpi_count{kDefaultMaxMpiCount};

}  // namespace

std::size_t max_mpi_count() { return g_max_mpi_count.load(std::memory_order_relaxed); }

void set_max_mpi_count_for_testing(std::size_t count) {
  g_max_mpi_count.store(count == 0 ? kDefaultMaxMpiCount : count);
}

int to_mpi_count(std::size_t count) {
  TUTTI_CHECK(count <= static_cast<std::size_t>(INT_MAX), "count ", count,
              " exceeds MPI's int range");
  return static_cast<int>(count);
}

}  // namespace tutti::ops::mpi

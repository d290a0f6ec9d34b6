// SPDX-License-Identifier: Apache-2.0
// LibTorch's scalar types and Tutti's DataType, each way, for the adapter's files.
#pragma once

#include <torch/torch.h>

#include <optional>

#include "tutti/tensor.h"

namespace tutti::libtorch::internal {

inline std::optional<DataType> tutti_type(c10::ScalarType type) {
  switch (type) {
    case torch::kUInt8: return DataType::UInt8;
    case torch::kInt8: return DataType::Int8;
    case torch::kInt16: return DataType::Int16;
    case torch::kInt32: return DataType::Int32;
    case torch::kInt64: return DataType::Int64;
    case torch::kFloat16: return DataType::Float16;
    case torch::kBFloat16: return DataType::BFloat16;
    case torch::kFloat32: return DataType::Float32;
    case torch::kFloat64: return DataType::Float64;
    case torch::kBool: return DataType::Bool;
    default: return std::nullopt;
  }
}

inline std::optional<c10::ScalarType> torch_type(DataType type) {
  switch (type) {
    case DataType::UInt8: return torch::kUInt8;
    case DataType::Int8: return torch::kInt8;
    case DataType::Int16: return torch::kInt16;
    case DataType::Int32: return torch::kInt32;
    case DataType::Int64: return torch::kInt64;
    case DataType::Float16: return torch::kFloat16;
    case DataType::BFloat16: return torch::kBFloat16;
    case DataType::Float32: return torch::kFloat32;
    case DataType::Float64: return torch::kFloat64;
    case DataType::Bool: return torch::kBool;
    case DataType::UInt16: break;  // LibTorch 1.13 has no uint16.
  }
  return std::nullopt;
}

}  // namespace tutti::libtorch::internal

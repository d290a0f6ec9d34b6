// SPDX-License-Identifier: Apache-2.0
// DataType helpers, TensorView and Tensor.
#include "tutti/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "src/base/device_memory.h"
#include "src/base/dtype.h"
#include "src/base/shape.h"
#include "src/base/strings.h"

namespace tutti {

std::size_t element_size(DataType dtype) {
  switch (dtype) {
    case DataType::UInt8:
    case DataType::Int8:
    case DataType::Bool: return 1;
    case DataType::UInt16:
    case DataType::Int16:
    case DataType::Float16:
    case DataType::BFloat16: return 2;
    case DataType::Int32:
    case DataType::Float32: return 4;
    case DataType::Int64:
    case DataType::Float64: return 8;
  }
  throw Error(ErrorCode::InvalidArgument,
              detail::str_cat("unknown DataType ", static_cast<int>(dtype)));
}

namespace {

// An enum class holds any value of its underlying type: a tensor on an unknown kind of device
// would reach the coordinator, which takes its request for a corrupt message and stops the job.
void check_device(Device device) {
  if (device.kind != Device::Kind::CPU && device.kind != Device::Kind::CUDA) {
    throw Error(ErrorCode::InvalidArgument,
                detail::str_cat("unknown Device kind ", static_cast<int>(device.kind)));
  }
}

}  // namespace

std::string_view to_string(DataType dtype) {
  switch (dtype) {
    case DataType::UInt8: return "uint8";
    case DataType::Int8: return "int8";
    case DataType::UInt16: return "uint16";
    case DataType::Int16: return "int16";
    case DataType::Int32: return "int32";
    case DataType::Int64: return "int64";
    case DataType::Float16: return "float16";
    case DataType::BFloat16: return "bfloat16";
    case DataType::Float32: return "float32";
    case DataType::Float64: return "float64";
    case DataType::Bool: return "bool";
  }
  return "unknown";
}

bool is_floating(DataType dtype) { return detail::floating(dtype); }

// The errors, or 0 when a dimension is 0.
std::int64_t detail::checked_num_elements(std::span<const std::int64_t> shape) {
  for (std::int64_t d : shape) {
    if (d < 0) {
      throw Error(ErrorCode::InvalidArgument,
                  detail::str_cat("negative dimension in shape ", detail::shape_string(shape)));
    }
  }
  // Checked after every dimension is known non-negative, so that a zero anywhere makes the
  // product 0 even when the other dimensions alone would overflow.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::int64_t count = 1;
  for (std::int64_t d : shape) {
    if (__builtin_mul_overflow(count, d, &count)) {
      throw Error(ErrorCode::InvalidArgument,
                  detail::str_cat("shape ", detail::shape_string(shape),
                                  " has more elements than an int64 holds"));
    }
  }
  return count;
}

std::int64_t num_elements(const Shape& shape) { return detail::num_elements(shape); }

TensorView::TensorView(void* data, DataType dtype, Shape shape, Device device)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device) {
  check_device(device_);
  count_ = tutti::num_elements(shape_);
  const std::size_t element_bytes = element_size(dtype_);  // Rejects unknown dtypes.
  // Byte offsets (fusion, pieces, copies) are int64 and size_t: the size in bytes must fit.
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(count_, static_cast<std::int64_t>(element_bytes), &bytes)) {
    throw Error(ErrorCode::InvalidArgument,
                detail::str_cat("TensorView of shape ", detail::shape_string(shape_), " and dtype ",
                                to_string(dtype_), " is larger than an int64 of bytes"));
  }
  if (data_ == nullptr && count_ > 0) {
    throw Error(
        ErrorCode::InvalidArgument,
        detail::str_cat("TensorView of shape ", detail::shape_string(shape_), " has no data"));
  }
}

void TensorView::check_span(DataType requested) const {
  if (requested != dtype_) {
    throw Error(
        ErrorCode::InvalidArgument,
        detail::str_cat("span<", to_string(requested), "> of a ", to_string(dtype_), " tensor"));
  }
  if (device_.kind != Device::Kind::CPU) {
    throw Error(ErrorCode::InvalidArgument, "span() of a CUDA tensor: its memory is on the device");
  }
}

Tensor::Tensor(DataType dtype, Shape shape, Device device) {
  check_device(device);
  const std::int64_t count = tutti::num_elements(shape);
  const std::size_t bytes = static_cast<std::size_t>(count) * element_size(dtype);
  storage_ = base::allocate_zeroed(bytes, device);
  view_ = TensorView(storage_.get(), dtype, std::move(shape), device);
}

Tensor Tensor::empty(DataType dtype, Shape shape, Device device) {
  check_device(device);
  const std::int64_t count = tutti::num_elements(shape);
  const std::size_t bytes = static_cast<std::size_t>(count) * element_size(dtype);
  Tensor t;
  t.storage_ = base::allocate_uninitialized(bytes, device);
  t.view_ = TensorView(t.storage_.get(), dtype, std::move(shape), device);
  return t;
}

Tensor Tensor::clone() const {
  Tensor copy = empty(dtype(), shape(), device());
  base::copy_bytes(copy.data(), data(), byte_size(), device());
  return copy;
}

void Tensor::check_from(std::size_t count) const {
  if (count != static_cast<std::size_t>(num_elements())) {
    throw Error(ErrorCode::InvalidArgument,
                detail::str_cat("Tensor::from got ", count, " values for shape ",
                                detail::shape_string(shape()), " (", num_elements(), " elements)"));
  }
}

}  // namespace tutti

// SPDX-License-Identifier: Apache-2.0
// Data types, devices, non-owning TensorView and owning Tensor (API.md, "Tensors").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tutti/error.h"
#include "tutti/export.h"
#include "tutti/half.h"

namespace tutti {

// Element types. Float16 and BFloat16 are storage types (tutti::float16, tutti::bfloat16)
// that reductions widen to float32. Bool is one byte, 0 or 1.
enum class DataType : std::uint8_t {
  UInt8,
  Int8,
  UInt16,
  Int16,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Bool
};

// Bytes per element. Throws InvalidArgument for a value outside the enumeration.
TUTTI_API std::size_t element_size(DataType dtype);
// numpy's spelling: "uint8", "int8", ..., "float16", "bfloat16", "float32", "float64", "bool".
TUTTI_API std::string_view to_string(DataType dtype);
// True for Float16, BFloat16, Float32, Float64.
TUTTI_API bool is_floating(DataType dtype);

// The DataType of a C++ element type; does not compile for other types.
template <class T>
constexpr DataType data_type_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, std::uint8_t>)
    return DataType::UInt8;
  else if constexpr (std::is_same_v<U, std::int8_t>)
    return DataType::Int8;
  else if constexpr (std::is_same_v<U, std::uint16_t>)
    return DataType::UInt16;
  else if constexpr (std::is_same_v<U, std::int16_t>)
    return DataType::Int16;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return DataType::Int32;
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return DataType::Int64;
  else if constexpr (std::is_same_v<U, float16>)
    return DataType::Float16;
  else if constexpr (std::is_same_v<U, bfloat16>)
    return DataType::BFloat16;
  else if constexpr (std::is_same_v<U, float>)
    return DataType::Float32;
  else if constexpr (std::is_same_v<U, double>)
    return DataType::Float64;
  else if constexpr (std::is_same_v<U, bool>)
    return DataType::Bool;
  else
    static_assert(sizeof(U) == 0, "no tutti::DataType for this element type");
}

// Where a tensor's memory lives.
struct Device {
  enum class Kind : std::uint8_t { CPU, CUDA };
  Kind kind = Kind::CPU;
  int index = 0;  // CUDA device ordinal; 0 for the CPU.
  static Device cpu() { return Device{}; }
  static Device cuda(int index) { return Device{Kind::CUDA, index}; }
  friend bool operator==(const Device&, const Device&) = default;
};

using Shape = std::vector<std::int64_t>;

// Product of the dimensions (1 for a 0-d shape). Throws InvalidArgument for a negative one, or
// when the product overflows int64.
TUTTI_API std::int64_t num_elements(const Shape& shape);

namespace detail {
struct TensorViewAccess;
}  // namespace detail

// A non-owning view of contiguous, row-major memory. Copying a view copies the pointer.
// The memory must outlive every op the view is passed to (until its Handle is done).
class TUTTI_API TensorView {
 public:
  TensorView() = default;
  // Throws InvalidArgument for a negative dimension, a shape whose element count or size in
  // bytes overflows int64, or a null `data` with elements.
  TensorView(void* data, DataType dtype, Shape shape, Device device = Device::cpu());
  template <class T>
  TensorView(T* data, Shape shape, Device device = Device::cpu())
      : TensorView(static_cast<void*>(const_cast<std::remove_cv_t<T>*>(data)), data_type_of<T>(),
                   std::move(shape), device) {}

  void* data() const { return data_; }
  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  std::int64_t num_elements() const { return count_; }
  std::size_t byte_size() const { return static_cast<std::size_t>(count_) * element_size(dtype_); }

  // The elements as T. Throws InvalidArgument if T is not this view's dtype, or for a CUDA view.
  template <class T>
  std::span<T> span() const {
    check_span(data_type_of<T>());
    return {static_cast<T*>(data_), static_cast<std::size_t>(count_)};
  }

 private:
  friend struct detail::TensorViewAccess;  // Core's: Note [Views kept without their shapes].
  void check_span(DataType requested) const;

  void* data_ = nullptr;
  DataType dtype_ = DataType::Float32;
  Shape shape_;
  Device device_;
  std::int64_t count_ = 0;
};

// An owning, contiguous tensor. Copies share storage (like torch.Tensor); clone() copies data.
// A default-constructed Tensor is empty: no data, 0-d shape, zero elements.
class TUTTI_API Tensor {
 public:
  Tensor() = default;
  // Zero-filled. Throws InvalidArgument for a negative dimension, or a CUDA device in a
  // build without CUDA.
  Tensor(DataType dtype, Shape shape, Device device = Device::cpu());

  // Tutti addition (torch.empty): as the constructor, but a CPU tensor's contents are left
  // unspecified, which saves a pass over its memory where it is about to be overwritten whole
  // (the runtime makes collectives' outputs so). A CUDA tensor is zero-filled all the same.
  static Tensor empty(DataType dtype, Shape shape, Device device = Device::cpu());

  // Copies `values` (which must hold num_elements(shape) elements) into a new CPU tensor.
  template <class T>
  static Tensor from(std::span<const T> values, Shape shape) {
    Tensor t = empty(data_type_of<T>(), std::move(shape));
    t.check_from(values.size());
    std::copy(values.begin(), values.end(), static_cast<T*>(t.data()));
    return t;
  }

  Tensor clone() const;  // A new tensor with a copy of the data, on the same device.

  // Tutti addition: the num_elements(`shape`) elements that start `offset` elements into this
  // tensor, as a tensor of `shape` that shares this tensor's storage (and keeps it alive), so
  // that writes through either are seen by both. Copies of the result share it too; clone()
  // copies only the slice. nn::DistributedDataParallel makes parameters' gradients slices of
  // one contiguous bucket this way. Throws InvalidArgument if the range does not lie within
  // this tensor (or for a negative dimension).
  Tensor slice(std::int64_t offset, Shape shape) const {
    const std::int64_t count = tutti::num_elements(shape);
    if (offset < 0 || offset > num_elements() || count > num_elements() - offset) {
      // Offset and count, not the range's end: offset + count may pass int64.
      throw Error(ErrorCode::InvalidArgument,
                  "Tensor::slice: " + std::to_string(count) + " elements from element " +
                      std::to_string(offset) + " do not lie within a tensor of " +
                      std::to_string(num_elements()) + " elements");
    }
    Tensor part;
    part.storage_ = storage_;
    void* start =
        data() == nullptr
            ? nullptr
            : static_cast<void*>(static_cast<std::byte*>(data()) +
                                 static_cast<std::size_t>(offset) * element_size(dtype()));
    part.view_ = TensorView(start, dtype(), std::move(shape), device());
    return part;
  }
  operator TensorView() const { return view(); }  // NOLINT(google-explicit-constructor)
  TensorView view() const { return view_; }

  void* data() const { return view_.data(); }
  DataType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  Device device() const { return view_.device(); }
  int dim() const { return view_.dim(); }
  std::int64_t num_elements() const { return view_.num_elements(); }
  std::size_t byte_size() const { return view_.byte_size(); }
  template <class T>
  std::span<T> span() const {
    return view_.span<T>();
  }

 private:
  void check_from(std::size_t count) const;

  std::shared_ptr<void> storage_;
  TensorView view_;
};

}  // namespace tutti

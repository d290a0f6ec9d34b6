// SPDX-License-Identifier: Apache-2.0
// Eigen views over float32 Tensor storage and the argument-error helper shared by src/nn.
// Private to src/nn; the public headers never see Eigen.
#pragma once

#include <cstdint>
#include <string>

#include <Eigen/Core>

#include "src/base/strings.h"
#include "src/common/throw.h"
#include "tutti/error.h"
#include "tutti/tensor.h"

namespace tutti::nn::detail {

// Tensors are row-major, so every matrix view is too.
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

// The storage of a float32 tensor (which every Variable holds).
inline float* float_data(const Tensor& t) { return static_cast<float*>(t.data()); }

// `t` viewed as a rows x cols row-major matrix; rows * cols must be its element count.
inline MatrixMap as_matrix(const Tensor& t, std::int64_t rows, std::int64_t cols) {
  return MatrixMap(float_data(t), rows, cols);
}
// All elements of `t` as a flat array (element-wise math) or column vector (linear algebra).
inline ArrayMap as_array(const Tensor& t) { return ArrayMap(float_data(t), t.num_elements()); }
inline VectorMap as_vector(const Tensor& t) { return VectorMap(float_data(t), t.num_elements()); }

// A new zero-filled float32 tensor.
inline Tensor zeros(Shape shape) { return Tensor(DataType::Float32, std::move(shape)); }

// The project's string and error helpers (src/common), under the names nn has always used.
using ::tutti::detail::shape_string;
using ::tutti::detail::throw_invalid_argument;

}  // namespace tutti::nn::detail

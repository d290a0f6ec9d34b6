// SPDX-License-Identifier: Apache-2.0
// The differentiable functions of functional.h: element-wise arithmetic with single-element
// broadcasting, matmul, relu, the reductions and reshape.
#include "tutti/nn/functional.h"

#include <cstdint>
#include <utility>

#include "src/nn/autograd.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

using detail::as_array;
using detail::as_matrix;
using detail::float_data;
using detail::Gradients;
using detail::make_result;
using detail::shape_string;
using detail::zeros;

namespace {

// The shape of `a op b`; see functional.h for the broadcasting rule.
Shape broadcast_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() == b.shape() || b.num_elements() == 1) return a.shape();
  if (a.num_elements() == 1) return b.shape();
  detail::throw_invalid_argument("nn::operator", op, ": shapes ", shape_string(a.shape()), " and ",
                                 shape_string(b.shape()),
                                 " differ and neither side has a single element");
}

// `t` itself if it has `shape`, else (a single element broadcast) that element repeated.
Tensor expand(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  Tensor out = zeros(shape);
  as_array(out).setConstant(float_data(t)[0]);
  return out;
}

// The gradient of an operand of shape `shape` from the result's gradient `g`: `g` itself, or its
// sum when the operand was a broadcast single element. May share storage with `g`.
Tensor reduce_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor out = zeros(shape);
  float_data(out)[0] = as_array(g).sum();
  return out;
}

Tensor negated(const Tensor& t) {
  Tensor out = zeros(t.shape());
  as_array(out) = -as_array(t);
  return out;
}

Tensor product(const Tensor& a, const Tensor& b) {
  Tensor out = zeros(a.shape());
  as_array(out) = as_array(a) * as_array(b);
  return out;
}

// `shape` with a -1 replaced so that it holds `count` elements; see reshape() in functional.h.
Shape resolve_shape(Shape shape, std::int64_t count) {
  std::int64_t known = 1;
  std::size_t inferred = shape.size();
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && inferred == shape.size()) {
      inferred = i;
    } else if (shape[i] < 0) {
      detail::throw_invalid_argument("nn::reshape: invalid target shape ", shape_string(shape),
                                     " (at most one -1 and no other negative dimension)");
    } else {
      known *= shape[i];
    }
  }
  if (inferred < shape.size() && known > 0 && count % known == 0) shape[inferred] = count / known;
  if (inferred < shape.size() && shape[inferred] == -1) {
    detail::throw_invalid_argument("nn::reshape: cannot infer the -1 of ", shape_string(shape),
                                   " for ", count, " elements");
  }
  if (num_elements(shape) != count) {
    detail::throw_invalid_argument("nn::reshape: ", count, " elements cannot take shape ",
                                   shape_string(shape));
  }
  return shape;
}

}  // namespace

Variable operator+(const Variable& a, const Variable& b) {
  const Shape shape = broadcast_shape("+", a.value(), b.value());
  Tensor out = zeros(shape);
  as_array(out) = as_array(expand(a.value(), shape)) + as_array(expand(b.value(), shape));
  auto backward = [a_shape = a.value().shape(), b_shape = b.value().shape()](const Tensor& g) {
    return Gradients{reduce_to(g, a_shape), reduce_to(g, b_shape)};
  };
  return make_result(std::move(out), {a, b}, std::move(backward));
}

Variable operator-(const Variable& a, const Variable& b) {
  const Shape shape = broadcast_shape("-", a.value(), b.value());
  Tensor out = zeros(shape);
  as_array(out) = as_array(expand(a.value(), shape)) - as_array(expand(b.value(), shape));
  auto backward = [a_shape = a.value().shape(), b_shape = b.value().shape()](const Tensor& g) {
    return Gradients{reduce_to(g, a_shape), negated(reduce_to(g, b_shape))};
  };
  return make_result(std::move(out), {a, b}, std::move(backward));
}

Variable operator*(const Variable& a, const Variable& b) {
  const Shape shape = broadcast_shape("*", a.value(), b.value());
  const Tensor x = expand(a.value(), shape);
  const Tensor y = expand(b.value(), shape);
  Tensor out = zeros(shape);
  as_array(out) = as_array(x) * as_array(y);
  auto backward = [x, y, a_shape = a.value().shape(), b_shape = b.value().shape(),
                   a_needs = a.requires_grad(), b_needs = b.requires_grad()](const Tensor& g) {
    Gradients grads(2);
    if (a_needs) grads[0] = reduce_to(product(g, y), a_shape);
    if (b_needs) grads[1] = reduce_to(product(g, x), b_shape);
    return grads;
  };
  return make_result(std::move(out), {a, b}, std::move(backward));
}

Variable matmul(const Variable& a, const Variable& b) {
  const Tensor& x = a.value();
  const Tensor& y = b.value();
  if (x.dim() != 2 || y.dim() != 2 || x.shape()[1] != y.shape()[0]) {
    detail::throw_invalid_argument("nn::matmul needs [m, k] x [k, n], got ",
                                   shape_string(x.shape()), " x ", shape_string(y.shape()));
  }
  const std::int64_t m = x.shape()[0];
  const std::int64_t k = x.shape()[1];
  const std::int64_t n = y.shape()[1];
  Tensor out = zeros({m, n});
  as_matrix(out, m, n).noalias() = as_matrix(x, m, k) * as_matrix(y, k, n);
  auto backward = [x, y, m, k, n, a_needs = a.requires_grad(),
                   b_needs = b.requires_grad()](const Tensor& g) {
    Gradients grads(2);
    if (a_needs) {  // dA = G B^T
      grads[0] = zeros({m, k});
      as_matrix(grads[0], m, k).noalias() = as_matrix(g, m, n) * as_matrix(y, k, n).transpose();
    }
    if (b_needs) {  // dB = A^T G
      grads[1] = zeros({k, n});
      as_matrix(grads[1], k, n).noalias() = as_matrix(x, m, k).transpose() * as_matrix(g, m, n);
    }
    return grads;
  };
  return make_result(std::move(out), {a, b}, std::move(backward));
}

Variable relu(const Variable& x) {
  Tensor out = zeros(x.value().shape());
  as_array(out) = as_array(x.value()).max(0.0f);
  auto backward = [out](const Tensor& g) {
    Tensor grad = zeros(g.shape());
    // A product with the 0/1 mask vectorizes; select() does not.
    as_array(grad) = as_array(g) * (as_array(out) > 0.0f).cast<float>();
    return Gradients{std::move(grad)};
  };
  return make_result(out, {x}, std::move(backward));
}

Variable sum(const Variable& x) {
  Tensor out = zeros({});
  float_data(out)[0] = as_array(x.value()).sum();
  auto backward = [shape = x.value().shape()](const Tensor& g) {
    Tensor grad = zeros(shape);
    as_array(grad).setConstant(float_data(g)[0]);
    return Gradients{std::move(grad)};
  };
  return make_result(std::move(out), {x}, std::move(backward));
}

Variable mean(const Variable& x) {
  const std::int64_t count = x.value().num_elements();
  Tensor out = zeros({});
  float_data(out)[0] = as_array(x.value()).sum() / static_cast<float>(count);
  auto backward = [shape = x.value().shape(), count](const Tensor& g) {
    Tensor grad = zeros(shape);
    as_array(grad).setConstant(float_data(g)[0] / static_cast<float>(count));
    return Gradients{std::move(grad)};
  };
  return make_result(std::move(out), {x}, std::move(backward));
}

Variable reshape(const Variable& x, Shape shape) {
  Tensor out = zeros(resolve_shape(std::move(shape), x.value().num_elements()));
  as_array(out) = as_array(x.value());
  auto backward = [input_shape = x.value().shape()](const Tensor& g) {
    Tensor grad = zeros(input_shape);
    as_array(grad) = as_array(g);
    return Gradients{std::move(grad)};
  };
  return make_result(std::move(out), {x}, std::move(backward));
}

}  // namespace tutti::nn

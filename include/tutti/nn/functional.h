// SPDX-License-Identifier: Apache-2.0
// Differentiable functions on Variables, for custom modules and losses. Each records itself for
// backward() when an argument requires grad, exactly like the layers do.
#pragma once

#include "tutti/export.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::nn {

// Element-wise a + b, a - b and a * b. Either both have the same shape, which the result takes,
// or one side has a single element (any shape: [], [1], [1, 1]) that is broadcast over the other,
// whose shape the result takes (if both have one element and the shapes differ, `a`'s wins).
// Throws InvalidArgument for an empty Variable or any other pair of shapes.
TUTTI_API Variable operator+(const Variable& a, const Variable& b);
TUTTI_API Variable operator-(const Variable& a, const Variable& b);
TUTTI_API Variable operator*(const Variable& a, const Variable& b);

// The matrix product of a [m, k] and b [k, n]: [m, n]. Throws InvalidArgument unless both are
// 2-d with matching inner dimensions.
TUTTI_API Variable matmul(const Variable& a, const Variable& b);

// max(x, 0) element-wise, same shape. The gradient at exactly 0 is 0, as in PyTorch.
TUTTI_API Variable relu(const Variable& x);

// The sum and the mean of all elements, as a 0-d (one-element, shape []) Variable. The mean of
// zero elements is NaN, as in PyTorch.
TUTTI_API Variable sum(const Variable& x);
TUTTI_API Variable mean(const Variable& x);

// The same elements in row-major order under `shape`, which may contain one -1 standing for
// whatever makes the element counts match. The result is a copy, not a view.
// Throws InvalidArgument if the element counts differ, or for more than one -1 or another
// negative dimension.
TUTTI_API Variable reshape(const Variable& x, Shape shape);

}  // namespace tutti::nn

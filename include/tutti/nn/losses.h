// SPDX-License-Identifier: Apache-2.0
// Loss functions, each reducing to a 0-d Variable ready for backward().
#pragma once

#include "tutti/export.h"
#include "tutti/nn/variable.h"
#include "tutti/tensor.h"

namespace tutti::nn {

// Softmax cross-entropy, as torch.nn.functional.cross_entropy with its defaults: the mean over
// the batch of logsumexp(logits[i]) - logits[i][labels[i]], computed with a max-shifted
// (numerically stable) log-softmax. logits [n, classes], labels Int64 [n] in [0, classes).
// Returns a 0-d Variable. Throws InvalidArgument for other shapes, an empty batch, another label
// dtype, or a label out of range (naming it and its position).
TUTTI_API Variable cross_entropy(const Variable& logits, const Tensor& labels);

// Mean squared error over all elements: mean((prediction - target)^2), a 0-d Variable. `target`
// is float32 with as many elements as `prediction`, compared element by element in row-major
// order (its shape may differ, e.g. [n] against [n, 1]). No gradient flows into `target`.
// Throws InvalidArgument for another dtype or element count.
TUTTI_API Variable mse_loss(const Variable& prediction, const Tensor& target);

}  // namespace tutti::nn

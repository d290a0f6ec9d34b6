// SPDX-License-Identifier: Apache-2.0
// nn::Linear: the fully connected layer, with PyTorch's shapes, names and initialization.
#pragma once

#include <cstdint>

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/nn/variable.h"

namespace tutti::nn {

// y = x W^T + b. Parameters "weight" [out_features, in_features] and, with `bias`, "bias"
// [out_features], both drawn uniform in +-1/sqrt(in_features) from the generator (random.h),
// weight first, as PyTorch does.
// Throws InvalidArgument for a non-positive feature count.
class TUTTI_API Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true);

  // input [..., in_features] (at least 1-d) -> [..., out_features].
  // Throws InvalidArgument for another last dimension.
  Variable forward(const Variable& input) override;

  // Tutti additions: the registered parameters (shared); bias() is empty without a bias.
  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }

 private:
  std::int64_t in_features_;
  std::int64_t out_features_;
  Variable weight_;
  Variable bias_;
};

}  // namespace tutti::nn

// SPDX-License-Identifier: Apache-2.0
// nn::Flatten: [n, ...] -> [n, rest], for the step from convolutions to linear layers.
#pragma once

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/nn/variable.h"

namespace tutti::nn {

// [n, ...] -> [n, product of the rest] (a 1-d [n] becomes [n, 1]). A copy, not a view.
// Throws InvalidArgument for a 0-d input. No parameters.
class TUTTI_API Flatten : public Module {
 public:
  Variable forward(const Variable& input) override;
};

}  // namespace tutti::nn

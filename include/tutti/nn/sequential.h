// SPDX-License-Identifier: Apache-2.0
// nn::Sequential: a chain of modules applied in order.
#pragma once

#include <memory>
#include <vector>

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/nn/variable.h"

namespace tutti::nn {

// Applies its layers in order, each to the previous one's output. The layers are registered as
// children named "0", "1", ... in order, so parameters are named "0.weight", "2.bias", ...
// The layers are shared, not copied: a module added to two containers is one module.
class TUTTI_API Sequential : public Module {
 public:
  // Throws InvalidArgument for a null layer.
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers = {});

  // Appends `layer` and returns *this, for chaining: seq.add(a).add(b).
  // Throws InvalidArgument for a null layer.
  Sequential& add(std::shared_ptr<Module> layer);

  // The last layer's output; the input itself when there are no layers.
  Variable forward(const Variable& input) override;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace tutti::nn

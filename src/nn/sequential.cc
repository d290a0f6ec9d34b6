// SPDX-License-Identifier: Apache-2.0
// nn::Sequential: layers applied in order, registered as children "0", "1", ...
#include "tutti/nn/sequential.h"

#include <string>
#include <utility>

#include "src/nn/tensor_math.h"

namespace tutti::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> layers) {
  for (std::shared_ptr<Module>& layer : layers) add(std::move(layer));
}

Sequential& Sequential::add(std::shared_ptr<Module> layer) {
  if (!layer) {
    detail::throw_invalid_argument("Sequential::add: layer ", layers_.size(), " is null");
  }
  layers_.push_back(register_module(std::to_string(layers_.size()), std::move(layer)));
  return *this;
}

Variable Sequential::forward(const Variable& input) {
  Variable x = input;
  for (const std::shared_ptr<Module>& layer : layers_) x = layer->forward(x);
  return x;
}

}  // namespace tutti::nn

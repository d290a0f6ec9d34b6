// SPDX-License-Identifier: Apache-2.0
// The ResNet-50 gradient workload of DESIGN.md §6 as a trainable module, for the benchmarks of
// DDP's communication hooks (P12) and of ZeroRedundancyOptimizer (P13): torchvision's ResNet-50
// parameter shapes (161 tensors, 25,557,032 floats), checked against the element counts in
// examples/data/resnet50_grads.txt, with a forward pass whose backward produces a fixed
// pseudo-random gradient for every parameter, last layer first, as a real backward does.
// Header-only; uses the public API only.
#pragma once

#include <tutti/nn.h>
#include <tutti/tutti.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "examples/grad_list.h"

namespace tutti::examples {

// torchvision's resnet50() parameters in registration order: conv1, bn1, four layers of
// bottleneck blocks (conv1 1x1, bn1, conv2 3x3, bn2, conv3 1x1, bn3, and in each layer's first
// block a downsample conv 1x1 and bn), fc.
inline std::vector<std::pair<std::string, Shape>> resnet50_shapes() {
  std::vector<std::pair<std::string, Shape>> shapes;
  auto bn = [&](const std::string& name, std::int64_t c) {
    shapes.push_back({name + ".weight", {c}});
    shapes.push_back({name + ".bias", {c}});
  };
  shapes.push_back({"conv1.weight", {64, 3, 7, 7}});
  bn("bn1", 64);
  std::int64_t in = 64;
  const std::int64_t blocks[] = {3, 4, 6, 3};
  for (int layer = 0; layer < 4; ++layer) {
    const std::int64_t planes = 64 << layer;
    for (std::int64_t b = 0; b < blocks[layer]; ++b) {
      const std::string p = "layer" + std::to_string(layer + 1) + "." + std::to_string(b);
      shapes.push_back({p + ".conv1.weight", {planes, in, 1, 1}});
      bn(p + ".bn1", planes);
      shapes.push_back({p + ".conv2.weight", {planes, planes, 3, 3}});
      bn(p + ".bn2", planes);
      shapes.push_back({p + ".conv3.weight", {planes * 4, planes, 1, 1}});
      bn(p + ".bn3", planes * 4);
      if (b == 0) {
        shapes.push_back({p + ".downsample.0.weight", {planes * 4, in, 1, 1}});
        bn(p + ".downsample.1", planes * 4);
      }
      in = planes * 4;
    }
  }
  shapes.push_back({"fc.weight", {1000, 2048}});
  shapes.push_back({"fc.bias", {1000}});
  return shapes;
}

// Throws std::runtime_error unless the shapes, in backward (reverse) order, have the element
// `counts` (DESIGN.md's reference list, named `grads_file` in the message), so the two cannot
// drift apart.
inline void check_against_counts(const std::vector<std::pair<std::string, Shape>>& shapes,
                                 const std::vector<std::int64_t>& counts,
                                 const std::string& grads_file) {
  if (counts.size() != shapes.size()) {
    throw std::runtime_error(grads_file + ": " + std::to_string(counts.size()) +
                             " tensors, the ResNet-50 shapes have " +
                             std::to_string(shapes.size()));
  }
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const auto& [name, shape] = shapes[shapes.size() - 1 - i];
    if (num_elements(shape) != counts[i]) {
      throw std::runtime_error(grads_file + ": tensor " + std::to_string(i) + " has " +
                               std::to_string(counts[i]) + " elements, " + name + " has " +
                               std::to_string(num_elements(shape)));
    }
  }
}

// A module with the given parameters whose loss is Σ sum(p · g): backward() gives every
// parameter the fixed gradient g (uniform in ±1, different per parameter, equal on every rank
// unless `rank_seed` differs), in reverse registration order. `forward` ignores its input and
// returns that scalar, so a training step costs two multiply-adds per element.
class GradientModel : public nn::Module {
 public:
  GradientModel(const std::vector<std::pair<std::string, Shape>>& shapes, std::uint64_t seed) {
    std::mt19937_64 engine(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (const auto& [name, shape] : shapes) {
      Tensor value(DataType::Float32, shape);
      Tensor gradient(DataType::Float32, shape);
      for (float& v : value.span<float>()) v = 0.01f * uniform(engine);
      for (float& g : gradient.span<float>()) g = uniform(engine);
      std::string dotted = name;
      for (char& c : dotted) c = c == '.' ? '_' : c;  // Module names must not contain dots.
      parameters_.push_back(register_parameter(dotted, nn::Variable(value, true)));
      gradients_.emplace_back(gradient, false);
    }
  }

  nn::Variable forward(const nn::Variable&) override {
    nn::Variable loss = nn::sum(parameters_[0] * gradients_[0]);
    for (std::size_t i = 1; i < parameters_.size(); ++i) {
      loss = loss + nn::sum(parameters_[i] * gradients_[i]);
    }
    return loss;
  }

 private:
  std::vector<nn::Variable> parameters_;
  std::vector<nn::Variable> gradients_;
};

// The first `count` tensors in backward order (the last `count` in registration order), all for
// count <= 0 or beyond: smaller runs of the same workload for smoke tests.
inline std::vector<std::pair<std::string, Shape>> last_tensors(
    std::vector<std::pair<std::string, Shape>> shapes, int count) {
  if (count > 0 && static_cast<std::size_t>(count) < shapes.size()) {
    shapes.erase(shapes.begin(), shapes.end() - count);
  }
  return shapes;
}

// A benchmark's workload: the last `count` ResNet-50 shapes (all for count <= 0), once all of
// them match the gradient list `grads` (empty: the built-in one). Otherwise rank 0 prints why,
// prefixed by `program`, and the result is empty on every rank.
inline std::optional<std::vector<std::pair<std::string, Shape>>> checked_workload(
    const std::string& grads, int count, const char* program) {
  auto all = resnet50_shapes();
  try {
    check_against_counts(all, grads_or_default(grads), grads.empty() ? "the built-in list" : grads);
  } catch (const std::exception& e) {
    if (tutti::rank() == 0) std::fprintf(stderr, "%s: %s\n", program, e.what());
    return std::nullopt;
  }
  return last_tensors(std::move(all), count);
}

}  // namespace tutti::examples

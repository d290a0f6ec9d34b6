// SPDX-License-Identifier: Apache-2.0
// nn::Module: registration and the recursive, dotted-name views of parameters and buffers.
#include "tutti/nn/module.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "src/nn/autograd.h"
#include "src/nn/tensor_math.h"

namespace tutti::nn {

namespace {

// Each Variable once, under its first name, as torch.nn.Module's named_parameters() gives them:
// a child module registered twice (tied weights) lists its tensors once, so an optimizer built
// from the list steps each once and a DistributedOptimizer reduces each once.
NamedParameters without_repeats(NamedParameters all) {
  NamedParameters out;
  std::unordered_set<const detail::VariableImpl*> seen;
  for (auto& entry : all) {
    if (seen.insert(detail::VariableAccess::impl(entry.second).get()).second) {
      out.push_back(std::move(entry));
    }
  }
  return out;
}

}  // namespace

NamedParameters Module::named_parameters() const {
  NamedParameters out;
  collect("", /*buffers=*/false, out);
  return without_repeats(std::move(out));
}

NamedParameters Module::named_buffers() const {
  NamedParameters out;
  collect("", /*buffers=*/true, out);
  return without_repeats(std::move(out));
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

bool Module::is_training() const { return training_; }

Variable Module::register_parameter(std::string name, Variable value) {
  check_new_name(name, "register_parameter");
  if (!value.defined()) {
    detail::throw_invalid_argument("register_parameter('", name, "'): the Variable is empty");
  }
  detail::enable_grad(value);  // Throws for the result of an operation.
  parameters_.emplace_back(std::move(name), value);
  return value;
}

void Module::set_requires_grad(bool on) {
  for (auto& [name, parameter] : named_parameters()) parameter.set_requires_grad(on);
}

Variable Module::register_buffer(std::string name, Variable value) {
  check_new_name(name, "register_buffer");
  if (!value.defined() || value.requires_grad()) {
    detail::throw_invalid_argument("register_buffer('", name,
                                   "'): a buffer must be a defined Variable without grad");
  }
  buffers_.emplace_back(std::move(name), value);
  return value;
}

void Module::add_child(std::string name, std::shared_ptr<Module> child) {
  check_new_name(name, "register_module");
  if (!child) detail::throw_invalid_argument("register_module('", name, "'): the module is null");
  children_.emplace_back(std::move(name), std::move(child));
}

// Names must be unique within a module across parameters, buffers and children, and free of
// dots, so that every dotted name denotes one tensor.
void Module::check_new_name(const std::string& name, const char* what) const {
  if (name.empty() || name.find('.') != std::string::npos) {
    detail::throw_invalid_argument(what, "('", name, "'): names must be non-empty, without '.'");
  }
  auto same = [&name](const auto& entry) { return entry.first == name; };
  if (std::any_of(parameters_.begin(), parameters_.end(), same) ||
      std::any_of(buffers_.begin(), buffers_.end(), same) ||
      std::any_of(children_.begin(), children_.end(), same)) {
    detail::throw_invalid_argument(what, "('", name, "'): the name is already registered");
  }
}

void Module::collect(const std::string& prefix, bool buffers, NamedParameters& out) const {
  for (const auto& [name, value] : buffers ? buffers_ : parameters_) {
    out.emplace_back(prefix + name, value);
  }
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", buffers, out);
}

}  // namespace tutti::nn

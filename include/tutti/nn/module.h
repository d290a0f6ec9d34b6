// SPDX-License-Identifier: Apache-2.0
// nn::Module: the base of layers and models, owning named parameters, buffers and child modules.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tutti/export.h"
#include "tutti/nn/variable.h"

namespace tutti::nn {

// (dotted name, Variable) pairs; the Variables share storage with the module's own.
using NamedParameters = std::vector<std::pair<std::string, Variable>>;

// A layer or a model: forward() plus the parameters, buffers and child modules registered by the
// constructor. Modules start in training mode. Not copyable: a copy would silently share its
// parameters; hold modules by std::shared_ptr instead. forward() of the built-in layers may run
// on several threads at once (DataParallel does); registration and train() may not run
// concurrently with anything else on the module.
class TUTTI_API Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  // Computes the output for `input`, recording it for backward() when a parameter or the input
  // requires grad. Each layer documents the shapes it takes; wrong ones are InvalidArgument.
  virtual Variable forward(const Variable& input) = 0;

  // This module's parameters, then each child's (recursively) named "<child>.<name>", all in
  // registration order: e.g. "weight", "0.weight", "body.3.bias". The names are stable for a
  // given model, so they are the same on every rank. A Variable registered in several places
  // (a child module registered twice, tied weights) is listed once, under its first name, as
  // in PyTorch.
  NamedParameters named_parameters() const;
  // The buffers (BatchNorm's running statistics, ...), named and ordered the same way.
  NamedParameters named_buffers() const;
  // Tutti addition: the direct children, (name, module) in registration order
  // (torch.nn.Module.named_children); convert_sync_batchnorm() walks them.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const {
    return children_;
  }

  // Tutti addition (torch.nn.Module.requires_grad_()): Variable::set_requires_grad(on) on every
  // parameter of this module and its descendants; model.body->set_requires_grad(false) freezes a
  // body while its head trains. Its conditions are Variable::set_requires_grad()'s.
  void set_requires_grad(bool on);

  // Switches this module and all its descendants to training (true) or evaluation (false) mode,
  // which Dropout and BatchNorm honour.
  void train(bool on = true);
  bool is_training() const;

 protected:
  // Registers `value` as a parameter called `name` and returns it (the same shared Variable).
  // Turns requires_grad on (with a zero gradient) if it was off. Throws InvalidArgument for an
  // empty Variable, the result of an operation, or a name that is empty, contains '.', or is
  // already used by a parameter, buffer or child of this module.
  Variable register_parameter(std::string name, Variable value);
  // Registers `value` as a buffer: state saved with the model but not trained. Same name rules;
  // throws InvalidArgument for an empty Variable or one that requires grad.
  Variable register_buffer(std::string name, Variable value);
  // Registers `child` as a submodule called `name` and returns it. Same name rules; throws
  // InvalidArgument for a null child.
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> child) {
    add_child(std::move(name), child);
    return child;
  }

 private:
  void add_child(std::string name, std::shared_ptr<Module> child);
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool buffers, NamedParameters& out) const;

  NamedParameters parameters_;
  NamedParameters buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace tutti::nn

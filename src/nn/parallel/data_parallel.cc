// SPDX-License-Identifier: Apache-2.0
// DataParallel: one module's forward and backward split over threads along dim 0, recorded as a
// single operation whose backward sums the parts' parameter gradients (per thread, then added).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/nn/autograd.h"
#include "src/nn/tensor_math.h"
#include "tutti/nn/parallel.h"

namespace tutti::nn {
namespace {

using detail::VariableImpl;

// Runs task(0) ... task(count - 1), task(0) on this thread and each other on a thread of its
// own; returns once all have finished, rethrowing the first exception (in task order).
void run_parallel(std::size_t count, const std::function<void(std::size_t)>& task) {
  std::vector<std::exception_ptr> errors(count);
  auto guarded = [&](std::size_t t) {
    try {
      task(t);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> threads;
    for (std::size_t t = 1; t < count; ++t) threads.emplace_back(guarded, t);
    guarded(0);
  }  // Joined here.
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// Elements of one row of a tensor of `shape` (all dimensions but the first).
std::int64_t row_elements(const Shape& shape) {
  std::int64_t count = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) count *= shape[d];
  return count;
}

// The float32 rows of `from` into `to` from row `first_row` on.
void copy_rows(const Tensor& from, const Tensor& to, std::int64_t first_row) {
  if (from.num_elements() == 0) return;
  std::memcpy(detail::float_data(to) + first_row * row_elements(to.shape()), from.data(),
              from.byte_size());
}

// What the backward of a DataParallel forward needs: each part's graph and input leaf, where
// its rows start in the output, and the leaves (parameters) the parts reach.
struct Parts {
  std::vector<Variable> inputs;               // Leaves holding each part's rows of the input.
  std::vector<Variable> outputs;              // The module's output for each part.
  std::vector<std::int64_t> input_first_row;  // Where each part starts in the input...
  std::vector<std::int64_t> first_row;        // ... and in the output.
  std::vector<std::shared_ptr<VariableImpl>> leaves;  // The operation's inputs after `input`.
};

// The operation's backward: each thread differentiates its part into a private map
// (detail::leaf_gradients touches no shared state), then the maps are added per leaf.
detail::Gradients parts_backward(const Parts& parts, const Tensor& input_value, bool input_needs,
                                 const Tensor& grad_output) {
  const std::size_t count = parts.outputs.size();
  std::vector<detail::LeafGradients> grads(count);
  run_parallel(count, [&](std::size_t t) {
    const Shape& shape = parts.outputs[t].value().shape();
    // A view of this part's rows of the output gradient, which the walk only reads.
    const Tensor seed = grad_output.slice(parts.first_row[t] * row_elements(shape), shape);
    grads[t] = detail::leaf_gradients(parts.outputs[t], seed);
  });
  detail::Gradients result;
  result.reserve(parts.leaves.size() + 1);
  result.push_back(detail::zeros(input_value.shape()));
  if (input_needs) {
    for (std::size_t t = 0; t < count; ++t) {
      const auto it = grads[t].find(detail::VariableAccess::impl(parts.inputs[t]).get());
      if (it == grads[t].end()) continue;  // The output did not depend on the input: zeros.
      copy_rows(it->second, result[0], parts.input_first_row[t]);
    }
  }
  for (const std::shared_ptr<VariableImpl>& leaf : parts.leaves) {
    Tensor sum = detail::zeros(leaf->value.shape());
    for (const detail::LeafGradients& g : grads) {
      const auto it = g.find(leaf.get());
      if (it != g.end()) detail::as_array(sum) += detail::as_array(it->second);
    }
    result.push_back(std::move(sum));
  }
  return result;
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<Module> module, int num_threads)
    : num_threads_(num_threads) {
  if (!module) detail::throw_invalid_argument("DataParallel: the module is null");
  if (num_threads < 1) {
    detail::throw_invalid_argument("DataParallel: num_threads must be at least 1, got ",
                                   num_threads);
  }
  module_ = register_module("module", std::move(module));
}

Variable DataParallel::forward(const Variable& input) {
  const Tensor& x = input.value();
  if (x.dim() == 0) {
    detail::throw_invalid_argument("DataParallel splits its input along dim 0; got a 0-d input");
  }
  const std::int64_t rows = x.shape()[0];
  const auto count = static_cast<std::size_t>(std::min<std::int64_t>(num_threads_, rows));
  if (count <= 1) return module_->forward(input);

  // numpy's array_split: the first rows % count parts get one row more.
  Parts parts;
  const auto parts_count = static_cast<std::int64_t>(count);
  for (std::int64_t t = 0, first = 0; t < parts_count; ++t) {
    Shape shape = x.shape();
    shape[0] = rows / parts_count + (t < rows % parts_count ? 1 : 0);
    // A copy, not a slice of x: each part's leaf must be a node of its own (its gradient is
    // looked up by node), and x may be changed by the caller after forward().
    Tensor part = x.slice(first * row_elements(shape), shape).clone();
    parts.inputs.emplace_back(std::move(part), input.requires_grad());
    parts.input_first_row.push_back(first);
    first += shape[0];
  }
  parts.outputs.resize(count);
  run_parallel(count, [&](std::size_t t) { parts.outputs[t] = module_->forward(parts.inputs[t]); });

  // Concatenate along dim 0.
  Shape shape = parts.outputs[0].value().shape();
  std::int64_t out_rows = 0;
  for (const Variable& out : parts.outputs) {
    const Shape& s = out.value().shape();
    if (s.empty() || !std::equal(s.begin() + 1, s.end(), shape.begin() + 1, shape.end())) {
      detail::throw_invalid_argument(
          "DataParallel: the parts' outputs cannot be concatenated along dim 0: shapes ",
          detail::shape_string(shape), " and ", detail::shape_string(s));
    }
    parts.first_row.push_back(out_rows);
    out_rows += s[0];
  }
  shape[0] = out_rows;
  Tensor value = detail::zeros(shape);
  for (std::size_t t = 0; t < count; ++t)
    copy_rows(parts.outputs[t].value(), value, parts.first_row[t]);

  // The operation's inputs: the input, then every leaf a part reaches (other than the parts'
  // own input leaves), each once, in a deterministic order.
  std::vector<Variable> op_inputs{input};
  std::unordered_set<const VariableImpl*> own;
  for (const Variable& in : parts.inputs) own.insert(detail::VariableAccess::impl(in).get());
  for (const Variable& out : parts.outputs) {
    for (std::shared_ptr<VariableImpl>& leaf : detail::reachable_leaves(out)) {
      if (own.insert(leaf.get()).second) {
        op_inputs.push_back(detail::VariableAccess::wrap(leaf));
        parts.leaves.push_back(std::move(leaf));
      }
    }
  }
  if (parts.leaves.empty() && !input.requires_grad()) return Variable(std::move(value));
  auto shared_parts = std::make_shared<const Parts>(std::move(parts));
  return detail::make_result(
      std::move(value), op_inputs,
      [shared_parts, x, input_needs = input.requires_grad()](const Tensor& grad_output) {
        return parts_backward(*shared_parts, x, input_needs, grad_output);
      });
}

}  // namespace tutti::nn

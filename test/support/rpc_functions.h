// SPDX-License-Identifier: Apache-2.0
// The RPC functions (and the "plain_sgd" optimizer) the rpc tests call (unit tests over the fake
// transport and MPI tests alike), and the plain-nn helpers their oracles use. Every worker
// registers the same set (SPMD).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/rpc/rpc_runtime.h"
#include "tutti/distributed_autograd.h"
#include "tutti/nn.h"
#include "tutti/optim.h"
#include "tutti/rpc.h"

namespace tutti::test {

inline Tensor filled(const Shape& shape, float first, float step = 1.0f) {
  Tensor t(DataType::Float32, shape);
  float v = first;
  for (float& x : t.span<float>()) {
    x = v;
    v += step;
  }
  return t;
}

// A message of bytes alone.
inline rpc::Message bytes_only(std::string bytes) {
  return rpc::Message{.tensors = {}, .rrefs = {}, .bytes = std::move(bytes)};
}

inline std::vector<float> values_of(const Tensor& t) {
  std::span<const float> s = t.span<float>();
  return {s.begin(), s.end()};
}

// The largest absolute difference between two tensors of the same size (infinity if sizes differ).
inline double max_difference(const Tensor& a, const Tensor& b) {
  if (a.num_elements() != b.num_elements()) return 1e300;
  double worst = 0;
  std::span<const float> x = a.span<float>(), y = b.span<float>();
  for (std::size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(double(x[i]) - double(y[i])));
  return worst;
}

// The value a "make_parameter" call creates for `seed`: a fixed function of the seed, so an oracle
// can build the same parameter locally.
inline Tensor parameter_value(int seed, const Shape& shape) {
  return filled(shape, 0.1f * seed - 0.3f, 0.07f);
}

inline void register_test_functions() {
  using rpc::Message;
  // Returns its arguments.
  rpc::register_function("echo", [](const Message& m) { return m; });
  // tensors[0] + tensors[1] (recorded by autograd).
  rpc::register_function("add", [](const Message& m) {
    return Message{.tensors = {m.tensors.at(0) + m.tensors.at(1)}, .rrefs = {}, .bytes = {}};
  });
  // tensors[0] * tensors[0] on this worker, then bytes names a worker that adds the result to
  // itself ("double"), then times tensors[0] again here: x^2 * 2 * x, crossing workers twice.
  rpc::register_function("square_double_times", [](const Message& m) {
    const nn::Variable& x = m.tensors.at(0);
    nn::Variable y = x * x;
    Message doubled =
        rpc::rpc_sync(m.bytes, "double", Message{.tensors = {y}, .rrefs = {}, .bytes = {}});
    return Message{.tensors = {doubled.tensors.at(0) * x}, .rrefs = {}, .bytes = {}};
  });
  rpc::register_function("double", [](const Message& m) {
    return Message{.tensors = {m.tensors.at(0) + m.tensors.at(0)}, .rrefs = {}, .bytes = {}};
  });
  // Throws: bytes "std" a std::runtime_error, else an Error with code std::stoi(bytes).
  rpc::register_function("raise", [](const Message& m) -> Message {
    if (m.bytes == "std") throw std::runtime_error("plain boom");
    throw Error(static_cast<ErrorCode>(std::stoi(m.bytes)), "coded boom");
  });
  // Sleeps bytes milliseconds, then echoes.
  rpc::register_function("sleep", [](const Message& m) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(m.bytes)));
    return m;
  });
  // bytes = "a,b,c": calls "chain" on a with "b,c", ..., and returns the visited names in order,
  // each worker appending its own: nested calls through any workers, also back to the caller.
  rpc::register_function("chain", [](const Message& m) {
    const std::string me = rpc::get_worker_info().name;
    if (m.bytes.empty()) return Message{.tensors = {}, .rrefs = {}, .bytes = me};
    const std::size_t comma = m.bytes.find(',');
    const std::string next = m.bytes.substr(0, comma);
    const std::string rest = comma == std::string::npos ? "" : m.bytes.substr(comma + 1);
    Message inner =
        rpc::rpc_sync(next, "chain", Message{.tensors = {}, .rrefs = {}, .bytes = rest});
    return Message{.tensors = {}, .rrefs = {}, .bytes = me + ">" + inner.bytes};
  });
  // A parameter (requires grad) of shape [rows, cols] with parameter_value(seed): bytes =
  // "seed,rows,cols".
  rpc::register_function("make_parameter", [](const Message& m) {
    int seed = 0, rows = 0, cols = 0;
    std::sscanf(m.bytes.c_str(), "%d,%d,%d", &seed, &rows, &cols);
    return Message{.tensors = {nn::Variable(parameter_value(seed, {rows, cols}), true)},
                   .rrefs = {},
                   .bytes = {}};
  });
  // rrefs[0].to_here() on this worker: fetches the value from its owner (or reads it, there).
  rpc::register_function("fetch", [](const Message& m) { return m.rrefs.at(0).to_here(); });
  // Whether rrefs[0] is owned here, and its local value if so.
  rpc::register_function("owner_value", [](const Message& m) {
    const rpc::RRef& ref = m.rrefs.at(0);
    if (!ref.is_owner()) return Message{.tensors = {}, .rrefs = {}, .bytes = "not owner"};
    Message value = ref.local_value();
    value.bytes = "owner";
    return value;
  });
  // Passes rrefs on to worker `bytes` (fetch there), so the RRef is forked twice.
  rpc::register_function("forward_fetch", [](const Message& m) {
    return rpc::rpc_sync(m.bytes, "fetch", Message{.tensors = {}, .rrefs = m.rrefs, .bytes = {}});
  });
  // Returns its RRefs (a fork back to the caller in the response).
  rpc::register_function("return_rrefs", [](const Message& m) {
    return Message{.tensors = {}, .rrefs = m.rrefs, .bytes = {}};
  });
  // Makes an RRef owned here (a remote() to itself) and returns it.
  rpc::register_function("make_local_rref", [](const Message& m) {
    rpc::RRef ref = rpc::remote(rpc::get_worker_info().name, "echo", m);
    return Message{.tensors = {}, .rrefs = {ref}, .bytes = {}};
  });
  // The RRef values alive on this worker (its owner side).
  rpc::register_function("owned_count", [](const Message&) {
    return Message{.tensors = {},
                   .rrefs = {},
                   .bytes = std::to_string(rpc::detail::owned_rref_count_for_testing())};
  });
  // The gradient that context std::stoll(bytes) holds here for the value of rrefs[0] (owned
  // here): tensors = that gradient for each of the value's tensors.
  rpc::register_function("context_gradients", [](const Message& m) {
    const std::int64_t id = std::stoll(m.bytes);
    Message out;
    for (const nn::Variable& p : m.rrefs.at(0).local_value().tensors) {
      out.tensors.emplace_back(dist_autograd::get_gradient(id, p));
    }
    return out;
  });
  // An optimizer of the test's own beside the built-in ones: SGD with options {"lr"}.
  rpc::register_optimizer(
      "plain_sgd", [](std::vector<nn::Variable> p, const std::map<std::string, double>& o) {
        return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = o.at("lr")});
      });
}

}  // namespace tutti::test

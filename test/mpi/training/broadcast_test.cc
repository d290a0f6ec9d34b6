// SPDX-License-Identifier: Apache-2.0
// broadcast_parameters() and broadcast_optimizer_state() at 1-4 ranks: ranks start from
// rank-dependent models and optimizer states and must end equal to the root's, checked against
// the root's values sent with plain MPI (the oracle). See Note [Collective assertions].
#include "tutti/optim/broadcast.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "test/mpi/training/training_test_util.h"
#include "test/support/mpi_test_util.h"
#include "tutti/nn.h"
#include "tutti/optim.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// Everything in a state dict as numbers: each key's characters, its shape and values, then
// each scalar's name and value. Equal fingerprints mean equal state dicts.
std::vector<double> fingerprint(const optim::StateDict& state) {
  std::vector<double> out;
  auto text = [&out](const std::string& s) {
    out.push_back(static_cast<double>(s.size()));
    for (char c : s) out.push_back(c);
  };
  out.push_back(static_cast<double>(state.tensors.size()));
  for (const auto& [key, tensor] : state.tensors) {
    text(key);
    out.push_back(static_cast<double>(tensor.dtype()));
    for (std::int64_t d : tensor.shape()) out.push_back(static_cast<double>(d));
    for (float v : tensor.span<float>()) out.push_back(v);
  }
  for (const auto& [name, value] : state.scalars) {
    text(name);
    out.push_back(value);
  }
  return out;
}

// True on every rank iff `after` on every rank equals `before` on `root`.
bool equals_roots(const std::vector<double>& before, const std::vector<double>& after, int root) {
  int count = static_cast<int>(before.size());
  MPI_Bcast(&count, 1, MPI_INT, root, MPI_COMM_WORLD);
  std::vector<double> oracle = before;
  oracle.resize(static_cast<std::size_t>(count));
  MPI_Bcast(oracle.data(), count, MPI_DOUBLE, root, MPI_COMM_WORLD);
  return all_ranks(after == oracle);
}

void set_all_grads(const nn::NamedParameters& params, float value) {
  for (const auto& [name, p] : params) {
    for (float& g : p.grad().span<float>()) g = value;
  }
}

TEST_CASE("broadcast_parameters gives every rank the root's values", "[broadcast]") {
  Session session;
  const int rank = tutti::rank();
  const int root = tutti::size() - 1;  // A root other than 0 where there is one.
  auto model = make_model(100 + static_cast<std::uint64_t>(rank));  // Different on each rank.
  const nn::NamedParameters named = model->named_parameters();
  const std::vector<double> before = flatten_values(named);
  optim::broadcast_parameters(named, root);
  CHECK(equals_roots(before, flatten_values(named), root));
  // Buffers go the same way (none in this model: an empty list is fine too).
  optim::broadcast_parameters(model->named_buffers(), root);
}

TEST_CASE("broadcast_parameters rejects repeated names before sending anything", "[broadcast]") {
  Session session;
  auto model = make_model(1);
  nn::NamedParameters named = model->named_parameters();
  named.push_back(named.front());
  bool refused = false;
  try {
    optim::broadcast_parameters(named, 0);
  } catch (const Error& e) {
    refused = e.code() == ErrorCode::InvalidArgument;
  }
  CHECK(all_ranks(refused));
}

TEST_CASE(
    "broadcast_optimizer_state makes SGD state equal to the root's, before and after "
    "the first step",
    "[broadcast]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const int root = size / 2;
  // Which ranks have stepped (and so have momentum buffers): the root or not, others mixed.
  const bool root_stepped = GENERATE(true, false);
  auto model = make_model(3);
  const nn::NamedParameters named = model->named_parameters();
  optim::SGD sgd(
      variables(named),
      {.lr = 0.1 * (rank + 1), .momentum = 0.5 + 0.1 * rank, .weight_decay = 0.001 * rank});
  const bool steps = rank == root ? root_stepped : rank % 2 == 1;
  if (steps) {
    set_all_grads(named, 0.5f + static_cast<float>(rank));
    sgd.step();
  }
  const std::vector<double> before = fingerprint(sgd.state_dict());
  optim::broadcast_optimizer_state(sgd, root);
  const optim::StateDict after = sgd.state_dict();
  CHECK(equals_roots(before, fingerprint(after), root));
  CHECK(all_ranks(after.tensors.size() == (root_stepped ? named.size() : 0)));
  CHECK(all_ranks(sgd.options().lr == 0.1 * (root + 1)));
}

TEST_CASE(
    "broadcast_optimizer_state carries Adam's moments and step count, also through a "
    "DistributedOptimizer",
    "[broadcast]") {
  Session session;
  const int rank = tutti::rank();
  const int root = 0;
  auto model = make_model(4);
  const nn::NamedParameters named = model->named_parameters();
  optim::Adam adam(variables(named), {.lr = 0.001 * (rank + 1), .beta1 = 0.8});
  for (int s = 0; s < rank % 3; ++s) {  // 0, 1 or 2 steps depending on the rank.
    set_all_grads(named, 0.25f * static_cast<float>(rank + s + 1));
    adam.step();
  }
  optim::DistributedOptimizer dist(adam, named);
  const std::vector<double> before = fingerprint(adam.state_dict());
  optim::broadcast_optimizer_state(dist, root);
  CHECK(equals_roots(before, fingerprint(adam.state_dict()), root));
  CHECK(all_ranks(adam.state_dict().scalars.at("step") == 0));  // The root never stepped.
}

TEST_CASE("issue 24: over a set whose ranks differ from the global ones, roots are global ranks",
          "[broadcast][process_set]") {
  if (world_size() < 3) return;
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  // {1, size - 1}: global rank 1 is set rank 0, global rank size - 1 set rank 1.
  const ProcessSet set = add_process_set({1, size - 1});
  for (const int root : {1, size - 1}) {
    auto model = make_model(200 + static_cast<std::uint64_t>(rank));
    const nn::NamedParameters named = model->named_parameters();
    optim::SGD sgd(variables(named), {.lr = 0.1 * (rank + 1), .momentum = 0.5});
    if (rank == root) {  // Only the root has momentum buffers.
      set_all_grads(named, 0.5f);
      sgd.step();
    }
    const std::vector<double> params_before = flatten_values(named);
    const std::vector<double> state_before = fingerprint(sgd.state_dict());
    if (set.included()) {
      optim::broadcast_parameters(named, root, set);
      optim::broadcast_optimizer_state(sgd, root, set);
    }
    // Members end with the root's values; the others keep their own.
    const std::vector<double> params =
        set.included() ? flatten_values(named) : std::vector<double>();
    const std::vector<double> state =
        set.included() ? fingerprint(sgd.state_dict()) : std::vector<double>();
    int count = static_cast<int>(params_before.size());
    std::vector<double> oracle = params_before;
    MPI_Bcast(oracle.data(), count, MPI_DOUBLE, root, MPI_COMM_WORLD);
    count = static_cast<int>(state_before.size());
    MPI_Bcast(&count, 1, MPI_INT, root, MPI_COMM_WORLD);
    std::vector<double> state_oracle = state_before;
    state_oracle.resize(static_cast<std::size_t>(count));
    MPI_Bcast(state_oracle.data(), count, MPI_DOUBLE, root, MPI_COMM_WORLD);
    INFO("root " << root);
    CHECK(all_ranks(!set.included() || (params == oracle && state == state_oracle &&
                                        sgd.options().lr == 0.1 * (root + 1))));
  }
  remove_process_set(set);
}

TEST_CASE("After broadcasting, ranks train in lockstep", "[broadcast]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = make_model(200 + static_cast<std::uint64_t>(rank));
  const nn::NamedParameters named = model->named_parameters();
  optim::AdamW adamw(variables(named), {.lr = 0.01 * (rank + 1)});
  optim::DistributedOptimizer dist(adamw, named);
  optim::broadcast_parameters(named, 0);
  optim::broadcast_optimizer_state(dist, 0);
  for (std::int64_t step = 0; step < 2; ++step) {
    dist.zero_grad();
    forward_backward(*model, shard(rank, size, step));
    dist.step();
  }
  const std::vector<double> mine = flatten_values(named);
  CHECK(equals_roots(mine, mine, 0));
}

}  // namespace
}  // namespace tutti::test

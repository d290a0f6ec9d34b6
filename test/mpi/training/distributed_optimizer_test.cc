// SPDX-License-Identifier: Apache-2.0
// DistributedOptimizer at 1-4 ranks against single-process oracles: N ranks on shards of a
// batch must end where one process on the whole batch ends (computed on every rank with a
// second model and no communication). See Note [Collective assertions] in
// test/support/mpi_test_util.h: every check after a collective is CHECK(all_ranks(...)).
#include "tutti/optim/distributed_optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/training/training_test_util.h"
#include "test/support/capture_stderr.h"
#include "test/support/mpi_test_util.h"
#include "tutti/debug.h"
#include "tutti/nn.h"
#include "tutti/optim.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

using optim::Compression;
using optim::DistributedOptimizer;
using optim::DistributedOptions;

// The error code `f` throws, or Internal if it throws none.
template <class F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::Internal;
}

std::unique_ptr<optim::Optimizer> make_optimizer(int kind, std::vector<nn::Variable> params,
                                                 double lr_scale = 1.0) {
  switch (kind) {
    case 0:
      return std::make_unique<optim::SGD>(
          std::move(params),
          optim::SGDOptions{
              .lr = 0.1 * lr_scale, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
    case 1: return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions{.lr = 0.01});
    case 2:
      return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 0.01});
    default:
      return std::make_unique<optim::SGD>(std::move(params),
                                          optim::SGDOptions{.lr = 0.1 * lr_scale});
  }
}

// Scales every gradient so that their global L2 norm is at most `max_norm` (as
// torch.nn.utils.clip_grad_norm_).
void clip_grad_norm(const nn::NamedParameters& params, double max_norm) {
  double total = 0;
  for (const auto& [name, p] : params) {
    for (float g : p.grad().span<float>()) total += static_cast<double>(g) * g;
  }
  const double norm = std::sqrt(total);
  if (norm <= max_norm) return;
  const auto factor = static_cast<float>(max_norm / (norm + 1e-6));
  for (const auto& [name, p] : params) {
    for (float& g : p.grad().span<float>()) g *= factor;
  }
}

TEST_CASE("N ranks on shards end with the parameters of one process on the whole batch",
          "[distributed]") {
  Session session;
  const int kind = GENERATE(0, 1, 2);  // SGD (momentum, Nesterov, weight decay), Adam, AdamW.
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = make_model(7);
  auto reference = make_model(7);
  const nn::NamedParameters named = model->named_parameters();
  const nn::NamedParameters ref_named = reference->named_parameters();
  auto inner = make_optimizer(kind, variables(named));
  auto ref_opt = make_optimizer(kind, variables(ref_named));
  DistributedOptimizer dist(*inner, named);
  optim::broadcast_parameters(named, 0);
  for (std::int64_t step = 0; step < 3; ++step) {
    dist.zero_grad();
    forward_backward(*model, shard(rank, size, step));
    dist.step();
    ref_opt->zero_grad();
    forward_backward(*reference, full_batch(step));
    ref_opt->step();
  }
  const double diff = max_diff(named, ref_named);
  INFO("kind " << kind << " max |difference| " << diff);
  CHECK(all_ranks(diff < 1e-5));
  CHECK(all_ranks(max_diff(named, make_model(7)->named_parameters()) > 1e-3));  // It trained.
}

struct ReductionCase {
  const char* what;
  DistributedOptions options;
  bool sum;          // The oracle is size · the batch gradient instead of the gradient.
  double tolerance;  // Absolute, on gradients of magnitude ~1.
};

TEST_CASE("Reduced gradients equal the whole batch's, for every op, compression and grouping",
          "[distributed]") {
  Session session;
  const std::vector<ReductionCase> cases = {
      {"average", {}, false, 1e-6},
      {"sum", {.op = ReduceOp::Sum}, true, 1e-5},
      {"predivide 3", {.gradient_predivide_factor = 3.0}, false, 1e-6},
      {"fp16", {.compression = Compression::FP16}, false, 4e-3},
      {"bf16", {.compression = Compression::BF16}, false, 3e-2},
      {"sum bf16", {.op = ReduceOp::Sum, .compression = Compression::BF16}, true, 6e-2},
      {"2 groups", {.num_groups = 2}, false, 1e-6},
      {"10 groups (clamped)", {.num_groups = 10}, false, 1e-6},
      {"explicit groups", {.groups = {{"2.bias", "0.weight"}, {"2.weight"}}}, false, 1e-6},
      {"groups fp16 sum",
       {.op = ReduceOp::Sum, .compression = Compression::FP16, .num_groups = 1},
       true,
       1.5e-2},
  };
  const std::size_t which = GENERATE(range<std::size_t>(0, 10));
  const ReductionCase& c = cases.at(which);
  INFO(c.what);
  const int rank = tutti::rank();
  const int size = tutti::size();
  const double scale = c.sum ? size : 1.0;
  auto model = make_model(11);
  auto reference = make_model(11);
  const nn::NamedParameters named = model->named_parameters();
  const nn::NamedParameters ref_named = reference->named_parameters();
  auto inner = make_optimizer(3, variables(named));
  auto ref_opt = make_optimizer(3, variables(ref_named), scale);  // Same steps under Sum.
  DistributedOptimizer dist(*inner, named, c.options);
  for (std::int64_t step = 0; step < 2; ++step) {  // Two rounds: the round state resets.
    dist.zero_grad();
    forward_backward(*model, shard(rank, size, step));
    dist.synchronize();
    ref_opt->zero_grad();
    forward_backward(*reference, full_batch(step));
    const double diff = max_diff(named, ref_named, /*grads=*/true, scale);
    INFO("step " << step << " max |gradient difference| " << diff);
    CHECK(all_ranks(diff < c.tolerance));
    {
      auto guard = dist.skip_synchronize();
      dist.step();
    }
    ref_opt->step();
  }
  CHECK(all_ranks(max_diff(named, ref_named) < 20 * c.tolerance));
}

TEST_CASE("Adasum of identical gradients is the gradient; a set of 3 is refused on CPU",
          "[distributed][adasum]") {
  Session session;
  const int size = tutti::size();
  auto model = make_model(5);
  auto reference = make_model(5);
  const nn::NamedParameters named = model->named_parameters();
  auto inner = make_optimizer(3, variables(named));
  if ((size & (size - 1)) != 0) {
    // Refused by the constructor (before, only by the first backward()'s hook).
    CHECK(all_ranks(code_of([&] {
                      DistributedOptimizer refused(*inner, named, {.op = ReduceOp::Adasum});
                    }) == ErrorCode::InvalidArgument));
    return;
  }
  DistributedOptimizer dist(*inner, named, {.op = ReduceOp::Adasum});
  forward_backward(*reference, full_batch(0));
  forward_backward(*model, full_batch(0));  // Every rank the same data.
  dist.synchronize();
  CHECK(all_ranks(max_diff(named, reference->named_parameters(), true) < 1e-5));
}

TEST_CASE("backward_passes_per_step = 2 sums the gradients of two passes, not their mean",
          "[distributed][accumulation]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = make_model(13);
  auto reference = make_model(13);
  const nn::NamedParameters named = model->named_parameters();
  const nn::NamedParameters ref_named = reference->named_parameters();
  auto inner = make_optimizer(3, variables(named));
  auto ref_opt = make_optimizer(3, variables(ref_named));
  DistributedOptimizer dist(*inner, named, {.backward_passes_per_step = 2});
  for (std::int64_t round = 0; round < 2; ++round) {
    dist.zero_grad();
    forward_backward(*model, shard(rank, size, 2 * round));
    forward_backward(*model, shard(rank, size, 2 * round + 1));
    dist.synchronize();
    ref_opt->zero_grad();
    forward_backward(*reference, full_batch(2 * round));
    forward_backward(*reference, full_batch(2 * round + 1));
    CHECK(all_ranks(max_diff(named, ref_named, /*grads=*/true) < 1e-5));
    {
      auto guard = dist.skip_synchronize();
      dist.step();
    }
    ref_opt->step();
  }
  CHECK(all_ranks(max_diff(named, ref_named) < 1e-5));
}

TEST_CASE("Reductions start at the k-th pass; a (k+1)-th pass before step() is InvalidArgument",
          "[distributed][accumulation]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = make_model(13);
  auto reference = make_model(13);
  const nn::NamedParameters named = model->named_parameters();
  auto inner = make_optimizer(3, variables(named));
  DistributedOptimizer dist(*inner, named, {.backward_passes_per_step = 2});

  forward_backward(*model, shard(rank, size, 0));
  // Nothing is in flight after the first pass, so zero_grad() is allowed (the pass still
  // counts; its gradient is discarded).
  CHECK(all_ranks(code_of([&] { dist.zero_grad(); }) == ErrorCode::Internal));
  forward_backward(*model, shard(rank, size, 1));
  // The second pass started the reductions: zero_grad() now refuses, and so does a third pass.
  CHECK(all_ranks(code_of([&] { dist.zero_grad(); }) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(code_of([&] { forward_backward(*model, shard(rank, size, 2)); }) ==
                  ErrorCode::InvalidArgument));
  dist.synchronize();
  // What was reduced is the gradient when the second pass's hooks fired: batch 1 only.
  forward_backward(*reference, full_batch(1));
  CHECK(all_ranks(max_diff(named, reference->named_parameters(), true) < 1e-5));
  auto guard = dist.skip_synchronize();
  dist.step();
}

TEST_CASE("A second backward() before step() is InvalidArgument with one pass per step",
          "[distributed][accumulation]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = make_model(17);
  const nn::NamedParameters named = model->named_parameters();
  auto inner = make_optimizer(3, variables(named));
  DistributedOptimizer dist(*inner, named);
  forward_backward(*model, shard(rank, size, 0));
  CHECK(all_ranks(code_of([&] { forward_backward(*model, shard(rank, size, 0)); }) ==
                  ErrorCode::InvalidArgument));
  // The refused pass went into the spares of the reductions in flight: the step goes on.
  CHECK(all_ranks(code_of([&] { dist.step(); }) == ErrorCode::Internal));
  // A new round accepts a backward pass again; one after synchronize() is refused too (the
  // step's gradients are already reduced), and it added into them: until zero_grad() the round
  // refuses to step (Note [A failed round] in optimizers/reduction_rounds.h). Before, step()
  // applied the reduced gradients plus each rank's own, and the ranks' weights diverged.
  dist.zero_grad();
  CHECK(all_ranks(code_of([&] { forward_backward(*model, shard(rank, size, 1)); }) ==
                  ErrorCode::Internal));
  dist.synchronize();
  CHECK(all_ranks(code_of([&] { forward_backward(*model, shard(rank, size, 2)); }) ==
                  ErrorCode::InvalidArgument));
  {
    auto guard = dist.skip_synchronize();
    CHECK(all_ranks(code_of([&] { dist.step(); }) == ErrorCode::InvalidArgument));
  }
  CHECK(all_ranks(code_of([&] { dist.synchronize(); }) == ErrorCode::InvalidArgument));
  dist.zero_grad();
  forward_backward(*model, shard(rank, size, 3));
  CHECK(all_ranks(code_of([&] { dist.step(); }) == ErrorCode::Internal));
  // Every rank stepped on the same averaged gradients: the weights agree (plain MPI's min and
  // max of each).
  CHECK(same_on_every_rank(flatten_values(named)));
}

// Note [A failed round]: a step whose reduction failed (here a Mismatch: one parameter's shape
// differs on rank 0) is not retried on whatever the gradients hold, nor does it leave the
// optimizer unusable: a retried step() is refused until zero_grad(), and the next round's
// backward() is accepted. Before, the retry stepped each rank on its own gradients, and the
// next backward() was refused as an extra pass.
TEST_CASE("After a failed step, step() is refused until zero_grad(); the next round works",
          "[distributed][errors]") {
  Session session;
  if (tutti::size() < 2) return;  // A mismatch needs two ranks.
  const int rank = tutti::rank();
  nn::Variable w(Tensor(DataType::Float32, {rank == 0 ? 4 : 3}), true);
  nn::Variable b(Tensor(DataType::Float32, {1}), true);
  const nn::NamedParameters named = {{"w", w}, {"b", b}};
  optim::SGD inner(variables(named), {.lr = 1.0});
  DistributedOptimizer dist(inner, named);
  const auto backward = [&] { (nn::sum(w) + nn::sum(b)).backward(); };
  backward();
  CHECK(all_ranks(code_of([&] { dist.step(); }) == ErrorCode::Mismatch));
  CHECK(all_ranks(code_of([&] { dist.step(); }) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(b.value().span<float>()[0] == 0.0f));  // No step was taken.
  dist.zero_grad();
  CHECK(all_ranks(code_of(backward) == ErrorCode::Internal));
  CHECK(all_ranks(code_of([&] { dist.step(); }) == ErrorCode::Mismatch));
}

// A vector parameter b with loss sum(b * x), where rank r's input at step s is
// x = (100 s + r, r): its gradient is x, so the average over n ranks is
// (100 s + (n - 1) / 2, (n - 1) / 2), and with rank 0's contribution zero, rank 0's terms drop
// out of the sums: ((n - 1) 100 s + n (n - 1) / 2, n (n - 1) / 2) / n.
nn::Variable dot_input(int rank, std::int64_t step) {
  return {Tensor::from<float>(
      std::vector<float>{100.0f * static_cast<float>(step) + static_cast<float>(rank),
                         static_cast<float>(rank)},
      {2})};
}
std::vector<double> average_of_inputs(int size, std::int64_t step, bool rank0_zero) {
  const double n = size;
  const double ranks_sum = n * (n - 1) / 2;  // 0 + 1 + ... + (n - 1).
  const double first = (rank0_zero ? n - 1 : n) * 100.0 * static_cast<double>(step) + ranks_sum;
  return {first / n, ranks_sum / n};
}
bool grad_is(const nn::Variable& v, const std::vector<double>& expected) {
  const auto g = v.grad().span<float>();
  if (g.size() != expected.size()) return false;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i] - expected[i]) > 1e-3 * (1 + std::abs(expected[i]))) return false;
  }
  return true;
}

TEST_CASE("A backward() that threw on one rank leaves every rank on the same step",
          "[distributed][errors]") {
  // Rank 0's backward() throws at step 1 before b's hook ran: its grad() is absent (the engine
  // refuses to add into it), or a hook registered before the optimizer's throws. Before, its
  // step-2 reduction then matched the others' unfinished step-1 one under the same name, and
  // every later step averaged gradients a step apart. Now its failed-pass hook sends what b's
  // grad() holds (zeros when absent) and the checks below hold at every step.
  Session session;
  const bool user_hook_throws = GENERATE(false, true);
  const int rank = tutti::rank();
  const int size = tutti::size();
  nn::Variable b(Tensor(DataType::Float32, {2}), true);
  bool throw_now = false;
  if (user_hook_throws) {
    b.register_grad_hook([&throw_now](nn::Variable&) {
      if (throw_now) throw Error(ErrorCode::InvalidArgument, "the test's hook: a NaN");
    });
  }
  const nn::NamedParameters named = {{"b", b}};
  optim::SGD inner(variables(named), {.lr = 0.0});
  DistributedOptimizer dist(inner, named);
  bool ok = true;
  std::string log;
  for (std::int64_t step = 0; step < 4; ++step) {
    dist.zero_grad();
    const bool fails = step == 1 && rank == 0;
    if (fails && user_hook_throws) throw_now = true;
    if (fails && !user_hook_throws) b.grad() = Tensor();
    const ErrorCode backward = code_of([&] { nn::sum(b * dot_input(rank, step)).backward(); });
    throw_now = false;
    if (fails) {
      // The round failed: step() is refused, and zero_grad() (next step) ends it.
      const ErrorCode refused = code_of([&] { dist.step(); });
      ok = ok && backward == ErrorCode::InvalidArgument && refused == ErrorCode::InvalidArgument;
      log += " rank 0 step 1: " + std::to_string(static_cast<int>(backward)) + "/" +
             std::to_string(static_cast<int>(refused));
      if (!user_hook_throws) b.grad() = Tensor(DataType::Float32, {2});
      continue;
    }
    const ErrorCode stepped = code_of([&] { dist.step(); });
    // At step 1 the others average rank 0's grad() as it stood: its whole gradient when its own
    // hook threw, zeros when it was absent.
    const bool rank0_zero = step == 1 && !user_hook_throws;
    const bool right = grad_is(b, average_of_inputs(size, step, rank0_zero));
    ok = ok && backward == ErrorCode::Internal && stepped == ErrorCode::Internal && right;
    if (!right) {
      log += " step " + std::to_string(step) + ": " + std::to_string(b.grad().span<float>()[0]);
    }
  }
  INFO("user_hook_throws " << user_hook_throws << log);
  CHECK(all_ranks(ok));
}

TEST_CASE("A backward() that threw after every parameter's hook ran: that rank skips the step",
          "[distributed][errors]") {
  // Rank 0's pass 0 of step 1 throws at a leaf that is not a parameter (an input whose grad()
  // has the wrong shape), after p's hook ran: before, with one pass per step, its recovery
  // zero_grad() threw (the reduction was in flight) and every later pass was refused; with two,
  // its next pass completed the round a pass late and every later step averaged gradients a
  // step apart. p's gradient on rank r in pass k of step s is x = 100 (r + 1) + 10 s + k.
  Session session;
  const int passes = GENERATE(1, 2);
  const int rank = tutti::rank();
  const int size = tutti::size();
  nn::Variable p(Tensor(DataType::Float32, {1}), true);
  optim::SGD inner({p}, {.lr = 0.0});
  DistributedOptimizer dist(inner, {{"p", p}}, {.backward_passes_per_step = passes});
  const auto x = [](int r, std::int64_t s, int k) {
    return 100.0 * (r + 1) + 10.0 * static_cast<double>(s) + k;
  };
  bool ok = true;
  std::string log;
  for (std::int64_t step = 0; step < 3; ++step) {
    const bool fails = step == 1 && rank == 0;
    std::string message;
    try {
      for (int k = 0; k < passes; ++k) {
        nn::Variable u(Tensor(DataType::Float32, {1}), true);
        if (fails && k == 0) u.grad() = Tensor(DataType::Float32, {2});
        const nn::Variable xs(
            Tensor::from<float>(std::vector<float>{static_cast<float>(x(rank, step, k))}, {1}));
        // p's term is made after u's, so that its result is the newer and the walk reaches p
        // (its hook) before u, whose grad() throws. Written as one expression, which operand
        // is made first is unspecified: clang made u's term last, and p's gradient went as
        // zeros.
        const nn::Variable u_term = nn::sum(u);
        const nn::Variable p_term = nn::sum(p * xs);
        (p_term + u_term).backward();
      }
      dist.step();
    } catch (const Error& e) {
      message = e.what();
    }
    if (fails) {
      const ErrorCode refused = code_of([&] { dist.step(); });
      const std::string advice = [&] {
        try {
          dist.synchronize();
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string();
      }();
      ok = ok && !message.empty() && refused == ErrorCode::InvalidArgument &&
           advice.find("skips the step") != std::string::npos;
      log += " rank 0 at step 1: " + message + " / " + advice;
      dist.zero_grad();  // Nothing in flight: the failed backward() waited for its reductions.
      continue;
    }
    // At step 1 rank 0 sent what it had: its pass 0 (its hook ran), not its pass 1.
    double expected = 0;
    for (int r = 0; r < size; ++r) {
      for (int k = 0; k < passes; ++k) {
        if (!(step == 1 && r == 0 && k > 0)) expected += x(r, step, k);
      }
    }
    expected /= size;
    const double got = p.grad().span<float>()[0];
    ok = ok && message.empty() && std::abs(got - expected) < 1e-3;
    if (!message.empty() || std::abs(got - expected) >= 1e-3) {
      log += " step " + std::to_string(step) + ": " + std::to_string(got) + " for " +
             std::to_string(expected) + " " + message;
    }
    dist.zero_grad();
  }
  INFO("passes " << passes << log);
  CHECK(all_ranks(ok));
}

TEST_CASE("A grad() that cannot travel goes as zeros; its rank's synchronize() names it",
          "[distributed][errors]") {
  // Rank 0 runs no backward() and holds an absent or wrong-shaped grad(). Before, the absent
  // one made its allreduce throw before it was submitted, and the others waited for it.
  Session session;
  const bool absent = GENERATE(true, false);
  const int rank = tutti::rank();
  const int size = tutti::size();
  nn::Variable b(Tensor(DataType::Float32, {2}), true);
  const nn::NamedParameters named = {{"b", b}};
  optim::SGD inner(variables(named), {.lr = 0.0});
  DistributedOptimizer dist(inner, named);
  if (rank != 0) {
    nn::sum(b * dot_input(rank, 0)).backward();
  } else {
    b.grad() = absent ? Tensor() : Tensor::from<float>(std::vector<float>{5, 5, 5}, {3});
  }
  const auto [code, message] = [&]() -> std::pair<ErrorCode, std::string> {
    try {
      dist.synchronize();
    } catch (const Error& e) {
      return {e.code(), e.what()};
    }
    return {ErrorCode::Internal, ""};
  }();
  INFO(message);
  CHECK(all_ranks(rank == 0 ? code == ErrorCode::InvalidArgument &&
                                  message.find("'b'") != std::string::npos
                            : code == ErrorCode::Internal &&
                                  grad_is(b, average_of_inputs(size, 0, /*rank0_zero=*/true))));
  // Rank 0's grad() is left as it was; it must be replaced before zero_grad() (which checks it).
  CHECK(
      all_ranks(rank != 0 || (absent ? b.grad().data() == nullptr : b.grad().num_elements() == 3)));
  if (rank == 0) {
    CHECK(code_of([&] { dist.step(); }) == ErrorCode::InvalidArgument);
    b.grad() = Tensor(DataType::Float32, {2});
    dist.zero_grad();
  } else {
    auto guard = dist.skip_synchronize();
    dist.step();
  }
}

TEST_CASE("step() inside skip_synchronize() without synchronize() applies the hooks' reductions",
          "[distributed]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = make_model(37);
  auto reference = make_model(37);
  const nn::NamedParameters named = model->named_parameters();
  const nn::NamedParameters ref_named = reference->named_parameters();
  auto inner = make_optimizer(3, variables(named));
  auto ref_opt = make_optimizer(3, variables(ref_named));
  DistributedOptimizer dist(*inner, named, {.num_groups = 2});
  forward_backward(*model, shard(rank, size, 0));  // The hooks start the reductions...
  {
    auto guard = dist.skip_synchronize();
    dist.step();  // ...which are finished and applied, as Horovod's in-place ones would be.
  }
  forward_backward(*reference, full_batch(0));  // The average of the shards' gradients.
  ref_opt->step();
  CHECK(all_ranks(max_diff(named, ref_named) < 1e-6));
  // The next round starts clean: names and buffers are free again.
  dist.zero_grad();
  forward_backward(*model, shard(rank, size, 1));
  CHECK(all_ranks(code_of([&] { dist.step(); }) == ErrorCode::Internal));
}

// w is used by every rank; u only by ranks other than 0, with loss term rank · sum(u²), so
// d/du on rank r is 2 r u and the average over n ranks is (n - 1) u.
class TwoBranches : public nn::Module {
 public:
  TwoBranches() {
    w = register_parameter("w", nn::Variable(Tensor(DataType::Float32, {4, 2})));
    u = register_parameter("u",
                           nn::Variable(Tensor::from<float>(std::vector<float>{1, -2, 3}, {3})));
    float value = 0.1f;
    for (float& x : w.value().span<float>()) x = (value += 0.05f);
  }
  nn::Variable forward(const nn::Variable& x) override { return nn::matmul(x, w); }
  nn::Variable loss(const Batch& batch, int rank) {
    nn::Variable l = nn::mse_loss(forward(batch.x), batch.y);
    if (rank == 0) return l;
    const nn::Variable r(Tensor::from<float>(std::vector<float>{static_cast<float>(rank)}, {1}));
    return l + nn::sum(u * u) * r;
  }
  nn::Variable w, u;
};

TEST_CASE("A parameter without a gradient on some rank does not hang and averages correctly",
          "[distributed][unused]") {
  Session session;
  const bool rank0_skips_backward = GENERATE(false, true);
  const int rank = tutti::rank();
  const int size = tutti::size();
  TwoBranches model;
  const nn::NamedParameters named = model.named_parameters();
  optim::SGD sgd(variables(named), {.lr = 0.1});
  DistributedOptimizer dist(sgd, named);
  if (!(rank == 0 && rank0_skips_backward)) model.loss(shard(rank, size, 0), rank).backward();
  dist.synchronize();

  // Oracle for w: the ranks' local gradients, each computed here, summed and divided by size.
  std::vector<double> expected_w(8, 0.0);
  for (int r = 0; r < size; ++r) {
    if (r == 0 && rank0_skips_backward) continue;
    TwoBranches local;
    nn::mse_loss(local.forward(shard(r, size, 0).x), shard(r, size, 0).y).backward();
    const auto g = local.w.grad().span<float>();
    for (std::size_t i = 0; i < g.size(); ++i) expected_w[i] += g[i] / static_cast<double>(size);
  }
  bool ok = true;
  const auto gw = model.w.grad().span<float>();
  for (std::size_t i = 0; i < gw.size(); ++i) ok = ok && std::abs(gw[i] - expected_w[i]) < 1e-5;
  const std::vector<float> u0 = {1, -2, 3};
  const auto gu = model.u.grad().span<float>();
  for (std::size_t i = 0; i < gu.size(); ++i) {
    ok = ok && std::abs(gu[i] - static_cast<float>(size - 1) * u0[i]) < 1e-5f;
  }
  CHECK(all_ranks(ok));
  {
    auto guard = dist.skip_synchronize();
    dist.step();
  }
}

TEST_CASE("Gradient clipping flow: synchronize, clip, step inside skip_synchronize()",
          "[distributed][clipping]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = make_model(19);
  auto reference = make_model(19);
  const nn::NamedParameters named = model->named_parameters();
  const nn::NamedParameters ref_named = reference->named_parameters();
  auto inner = make_optimizer(0, variables(named));
  auto ref_opt = make_optimizer(0, variables(ref_named));
  DistributedOptimizer dist(*inner, named);
  CaptureStderr capture;
  for (std::int64_t step = 0; step < 3; ++step) {
    dist.zero_grad();
    forward_backward(*model, shard(rank, size, step));
    dist.synchronize();
    clip_grad_norm(named, 0.05);  // Small enough to clip every step.
    {
      auto guard = dist.skip_synchronize();
      dist.step();
    }
    ref_opt->zero_grad();
    forward_backward(*reference, full_batch(step));
    clip_grad_norm(ref_named, 0.05);
    ref_opt->step();
  }
  const std::string err = capture.text();
  CHECK(all_ranks(max_diff(named, ref_named) < 1e-5));
  CHECK(all_ranks(count_occurrences(err, "skip_synchronize()") == 0));
}

TEST_CASE("step() after synchronize() without the guard warns once and does not reduce twice",
          "[distributed][warning]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = make_model(23);
  auto reference = make_model(23);
  const nn::NamedParameters named = model->named_parameters();
  const nn::NamedParameters ref_named = reference->named_parameters();
  // Sum would double-count a second reduction: the reference steps with lr · size.
  auto inner = make_optimizer(3, variables(named));
  auto ref_opt = make_optimizer(3, variables(ref_named), size);
  std::string err;
  {
    CaptureStderr capture;
    DistributedOptimizer dist(*inner, named, {.op = ReduceOp::Sum});
    for (std::int64_t step = 0; step < 3; ++step) {
      dist.zero_grad();
      forward_backward(*model, shard(rank, size, step));
      dist.synchronize();
      dist.step();  // Warns the first time only.
      ref_opt->zero_grad();
      forward_backward(*reference, full_batch(step));
      ref_opt->step();
    }
    err = capture.text();
  }
  const std::string warning = "step() called without skip_synchronize()";
  INFO("captured stderr: " << err);
  CHECK(all_ranks(count_occurrences(err, warning) == 1));
  // One line: the warning's line has no line break inside.
  const std::size_t at = err.find(warning);
  const std::size_t begin = err.rfind('\n', at) == std::string::npos ? 0 : err.rfind('\n', at) + 1;
  const std::size_t end = err.find('\n', at);
  CHECK(all_ranks(at != std::string::npos && end != std::string::npos &&
                  err.substr(begin, end - begin).find("WARNING") != std::string::npos));
  CHECK(all_ranks(max_diff(named, ref_named) < 1e-5));

  // Once per optimizer object: a new one warns again.
  CaptureStderr capture;
  DistributedOptimizer again(*inner, named);
  forward_backward(*model, shard(rank, size, 0));
  again.synchronize();
  again.step();
  CHECK(all_ranks(count_occurrences(capture.text(), warning) == 1));
}

TEST_CASE("zero_grad() while reductions are in flight is InvalidArgument", "[distributed]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  auto model = make_model(29);
  const nn::NamedParameters named = model->named_parameters();
  auto inner = make_optimizer(0, variables(named));
  DistributedOptimizer dist(*inner, named, {.compression = Compression::FP16});
  forward_backward(*model, shard(rank, size, 0));
  CHECK(all_ranks(code_of([&] { dist.zero_grad(); }) == ErrorCode::InvalidArgument));
  dist.synchronize();
  CHECK(all_ranks(code_of([&] { dist.zero_grad(); }) == ErrorCode::Internal));
  bool zero = true;
  for (const auto& [name, p] : named) {
    for (float g : p.grad().span<float>()) zero = zero && g == 0;
  }
  CHECK(all_ranks(zero));
  auto guard = dist.skip_synchronize();
  dist.step();
}

TEST_CASE("A DistributedOptimizer over a process set reduces among its members only",
          "[distributed][process_set]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  if (size < 3) return;  // {0, 1} must differ from the global set. The same on every rank.
  ProcessSet pair = add_process_set({0, 1});
  auto model = make_model(31);
  auto reference = make_model(31);
  const nn::NamedParameters named = model->named_parameters();
  auto inner = make_optimizer(3, variables(named));
  {
    DistributedOptimizer dist(*inner, named, {.process_set = pair});
    forward_backward(*model, shard(rank, size, 0));
    dist.synchronize();
    // Members hold the mean of shards 0 and 1; the others keep their own gradient.
    if (rank <= 1) {
      forward_backward(*reference, shard(0, size, 0));
      forward_backward(*reference, shard(1, size, 0));
      CHECK(all_ranks(max_diff(named, reference->named_parameters(), true, 0.5) < 1e-5));
    } else {
      forward_backward(*reference, shard(rank, size, 0));
      CHECK(all_ranks(max_diff(named, reference->named_parameters(), true) < 1e-6));
    }
    auto guard = dist.skip_synchronize();
    dist.step();
  }
  remove_process_set(pair);
}

// Whether some host runs at least as many ranks as it has cores, from plain MPI.
bool cores_shared_by_mpi() {
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  int on_host = 0;
  MPI_Comm_size(host, &on_host);
  MPI_Comm_free(&host);
  const unsigned cores = std::thread::hardware_concurrency();
  int shared = cores != 0 && static_cast<unsigned>(on_host) >= cores ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &shared, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return shared != 0;
}

// The mpi suite runs this binary with TUTTI_GRADIENT_GROUPING unset, =each and =one.
// Two optimizers over one model, e.g. one for the body and one for the head, share each
// backward(): their reductions must not take each other's names, grouped or not.
TEST_CASE("Two DistributedOptimizers over disjoint parameters share one backward()",
          "[distributed][grouping]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const int num_groups = GENERATE(0, 1, 2);  // The job's default, one group, two groups.
  INFO("num_groups " << num_groups);
  auto model = make_model(41);
  auto reference = make_model(41);
  const nn::NamedParameters named = model->named_parameters();
  const nn::NamedParameters ref_named = reference->named_parameters();
  std::vector<nn::Variable> body, head;
  for (const auto& [name, p] : named) (name.starts_with("0.") ? body : head).push_back(p);
  REQUIRE(!body.empty());
  REQUIRE(!head.empty());
  auto body_inner = make_optimizer(3, body);
  auto head_inner = make_optimizer(3, head);
  auto ref_opt = make_optimizer(3, variables(ref_named));
  DistributedOptimizer body_opt(*body_inner, named, {.num_groups = num_groups});
  DistributedOptimizer head_opt(*head_inner, named, {.num_groups = num_groups});
  for (std::int64_t step = 0; step < 2; ++step) {
    body_opt.zero_grad();
    head_opt.zero_grad();
    forward_backward(*model, shard(rank, size, step));
    body_opt.step();
    head_opt.step();
    ref_opt->zero_grad();
    forward_backward(*reference, full_batch(step));
    ref_opt->step();
  }
  const double diff = max_diff(named, ref_named);
  INFO("max |difference| " << diff);
  CHECK(all_ranks(diff < 1e-5));
}

TEST_CASE("Options that name no grouping follow TUTTI_GRADIENT_GROUPING; auto, the hosts' cores",
          "[distributed][grouping]") {
  Session session;
  const int rank = tutti::rank();
  const int size = tutti::size();
  const char* set = std::getenv("TUTTI_GRADIENT_GROUPING");
  const std::string mode = set != nullptr ? set : "auto";
  const bool shared = cores_shared_by_mpi();
  const int expected = mode == "one" ? 1 : mode == "each" ? 0 : shared ? 1 : 0;
  INFO("TUTTI_GRADIENT_GROUPING " << mode << ", cores shared " << shared);
  CHECK(all_ranks(tutti::cores_shared() == shared));
  CHECK(all_ranks(tutti::default_gradient_groups() == expected));

  auto model = make_model(37);
  auto reference = make_model(37);
  const nn::NamedParameters named = model->named_parameters();
  auto inner = make_optimizer(3, variables(named));
  DistributedOptimizer dist(*inner, named);
  forward_backward(*model, shard(rank, size, 0));
  dist.synchronize();
  // The reductions this rank ran: one grouped allreduce, or one allreduce per gradient.
  int grouped = 0;
  int alone = 0;
  for (const debug::OpRecord& op : debug::flight_recorder()) {
    if (op.name.starts_with("DistributedOptimizer.grouped_allreduce.")) ++grouped;
    if (op.name.starts_with("DistributedOptimizer.allreduce.")) ++alone;
  }
  const int parameters = static_cast<int>(named.size());
  INFO("grouped " << grouped << ", alone " << alone << " of " << parameters << " parameters");
  CHECK(
      all_ranks(expected == 1 ? grouped == 1 && alone == 0 : grouped == 0 && alone == parameters));
  // Either way the gradient is the whole batch's.
  for (int r = 0; r < size; ++r) forward_backward(*reference, shard(r, size, 0));
  CHECK(all_ranks(max_diff(named, reference->named_parameters(), true, 1.0 / size) < 1e-5));
  auto guard = dist.skip_synchronize();
  dist.step();
}

}  // namespace
}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// The example of torch.distributed.autograd's design note, over Tutti's RPC: worker 0 sends t1
// and t2 to worker 1's my_add, multiplies the result with its own t4, sums, and runs the
// distributed backward; then it prints the gradients next to those of the same computation
// done locally, and exits 1 if they differ by more than 1e-6 (2 for any argument: it takes none;
// --help prints the usage).
//
// Usage: scripts/tuttirun -np 2 build/examples/rpc_autograd   (at 1 rank worker 0 calls itself)
#include <tutti/distributed_autograd.h>
#include <tutti/nn.h>
#include <tutti/rpc.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "examples/flag_reader.h"

namespace {

using tutti::nn::Variable;

constexpr char kUsage[] = "usage: rpc_autograd   (it takes no flags)\n";

tutti::rpc::Message my_add(const tutti::rpc::Message& args) {
  return {.tensors = {args.tensors[0] + args.tensors[1]}, .rrefs = {}, .bytes = {}};
}

tutti::Tensor values(float first, float step) {
  std::vector<float> v(9);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = first + step * static_cast<float>(i);
  return tutti::Tensor::from<float>(v, {3, 3});
}

// Prints one gradient from both computations; returns the largest difference.
double show(const char* name, const tutti::Tensor& distributed, const tutti::Tensor& local) {
  double worst = 0;
  std::printf("%s  distributed | local\n", name);
  for (int row = 0; row < 3; ++row) {
    std::printf("   ");
    for (int col = 0; col < 3; ++col)
      std::printf(" %8.4f", distributed.span<float>()[row * 3 + col]);
    std::printf("  |");
    for (int col = 0; col < 3; ++col) {
      const float d = distributed.span<float>()[row * 3 + col],
                  l = local.span<float>()[row * 3 + col];
      std::printf(" %8.4f", l);
      worst = std::max(worst, std::abs(double(d) - double(l)));
    }
    std::printf("\n");
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  // It takes no flags: anything on the command line is refused rather than ignored.
  tutti::examples::FlagReader flags("rpc_autograd", argc, argv);
  while (flags.next()) flags.unknown();
  if (const std::optional<int> exit_status = flags.exit_status(kUsage)) return *exit_status;
  tutti::init();
  tutti::rpc::register_function("my_add", my_add);
  tutti::rpc::init_rpc("worker" + std::to_string(tutti::rank()));
  int status = 0;
  if (tutti::rank() == 0) {
    const std::string callee = "worker" + std::to_string(tutti::size() > 1 ? 1 : 0);
    const tutti::Tensor v1 = values(0.5f, 0.25f), v2 = values(-1.0f, 0.3f),
                        v4 = values(2.0f, -0.1f);
    Variable t1(v1.clone(), true), t2(v2.clone(), true), t4(v4.clone(), true);
    tutti::Tensor g1, g2, g4;
    {
      tutti::dist_autograd::Context context;
      Variable t3 =
          tutti::rpc::rpc_sync(callee, "my_add", {.tensors = {t1, t2}, .rrefs = {}, .bytes = {}})
              .tensors[0];
      Variable t5 = t3 * t4;
      Variable loss = tutti::nn::sum(t5);
      tutti::dist_autograd::backward(context.id(), {loss});
      g1 = tutti::dist_autograd::get_gradient(context.id(), t1);
      g2 = tutti::dist_autograd::get_gradient(context.id(), t2);
      g4 = tutti::dist_autograd::get_gradient(context.id(), t4);
    }
    Variable l1(v1.clone(), true), l2(v2.clone(), true), l4(v4.clone(), true);
    tutti::nn::sum((l1 + l2) * l4).backward();
    std::printf("loss = sum((t1 + t2) * t4), t1 + t2 computed on %s\n", callee.c_str());
    double worst = show("d loss / d t1", g1, l1.grad());
    worst = std::max(worst, show("d loss / d t2", g2, l2.grad()));
    worst = std::max(worst, show("d loss / d t4", g4, l4.grad()));
    std::printf("rpc_autograd: largest difference %.3g %s\n", worst,
                worst <= 1e-6 ? "(match)" : "(MISMATCH)");
    status = worst <= 1e-6 ? 0 : 1;
  }
  tutti::rpc::shutdown();
  tutti::shutdown();
  return status;
}

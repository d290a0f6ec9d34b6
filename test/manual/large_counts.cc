// SPDX-License-Identifier: Apache-2.0
// Usage: mpirun -n 2 build-test/test/manual/large_counts [alltoall] [reducescatter] [adasum]
// (all three when none is named; built on demand: ninja -C build-test test/manual/large_counts).
// By hand, not in CI (issue 30): alltoall, reducescatter and Adasum of tensors past MPI's int
// counts (2^31 elements) at real size, on 2 ranks, on MPI and on shared memory alike
// (TUTTI_HOST_TRANSPORT picks), each against a closed form at every 4099th element and the last
// ones. test/mpi/collectives/large_layout_test.cc runs the same paths in CI with a 7-element
// piece size. Memory per rank: alltoall and reducescatter of uint8, 2^31+34 elements, about 4.5
// GiB; Adasum of float32, 2^31+6 elements, the tensor's 8 GiB and a 16 MiB piece (combined in
// place; float16 would be widened into a float32 fusion buffer of twice its size). Prints one
// line per op with its time; exits 1 if any sampled element is wrong.
#include <tutti/tutti.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace {

constexpr std::int64_t kElements = (std::int64_t{1} << 31) + 34;  // Even: 2 equal halves.
constexpr std::int64_t kHalf = kElements / 2;

// Every 4099th index below `n`, and the last 64.
template <class F>
bool sample_all(std::int64_t n, F&& ok) {
  for (std::int64_t i = 0; i < n; i += 4099) {
    if (!ok(i)) return false;
  }
  for (std::int64_t i = n > 64 ? n - 64 : 0; i < n; ++i) {
    if (!ok(i)) return false;
  }
  return true;
}

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::uint8_t pattern(int rank, std::int64_t i) {
  return static_cast<std::uint8_t>((rank * 7 + (i % 1000003) * 13) % 251);
}

bool check_alltoall(int rank) {
  std::vector<std::uint8_t> input(static_cast<std::size_t>(kElements));
  for (std::int64_t i = 0; i < kElements; ++i)
    input[static_cast<std::size_t>(i)] = pattern(rank, i);
  const auto start = std::chrono::steady_clock::now();
  // Equal splits: rank s receives elements [s * kHalf, (s + 1) * kHalf) of every rank's input.
  tutti::AlltoallResult result =
      tutti::alltoall(tutti::TensorView(input.data(), {kElements}), {}, "large.alltoall");
  const double seconds = since(start);
  input = {};
  const std::span<const std::uint8_t> out = result.output.span<std::uint8_t>();
  const bool ok =
      out.size() == static_cast<std::size_t>(kElements) &&
      sample_all(kElements, [&](std::int64_t i) {
        const int from = static_cast<int>(i / kHalf);
        return out[static_cast<std::size_t>(i)] == pattern(from, rank * kHalf + i % kHalf);
      });
  std::printf("rank %d: alltoall of %lld uint8 elements: %.1f s, %s\n", rank,
              static_cast<long long>(kElements), seconds, ok ? "correct" : "WRONG");
  return ok;
}

bool check_reducescatter(int rank) {
  // (rank + i) % 100 summed over 2 ranks: (i % 100) + ((1 + i) % 100), below 256.
  std::vector<std::uint8_t> input(static_cast<std::size_t>(kElements));
  for (std::int64_t i = 0; i < kElements; ++i) {
    input[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>((rank + i) % 100);
  }
  const auto start = std::chrono::steady_clock::now();
  tutti::Tensor out = tutti::reducescatter(tutti::TensorView(input.data(), {kElements}),
                                           "large.reducescatter", {.op = tutti::ReduceOp::Sum});
  const double seconds = since(start);
  input = {};
  const std::span<const std::uint8_t> got = out.span<std::uint8_t>();
  const bool ok =
      got.size() == static_cast<std::size_t>(kHalf) && sample_all(kHalf, [&](std::int64_t i) {
        const std::int64_t global = rank * kHalf + i;
        return got[static_cast<std::size_t>(i)] == global % 100 + (1 + global) % 100;
      });
  std::printf("rank %d: reducescatter of %lld uint8 elements: %.1f s, %s\n", rank,
              static_cast<long long>(kElements), seconds, ok ? "correct" : "WRONG");
  return ok;
}

bool check_adasum(int rank) {
  // Rank 0 all 1.0, rank 1 all 2.0: a.b = 2N, |a|^2 = N, |b|^2 = 4N, so Adasum is
  // (1 - 2N / 2N) a + (1 - 2N / 8N) b = 0.75 b = 1.5 everywhere, exact in float32.
  constexpr std::int64_t n = kElements - 28;  // 2^31 + 6.
  std::vector<float> data(static_cast<std::size_t>(n), rank == 0 ? 1.0f : 2.0f);
  const auto start = std::chrono::steady_clock::now();
  tutti::allreduce(tutti::TensorView(data.data(), {n}), "large.adasum",
                   {.op = tutti::ReduceOp::Adasum});
  const double seconds = since(start);
  const bool ok =
      sample_all(n, [&](std::int64_t i) { return data[static_cast<std::size_t>(i)] == 1.5f; });
  std::printf("rank %d: Adasum of %lld float32 elements: %.1f s, %s\n", rank,
              static_cast<long long>(n), seconds, ok ? "correct" : "WRONG");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> ops(argv + 1, argv + argc);
  if (ops.empty()) ops = {"alltoall", "reducescatter", "adasum"};
  tutti::init();
  if (tutti::size() != 2) {
    std::fprintf(stderr, "large_counts: run with 2 ranks (the closed forms assume 2)\n");
    tutti::shutdown();
    return 2;
  }
  bool ok = true;
  for (const std::string& op : ops) {
    if (op == "alltoall") {
      ok = check_alltoall(tutti::rank()) && ok;
    } else if (op == "reducescatter") {
      ok = check_reducescatter(tutti::rank()) && ok;
    } else if (op == "adasum") {
      ok = check_adasum(tutti::rank()) && ok;
    } else {
      std::fprintf(stderr, "large_counts: unknown op '%s'\n", op.c_str());
      ok = false;
    }
  }
  tutti::shutdown();
  return ok ? 0 : 1;
}

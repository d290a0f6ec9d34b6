// SPDX-License-Identifier: Apache-2.0
// P7 of DESIGN.md section 6: the round trip of rpc_sync against a raw MPI ping-pong of the same
// bytes, for an empty message and for a 1 MiB tensor. Rank 0 calls rank 1's "echo" (which
// returns its arguments, so the tensor crosses both ways, as the raw ping-pong's bytes do).
// The raw ping-pong runs on a duplicate of MPI_COMM_WORLD while the RPC agent idles. Medians.
//
// Usage: mpirun -n 2 build/examples/rpc_benchmark [--iterations N] [--mb-iterations M]
//                                               [--sweep-sizes]
//   --iterations     empty round trips timed, 1 to 10^6 (default 2000)
//   --mb-iterations  1 MiB round trips timed, 1 to 10^6 (default 200)
//   --sweep-sizes    then larger tensors, 4, 16 and 64 MiB (Note [Large payloads]): a line each,
//                    P7 sizes bytes=<size> rpc_us=<median round trip> raw_us=<raw> ratio=<rpc/raw>
// Ends with: P7 rpc_us=<empty rpc_sync> raw_us=<empty raw ping-pong> mb_ratio=<1 MiB rpc / raw>
//
// Note [Large payloads]
// P7 has only a 1 MiB tensor, and tensors of tens of MiB (a model's layer, a shard) went through
// RPC 15-114x slower than raw MPI before their buffers were kept for reuse (Note [Byte buffers
// kept for reuse] in src/common/byte_buffers.h): what fresh memory costs shows only above
// glibc's mapping threshold. Each size runs max(3, M / size in MiB) round trips after one
// warm-up, then the raw ping-pong as many times.
#include <tutti/nn.h>
#include <tutti/rpc.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <mpi.h>

#include "examples/flag_reader.h"
#include "examples/machine_line.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "usage: rpc_benchmark [--iterations N] [--mb-iterations M] [--sweep-sizes]\n";
constexpr std::int64_t kMaxIterations = 1'000'000;

double median_us(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples.empty() ? 0 : samples[samples.size() / 2];
}

// Round trips of rpc_sync(callee, "echo", message), in microseconds.
std::vector<double> time_rpc(const std::string& callee, const tutti::rpc::Message& message,
                             int iterations) {
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) {
    const Clock::time_point start = Clock::now();
    tutti::rpc::Message back = tutti::rpc::rpc_sync(callee, "echo", message);
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return samples;
}

// Round trips of a raw ping-pong of `bytes` between ranks 0 and 1 (collective over both).
std::vector<double> time_raw(MPI_Comm comm, int rank, std::size_t bytes, int iterations) {
  std::vector<char> buffer(std::max<std::size_t>(bytes, 1));
  const int count = static_cast<int>(bytes);
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) {
    if (rank == 0) {
      const Clock::time_point start = Clock::now();
      MPI_Send(buffer.data(), count, MPI_BYTE, 1, 0, comm);
      MPI_Recv(buffer.data(), count, MPI_BYTE, 1, 0, comm, MPI_STATUS_IGNORE);
      samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    } else if (rank == 1) {
      MPI_Recv(buffer.data(), count, MPI_BYTE, 0, 0, comm, MPI_STATUS_IGNORE);
      MPI_Send(buffer.data(), count, MPI_BYTE, 0, 0, comm);
    }
  }
  return samples;
}

// A message with one tensor of `bytes` (a multiple of 4).
tutti::rpc::Message tensor_message(std::size_t bytes) {
  return {.tensors = {tutti::nn::Variable(tutti::Tensor(
              tutti::DataType::Float32, {static_cast<std::int64_t>(bytes / sizeof(float))}))},
          .rrefs = {},
          .bytes = {}};
}

// Note [Large payloads]. Collective over ranks 0 and 1; the raw ping-pong on `comm`.
void sweep_sizes(MPI_Comm comm, int rank, int mb_iterations) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  for (const std::size_t mib : {4, 16, 64}) {
    const std::size_t bytes = mib * kMiB;
    const int iterations = std::max(3, static_cast<int>(mb_iterations / static_cast<int>(mib)));
    double rpc = 0;
    if (rank == 0) {
      const tutti::rpc::Message message = tensor_message(bytes);
      time_rpc("w1", message, 1);
      rpc = median_us(time_rpc("w1", message, iterations));
    }
    tutti::barrier();
    time_raw(comm, rank, bytes, 1);
    const double raw = median_us(time_raw(comm, rank, bytes, iterations));
    if (rank == 0) {
      std::printf("P7 sizes bytes=%zu rpc_us=%.0f raw_us=%.0f ratio=%.2f (median of %d)\n", bytes,
                  rpc, raw, rpc / raw, iterations);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000, mb_iterations = 200;
  bool sweep = false;
  // At least one of each: a median of none would print 0 and a ratio of NaN.
  tutti::examples::FlagReader flags("rpc_benchmark", argc, argv);
  while (flags.next()) {
    if (flags.is("--iterations"))
      iterations = static_cast<int>(flags.integer(1, kMaxIterations));
    else if (flags.is("--mb-iterations"))
      mb_iterations = static_cast<int>(flags.integer(1, kMaxIterations));
    else if (flags.is("--sweep-sizes"))
      sweep = true;
    else
      flags.unknown();
  }
  if (const std::optional<int> exit_status = flags.exit_status(kUsage)) return *exit_status;
  tutti::init();
  if (tutti::size() < 2) {
    std::fprintf(stderr, "rpc_benchmark needs 2 ranks\n");
    tutti::shutdown();
    return 2;
  }
  // First line: the machine (CPU model, MPI library, binding), as every benchmark prints it.
  {
    const std::string machine = tutti::examples::machine_line();
    if (tutti::rank() == 0) std::printf("%s\n", machine.c_str());
  }
  tutti::rpc::register_function("echo", [](const tutti::rpc::Message& m) { return m; });
  tutti::rpc::init_rpc("w" + std::to_string(tutti::rank()));
  const int rank = tutti::rank();
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const tutti::rpc::Message empty;
  const tutti::rpc::Message mib = tensor_message(kMiB);
  double rpc_empty = 0, rpc_mib = 0;
  if (rank == 0) {
    time_rpc("w1", empty, iterations / 10 + 1);  // Warm-up.
    rpc_empty = median_us(time_rpc("w1", empty, iterations));
    time_rpc("w1", mib, mb_iterations / 10 + 1);
    rpc_mib = median_us(time_rpc("w1", mib, mb_iterations));
  }
  tutti::barrier();
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  time_raw(comm, rank, 0, iterations / 10 + 1);
  const double raw_empty = median_us(time_raw(comm, rank, 0, iterations));
  time_raw(comm, rank, kMiB, mb_iterations / 10 + 1);
  const double raw_mib = median_us(time_raw(comm, rank, kMiB, mb_iterations));
  if (rank == 0) {
    std::printf(
        "P7 empty message: rpc_sync round trip %.1f us, raw MPI ping-pong %.1f us (median of %d)\n",
        rpc_empty, raw_empty, iterations);
    std::printf(
        "P7 1 MiB tensor:  rpc_sync round trip %.1f us, raw MPI ping-pong %.1f us (median of %d)\n",
        rpc_mib, raw_mib, mb_iterations);
  }
  if (sweep) sweep_sizes(comm, rank, mb_iterations);
  MPI_Comm_free(&comm);
  if (rank == 0) {
    std::printf("P7 rpc_us=%.1f raw_us=%.1f mb_ratio=%.2f\n", rpc_empty, raw_empty,
                rpc_mib / raw_mib);
  }
  tutti::rpc::shutdown();
  tutti::shutdown();
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// Tutti's allreduce against plain MPI in the same run (DESIGN.md section 6). Rank 0 prints.
// --device cpu (the default):
//   P1  ResNet-50's 161 gradients via allreduce_async, against the best of raw MPI_Allreduce
//       over the same bytes in 1, 4, 16 and 64 MB pieces
//   P2  median latency of a lone 1-float allreduce, against raw MPI_Allreduce
//   P3  10,000 tiny named tensors per step (cache warm), against a raw per-tensor loop
//   P4  CPU used by an idle initialized runtime over 5 s
// --p10 (instead of P1-P4; run on several hosts, e.g. 2 x 2 in scripts/netns_cluster):
//   P10 flat vs hierarchical allreduce vs raw MPI_Allreduce (examples/p10_hierarchical.h)
// --device cuda (CUDA builds; each rank uses cuda:(local_rank % devices)); the flags are echoed:
//   D1  the same gradients as float32 CUDA tensors via allreduce_async (Average), then all
//       waited, best of --repeats, with the GPU model, the ranks per GPU and so the transport
//       Tutti picks (NCCL when every rank has a GPU of its own, one rank included, else MPI
//       through page-locked host staging). Against P1's raw reference in host memory (no
//       ratio at one rank, where MPI moves nothing); with NCCL, against the hand-written fused
//       step on the GPU: pack kernel + one ncclAllReduce of the fused buffer + unpack, timed
//       with CUDA events (nccl_reference.h; target <= 1.1x); when host-staged, against the
//       ideal staged pipeline: cudaMemcpy D2H + one MPI_Allreduce + H2D of one buffer
//   D2  rank 0's fusion kernel alone: pack/unpack of the set (plain, scaled, float16 and
//       bfloat16 <-> float32) against one cudaMemcpyAsync D2D of the same bytes; target >= 0.9x
//       (fusion_kernel_figures.h; cuda_fusion_benchmark prints the same without MPI)
//   D3  what tutti/cuda.h's ordering costs per op: the median latency of a lone 1-float CUDA
//       allreduce (submitted and waited, as P2) with an application stream current, and on
//       rank 0 the host time of the ordering's own two calls per op (a pooled event recorded
//       on that stream, Tutti's stream made to wait for it), averaged over 10,000 ops
// Usage: mpirun -n 2 allreduce_benchmark [--device cpu|cuda] [--grads FILE] [--repeats N]
//                                        [--kernel-repeats N] [--sweep-fusion]
//                                        [--transport LIST] [--sweep-sizes] [--autotune]
//                                        [--stores] [--recorder] [--p10 [--p10-mb N]]
//   --grads FILE        another gradient list, one element count per line (default: the
//                       built-in ResNet-50 list, examples/grad_list.h)
//   --repeats N         timed rounds after one warm-up; figures are the best (default 5)
//   --kernel-repeats N  D2's runs per figure, averaged after 3 warm-up runs (default 50)
//   --sweep-fusion      --device cpu only: also runs P1 at several TUTTI_FUSION_THRESHOLD
//                       values (restarting Tutti)
//   --transport LIST    --device cpu only: also runs P1 with TUTTI_HOST_TRANSPORT set to each of
//                       the comma-separated auto, mpi, shm (one "P1 transport=" line each)
//   --sweep-sizes       --device cpu only: one allreduce of 4 B to 64 MB on each host transport
//                       against raw MPI (median microseconds)
//   --p10, --p10-mb N   P10 only (--repeats rounds), single tensors of 4 KB, 64 KB, 1 MB and
//                       16 MB up to N MB
//   --autotune          --device cpu only, instead of P1-P4: P1 step after step under
//                       TUTTI_AUTOTUNE=1 until the tuner settles (at most 3000 steps), then
//                       --repeats interleaved rounds of P1 at the sweep's thresholds and the
//                       tuned one; ends with "P1-autotune tuned_ms=... best_fixed_ms=...
//                       ratio=... threshold=... steps=..."
//   --stores            --device cpu only, instead of P1-P4: --repeats rounds of P1 (median of 20
//                       steps) under TUTTI_SHM_STREAMING_STORES=0, 1 and auto, each round with
//                       the cache-line round trip between ranks 0 and 1 (examples/p1_stores.h)
//   --recorder          --device cpu only, instead of P1-P4: --repeats rounds of P3 (median of 9
//                       steps) with the flight recorder on and off, alternated in one process,
//                       and raw MPI's loop (examples/p3_recorder.h)
// --p10, --autotune, --stores and --recorder each replace P1-P4, so they exclude one another and
// the flags that change P1 (--sweep-fusion, --transport, --sweep-sizes); --p10-mb needs --p10,
// --kernel-repeats needs --device cuda, and --recorder takes no --grads (P3 has its own tensors).
// P2 and P3 are preceded by "P2 detail" and "P3 detail" lines: context switches and CPU time per
// op, one value per rank, Tutti's and raw MPI's (examples/process_usage.h).
// Exits 1 if a P3 step's sums are wrong; 2 for a bad flag or combination, or --device cuda in a
// build without CUDA; 77 with "no CUDA device" when a rank sees none. A CUDA build links tutti_core
// (D2 drives ops::DeviceOps directly), a CPU build the public library; examples/meson.build sets
// TUTTI_BENCHMARK_CUDA to match.
#include <tutti/tutti.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <mpi.h>

#include "examples/figures.h"
#include "examples/flag_reader.h"
#include "examples/grad_list.h"
#include "examples/machine_line.h"
#include "examples/p10_hierarchical.h"
#include "examples/p1_autotune.h"
#include "examples/p1_stores.h"
#include "examples/p3_recorder.h"
#include "examples/p3_workload.h"
#include "examples/process_usage.h"

#if TUTTI_BENCHMARK_CUDA
#include <cuda_runtime.h>

#include "examples/fusion_kernel_figures.h"
#include "ops/device_ops.h"
#include "tutti/cuda.h"
#endif
#if TUTTI_BENCHMARK_NCCL
#include "examples/nccl_reference.h"
#endif

namespace {

using tutti::examples::max_over_ranks;
using tutti::examples::median_of;
using tutti::examples::ms_since;
using tutti::examples::per_op;
using tutti::examples::process_usage;
using tutti::examples::ProcessUsage;
using tutti::examples::usage_by_rank;
using Clock = std::chrono::steady_clock;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// All of `tensors` via allreduce_async (Average), then all waited; the best of `repeats`
// rounds after a warm-up round.
double p1_tutti(const std::vector<tutti::TensorView>& tensors, int repeats) {
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {  // The first round warms the cache and buffers.
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    std::vector<tutti::Handle> handles;
    handles.reserve(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      handles.push_back(tutti::allreduce_async(tensors[i], "grad." + std::to_string(i)));
    }
    for (tutti::Handle& h : handles) h.wait();
    const double ms = max_over_ranks(ms_since(start));
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

double p1_raw(std::vector<float>& flat, std::size_t piece_bytes, int repeats) {
  const std::size_t piece = piece_bytes / sizeof(float);
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    for (std::size_t off = 0; off < flat.size(); off += piece) {
      const int n = static_cast<int>(std::min(piece, flat.size() - off));
      MPI_Allreduce(MPI_IN_PLACE, flat.data() + off, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    const double ms = max_over_ranks(ms_since(start));
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

// A figure of Tutti's against raw MPI's, with what each cost the process per op
// (examples/process_usage.h; on rank 0 only, one value per rank).
struct AgainstRaw {
  double tutti = 0, raw = 0;
  std::string tutti_usage, raw_usage;
  bool wrong = false;  // P3: a step left a wrong sum (P3Workload::wrong()).
};

AgainstRaw p2() {
  constexpr int kIterations = 1000;
  float x = 1.0f;
  std::vector<double> t(kIterations), raw(kIterations);
  for (int i = 0; i < 100; ++i) tutti::allreduce(tutti::TensorView(&x, {1}), "lone");
  ProcessUsage before = process_usage();
  for (int i = 0; i < kIterations; ++i) {
    const Clock::time_point start = Clock::now();
    tutti::allreduce(tutti::TensorView(&x, {1}), "lone");
    t[i] = ms_since(start) * 1000.0;
  }
  const ProcessUsage tutti_usage = per_op(before, process_usage(), kIterations);
  before = process_usage();
  for (int i = 0; i < kIterations; ++i) {
    const Clock::time_point start = Clock::now();
    MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    raw[i] = ms_since(start) * 1000.0;
  }
  const ProcessUsage raw_usage = per_op(before, process_usage(), kIterations);
  AgainstRaw figures;
  figures.tutti = max_over_ranks(median_of(t));
  figures.raw = max_over_ranks(median_of(raw));
  figures.tutti_usage = usage_by_rank(tutti_usage, MPI_COMM_WORLD);
  figures.raw_usage = usage_by_rank(raw_usage, MPI_COMM_WORLD);
  return figures;
}

AgainstRaw p3(int repeats) {
  tutti::examples::P3Workload workload;
  // Per op over the timed steps (a barrier and a max a step are noise beside 10,000 ops).
  const double timed_ops = static_cast<double>(repeats) * tutti::examples::P3Workload::kTensors;
  AgainstRaw figures;
  double best = 1e30;
  ProcessUsage before;
  for (int r = 0; r < repeats + 2; ++r) {  // Two warm-up steps fill the response cache.
    if (r == 2) before = process_usage();
    const double ms = workload.tutti_step_ms();
    if (r > 1) best = std::min(best, ms);
  }
  figures.tutti = best;
  figures.tutti_usage = usage_by_rank(per_op(before, process_usage(), timed_ops), MPI_COMM_WORLD);
  best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    if (r == 1) before = process_usage();
    const double ms = workload.raw_step_ms();
    if (r > 0) best = std::min(best, ms);
  }
  figures.raw = best;
  figures.raw_usage = usage_by_rank(per_op(before, process_usage(), timed_ops), MPI_COMM_WORLD);
  figures.wrong = workload.wrong();
  return figures;
}

double p4() {
  MPI_Barrier(MPI_COMM_WORLD);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // Let the loop go idle.
  const double cpu_start_us = process_usage().cpu_us;
  const Clock::time_point start = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const double cpu_ms = (process_usage().cpu_us - cpu_start_us) / 1000.0;
  const double percent = cpu_ms / ms_since(start) * 100.0;
  return max_over_ranks(percent);
}

struct Options {
  bool cuda = false;       // --device cuda.
  std::string grads_path;  // --grads; empty: the built-in list (examples/grad_list.h).
  int repeats = 5;
  int kernel_repeats = 50;
  bool sweep = false;
  // --transport: TUTTI_HOST_TRANSPORT values to run P1 under, one line each (empty = the
  // environment's setting only).
  std::vector<std::string> transports;
  bool sweep_sizes = false;  // --sweep-sizes
  bool p10 = false;
  std::int64_t p10_mb = 16;  // Largest single tensor of P10.
  bool autotune = false;     // --autotune: see run_autotune().
  bool stores = false;       // --stores: see examples/p1_stores.h.
  bool recorder = false;     // --recorder: see examples/p3_recorder.h.
  // Whether these were given (the combinations parse_options() refuses).
  bool grads_given = false, p10_mb_given = false, kernel_repeats_given = false;
};

// The combination's fault, or empty if it is one the benchmark runs as asked (see the header).
std::string combination_fault(const Options& o) {
  const int modes = int{o.p10} + int{o.autotune} + int{o.stores} + int{o.recorder};
  const bool p1_flags = o.sweep || !o.transports.empty() || o.sweep_sizes;
  if (modes > 1) return "--p10, --autotune, --stores and --recorder exclude one another";
  if (modes == 1 && p1_flags) {
    return "--sweep-fusion, --transport and --sweep-sizes change P1-P4, which --p10, --autotune, "
           "--stores and --recorder replace";
  }
  if ((o.autotune || o.stores || o.recorder || p1_flags) && o.cuda)
    return "--autotune, --stores, --recorder, --sweep-fusion, --transport and --sweep-sizes run "
           "on the CPU only";
  if (o.p10 && o.cuda) return "--p10 runs on the CPU only";
  if (o.p10_mb_given && !o.p10) return "--p10-mb needs --p10";
  if (o.kernel_repeats_given && !o.cuda) return "--kernel-repeats needs --device cuda";
  if (o.recorder && o.grads_given) return "--recorder takes no --grads (P3 has its own tensors)";
  return "";
}

// "mpi,shm" -> {"mpi", "shm"}; false for a value other than auto, mpi, shm.
bool parse_transports(const std::string& list, std::vector<std::string>* out) {
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, comma - start);
    if (item != "auto" && item != "mpi" && item != "shm") return false;
    out->push_back(item);
    start = comma + 1;
  }
  return true;
}

constexpr char kUsage[] =
    "usage: allreduce_benchmark [--device cpu|cuda] [--grads FILE] [--repeats N] "
    "[--kernel-repeats N] [--sweep-fusion] [--transport auto|mpi|shm[,...]] [--sweep-sizes] "
    "[--autotune] [--stores] [--recorder] (the last six cpu only) [--p10 [--p10-mb N]]\n";

// Reads the flags strictly (examples/flag_reader.h: an unknown flag, a missing value or a
// number such as "abc" or "8x" is a fault, where atoi once read them as 0 or 8) and refuses the
// combinations combination_fault() names. nullopt to run; else the exit status, after rank 0
// printed the usage (stdout for --help) or the fault.
std::optional<int> parse_options(int argc, char** argv, Options* options) {
  tutti::examples::FlagReader flags("allreduce_benchmark", argc, argv);
  while (flags.next()) {
    if (flags.is("--device")) {
      options->cuda = flags.choice({"cpu", "cuda"}) == "cuda";
    } else if (flags.is("--grads")) {
      options->grads_path = flags.text();
      options->grads_given = true;
    } else if (flags.is("--repeats")) {
      options->repeats = static_cast<int>(flags.integer(1, 1'000'000));
    } else if (flags.is("--kernel-repeats")) {
      options->kernel_repeats = static_cast<int>(flags.integer(1, 1'000'000));
      options->kernel_repeats_given = true;
    } else if (flags.is("--sweep-fusion")) {
      options->sweep = true;
    } else if (flags.is("--transport")) {
      const std::string list = flags.text();
      if (!parse_transports(list, &options->transports)) {
        flags.fail("bad --transport '" + list + "': want auto, mpi or shm, comma-separated");
      }
    } else if (flags.is("--sweep-sizes")) {
      options->sweep_sizes = true;
    } else if (flags.is("--p10")) {
      options->p10 = true;
    } else if (flags.is("--p10-mb")) {
      options->p10_mb = flags.integer(0, 1 << 20);
      options->p10_mb_given = true;
    } else if (flags.is("--autotune")) {
      options->autotune = true;
    } else if (flags.is("--stores")) {
      options->stores = true;
    } else if (flags.is("--recorder")) {
      options->recorder = true;
    } else {
      flags.unknown();
    }
  }
  flags.fail(combination_fault(*options));
  return flags.exit_status(kUsage, world_rank() == 0);
}

// P1's reference: the best of raw MPI_Allreduce over `flat` (host memory) in 1, 4, 16 and 64
// MB pieces, each printed by rank 0.
double best_raw_pieces(std::vector<float>& flat, int repeats) {
  double best_raw = 1e30;
  for (std::size_t mb : {1, 4, 16, 64}) {
    const double ms = p1_raw(flat, mb << 20, repeats);
    if (world_rank() == 0) std::printf("raw MPI_Allreduce in %2zu MB pieces: %.2f ms\n", mb, ms);
    best_raw = std::min(best_raw, ms);
  }
  return best_raw;
}

// Median time of `rounds` calls of `op` after a few warm-ups, max over ranks. Collective.
template <class Op>
double median_us(int rounds, Op op) {
  std::vector<double> us(static_cast<std::size_t>(rounds));
  for (int i = 0; i < 3; ++i) op();
  for (double& t : us) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    op();
    t = ms_since(start) * 1000.0;
  }
  return max_over_ranks(median_of(us));
}

// --sweep-sizes: one float32 allreduce (Sum) of 4 B to 64 MB through Tutti on each host
// transport, and raw MPI_Allreduce, median of a few rounds each: where shared memory starts to
// pay (Note [Which host transport] in ops/shm/shm_backend.h).
void sweep_sizes(int repeats) {
  const bool root = world_rank() == 0;
  if (root) std::printf("%10s %12s %12s %12s\n", "bytes", "raw_us", "tutti_mpi_us", "tutti_shm_us");
  for (std::size_t bytes = 4; bytes <= (std::size_t{64} << 20); bytes *= 4) {
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    const int rounds = bytes <= (std::size_t{1} << 20) ? 20 * repeats : repeats;
    const double raw = median_us(rounds, [&] {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    });
    double tutti_us[2] = {0, 0};
    for (int t = 0; t < 2; ++t) {
      setenv("TUTTI_HOST_TRANSPORT", t == 0 ? "mpi" : "shm", 1);
      tutti::init();
      const tutti::TensorView view(data.data(), {static_cast<std::int64_t>(data.size())});
      tutti_us[t] =
          median_us(rounds, [&] { tutti::allreduce(view, "sweep", {.op = tutti::ReduceOp::Sum}); });
      tutti::shutdown();
    }
    unsetenv("TUTTI_HOST_TRANSPORT");
    if (root) std::printf("%10zu %12.1f %12.1f %12.1f\n", bytes, raw, tutti_us[0], tutti_us[1]);
  }
}

// P1 to P4 (--device cpu).
int run_host(const Options& options) {
  const bool root = world_rank() == 0;
  const int repeats = options.repeats;
  // P3 reuses 10,000 names per step; "cache warm" needs room for all of them. Unset, the cache
  // (1024 entries) grows to fit them, but over three steps (Note [Cache growth]); set, the two
  // warm-up steps fill it, as in every earlier round of the benchmark log.
  setenv("TUTTI_CACHE_CAPACITY", "16384", 0);
  if (options.recorder) return tutti::examples::run_p3_recorder(repeats, 9);
  const std::vector<std::int64_t> counts = tutti::examples::grads_or_default(options.grads_path);
  std::vector<std::vector<float>> grads;
  std::size_t total = 0;
  for (std::int64_t n : counts) {
    grads.emplace_back(static_cast<std::size_t>(n), 1.0f);
    total += static_cast<std::size_t>(n);
  }
  std::vector<tutti::TensorView> views;
  for (std::vector<float>& grad : grads) {
    views.emplace_back(grad.data(), tutti::Shape{static_cast<std::int64_t>(grad.size())});
  }
  std::vector<float> flat(total, 1.0f);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (root) {
    std::printf("ranks=%d tensors=%zu floats=%zu (%.1f MB) TUTTI_CACHE_CAPACITY=%s\n", size,
                grads.size(), total, total * 4.0 / 1e6, std::getenv("TUTTI_CACHE_CAPACITY"));
  }

  if (options.stores) {
    tutti::examples::run_p1_stores(views, repeats, 20);
    return 0;
  }
  const double best_raw = best_raw_pieces(flat, repeats);
  if (options.autotune) return tutti::examples::run_p1_autotune(views, repeats, best_raw, p1_tutti);
  if (options.sweep) {
    for (std::size_t kb : {256, 1024, 2048, 4096, 8192, 16384, 65536}) {
      setenv("TUTTI_FUSION_THRESHOLD", std::to_string(kb << 10).c_str(), 1);
      tutti::init();
      const double ms = p1_tutti(views, repeats);
      tutti::shutdown();
      if (root) {
        std::printf("tutti P1 with TUTTI_FUSION_THRESHOLD=%zu KB: %.2f ms (%.3fx best raw)\n", kb,
                    ms, ms / best_raw);
      }
    }
    unsetenv("TUTTI_FUSION_THRESHOLD");
  }
  for (const std::string& transport : options.transports) {
    setenv("TUTTI_HOST_TRANSPORT", transport.c_str(), 1);
    tutti::init();
    const double ms = p1_tutti(views, repeats);
    tutti::shutdown();
    if (root) {
      std::printf("P1 transport=%s tutti_ms=%.2f best_raw_ms=%.2f ratio=%.3f\n", transport.c_str(),
                  ms, best_raw, ms / best_raw);
    }
  }
  if (!options.transports.empty()) unsetenv("TUTTI_HOST_TRANSPORT");
  if (options.sweep_sizes) sweep_sizes(repeats);
  tutti::init();
  const double p1 = p1_tutti(views, repeats);
  const AgainstRaw p2_figures = p2();
  const AgainstRaw p3_figures = p3(repeats);
  const double idle = p4();
  tutti::shutdown();
  if (root) {
    std::printf("P2 detail tutti per op: %s\n", p2_figures.tutti_usage.c_str());
    std::printf("P2 detail raw per op: %s\n", p2_figures.raw_usage.c_str());
    std::printf("P3 detail tutti per op: %s\n", p3_figures.tutti_usage.c_str());
    std::printf("P3 detail raw per op: %s\n", p3_figures.raw_usage.c_str());
    std::printf("P1 tutti_ms=%.2f best_raw_ms=%.2f ratio=%.3f\n", p1, best_raw, p1 / best_raw);
    std::printf("P2 tutti_us=%.2f raw_us=%.2f ratio=%.2f\n", p2_figures.tutti, p2_figures.raw,
                p2_figures.tutti / p2_figures.raw);
    std::printf("P3 tutti_ms=%.2f raw_ms=%.2f ratio=%.3f\n", p3_figures.tutti, p3_figures.raw,
                p3_figures.tutti / p3_figures.raw);
    std::printf("P4 idle_cpu_percent=%.3f\n", idle);
  }
  if (p3_figures.wrong) {
    if (root) std::fprintf(stderr, "P3: a step left a sum other than the number of ranks\n");
    return 1;
  }
  return 0;
}

#if TUTTI_BENCHMARK_CUDA
// ---- --device cuda: D1 and D2.

// A failed CUDA call on one rank would leave the others blocked in a collective: abort the job.
void check_cuda(cudaError_t code, const char* what) {
  if (code == cudaSuccess) return;
  std::fprintf(stderr, "rank %d: %s failed: %s\n", world_rank(), what, cudaGetErrorString(code));
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// Destructors have no one to report to, so they drop the CUDA status.
struct CudaFree {
  void operator()(void* memory) const { static_cast<void>(cudaFree(memory)); }
};
struct CudaFreeHost {
  void operator()(void* memory) const { static_cast<void>(cudaFreeHost(memory)); }
};
struct CudaStreamDestroy {
  void operator()(cudaStream_t stream) const { static_cast<void>(cudaStreamDestroy(stream)); }
};
using DeviceMemory = std::unique_ptr<void, CudaFree>;
using PinnedMemory = std::unique_ptr<void, CudaFreeHost>;
using OwnedStream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, CudaStreamDestroy>;

DeviceMemory allocate_device(std::size_t bytes) {
  void* memory = nullptr;
  check_cuda(cudaMalloc(&memory, bytes), "cudaMalloc");
  return DeviceMemory(memory);
}

// Devices this process sees: 0 without a driver or a device.
int visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // Clears the error: "none" is the answer.
    return 0;
  }
  return count;
}

// The most world ranks on one GPU, told apart by UUID as the runtime does when it picks NCCL
// (every rank on its own GPU) or MPI through host staging (ranks sharing one). Collective.
int ranks_per_gpu(int device) {
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  constexpr int kUuidBytes = sizeof(properties.uuid.bytes);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char> all(static_cast<std::size_t>(size) * kUuidBytes);
  MPI_Allgather(properties.uuid.bytes, kUuidBytes, MPI_BYTE, all.data(), kUuidBytes, MPI_BYTE,
                MPI_COMM_WORLD);
  int most = 0;
  for (std::size_t r = 0; r < all.size(); r += kUuidBytes) {
    int same = 0;
    for (std::size_t q = 0; q < all.size(); q += kUuidBytes) {
      same += std::memcmp(&all[r], &all[q], kUuidBytes) == 0 ? 1 : 0;
    }
    most = std::max(most, same);
  }
  return most;
}

// The gradients as float32 tensors of ones on `device`, in one allocation at 256-byte aligned
// offsets (where cudaMalloc would place them one by one).
struct DeviceGrads {
  DeviceMemory memory;
  std::vector<tutti::TensorView> tensors;
};

DeviceGrads device_grads(const std::vector<std::int64_t>& counts, int device) {
  std::vector<std::size_t> offsets;
  std::size_t bytes = 0;
  for (std::int64_t n : counts) {
    offsets.push_back(bytes);
    bytes += (static_cast<std::size_t>(n) * sizeof(float) + 255) / 256 * 256;
  }
  DeviceGrads grads{.memory = allocate_device(bytes), .tensors = {}};
  const std::vector<float> ones(bytes / sizeof(float), 1.0f);
  check_cuda(cudaMemcpy(grads.memory.get(), ones.data(), bytes, cudaMemcpyHostToDevice),
             "cudaMemcpy H2D");
  // No synchronization: Tutti's ops wait on the GPU for the legacy default stream, where
  // cudaMemcpy ran (tutti/cuda.h).
  auto* base = static_cast<std::byte*>(grads.memory.get());
  for (std::size_t i = 0; i < counts.size(); ++i) {
    grads.tensors.emplace_back(base + offsets[i], tutti::DataType::Float32, tutti::Shape{counts[i]},
                               tutti::Device::cuda(device));
  }
  return grads;
}

// The ideal host-staged pipeline for `count` floats on the current device, as one buffer:
// cudaMemcpy D2H into page-locked memory, one MPI_Allreduce there, H2D; the best of `repeats`
// rounds after a warm-up round. Collective.
double staged_ideal(std::size_t count, int repeats) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    std::fprintf(stderr, "%zu floats do not fit one MPI_Allreduce\n", count);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const std::size_t bytes = count * sizeof(float);
  const DeviceMemory device = allocate_device(bytes);
  void* host = nullptr;
  check_cuda(cudaMallocHost(&host, bytes), "cudaMallocHost");
  const PinnedMemory pinned(host);
  cudaStream_t created = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags");
  const OwnedStream stream(created);
  // Zeros stay zeros under Sum, however many rounds run.
  check_cuda(cudaMemset(device.get(), 0, bytes), "cudaMemset");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    check_cuda(cudaMemcpyAsync(host, device.get(), bytes, cudaMemcpyDeviceToHost, stream.get()),
               "cudaMemcpyAsync D2H");
    check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    MPI_Allreduce(MPI_IN_PLACE, host, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    check_cuda(cudaMemcpyAsync(device.get(), host, bytes, cudaMemcpyHostToDevice, stream.get()),
               "cudaMemcpyAsync H2D");
    check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    const double ms = max_over_ranks(ms_since(start));
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

// D2 on rank 0's device while the other ranks wait; run after shutdown(), so that nothing else
// uses the device or Tutti's stream. Collective.
void d2(const std::vector<std::int64_t>& counts, int device, int repeats) {
  if (world_rank() == 0) {
    const std::vector<std::size_t> sizes(counts.begin(), counts.end());
    tutti::examples::FusionKernelFigures figures;
    try {
      figures = tutti::examples::measure_fusion_kernel(sizes, device, repeats);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "D2: %s\n", e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::printf("D2 ");
    tutti::examples::print_fusion_kernel_figures(figures);
    std::fflush(stdout);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// D3's lone-op latency in microseconds, with `app` current on this thread. Collective; before
// shutdown().
double d3_lone_us(int device, cudaStream_t app) {
  tutti::Tensor x(tutti::DataType::Float32, {1}, tutti::Device::cuda(device));
  const tutti::cuda::StreamGuard current(app);
  return median_us(1000, [&] { tutti::allreduce(x, "d3.lone"); });
}

// D3's ordering calls alone, in microseconds per op, on the calling rank; after shutdown(), so
// that nothing else uses Tutti's stream.
double d3_order_us(int device, cudaStream_t app) {
  constexpr int kOps = 10000;
  tutti::ops::DeviceOps& ops = tutti::ops::device_ops();
  const tutti::ops::DeviceStream tutti_stream{tutti::Device::cuda(device), 0};
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kOps; ++i) {
    auto ready = ops.record_ready(app, tutti::Device::cuda(device));
    tutti::Status waited =
        ready.ok() ? ops.wait_event(*ready.value(), tutti_stream) : ready.status();
    if (!waited.ok()) {
      std::fprintf(stderr, "D3: %s\n", std::string(waited.message()).c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  const double us = ms_since(start) * 1000.0 / kOps;
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return us;
}

// D1, D2 and D3 (--device cuda); 77 when a rank sees no device.
int run_device(const Options& options) {
  const bool root = world_rank() == 0;
  const int devices = visible_devices();
  int fewest = devices;
  MPI_Allreduce(MPI_IN_PLACE, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest == 0) {
    if (root) std::printf("no CUDA device: skipping\n");
    return 77;
  }
  const std::vector<std::int64_t> counts = tutti::examples::grads_or_default(options.grads_path);
  std::size_t total = 0;
  for (std::int64_t n : counts) total += static_cast<std::size_t>(n);
  tutti::init();
  const int device = tutti::local_rank() % devices;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  const int sharing = ranks_per_gpu(device);
  const bool host_staged = sharing > 1 || !tutti::nccl_built();
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  if (root) {
    std::printf("gpu: %s (rank 0's cuda:%d)\n", properties.name, device);
    std::printf("flags: --device cuda --grads %s --repeats %d --kernel-repeats %d\n",
                options.grads_path.empty() ? "(built-in)" : options.grads_path.c_str(),
                options.repeats, options.kernel_repeats);
    std::printf(
        "ranks=%d tensors=%zu floats=%zu (%.1f MB) rank0=cuda:%d of %d ranks_per_gpu=%d "
        "nccl_built=%d transport=%s\n",
        tutti::size(), counts.size(), total, total * 4.0 / 1e6, device, devices, sharing,
        tutti::nccl_built() ? 1 : 0, host_staged ? "MPI via page-locked host staging" : "NCCL");
  }
  std::vector<float> flat(total, 1.0f);
  const double best_raw = best_raw_pieces(flat, options.repeats);
  double d1 = 0;
  {
    const DeviceGrads grads = device_grads(counts, device);
    d1 = p1_tutti(grads.tensors, options.repeats);
  }
  const double staged = host_staged ? staged_ideal(total, options.repeats) : 0;
  cudaStream_t created = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags");
  const OwnedStream app(created);
  const double lone_us = d3_lone_us(device, app.get());
  const int ranks = tutti::size();
  tutti::shutdown();
  const double order_us = root ? d3_order_us(device, app.get()) : 0;
  if (root) {
    // At one rank MPI moves nothing: a ratio to ~0 ms says nothing (the NCCL line below does).
    if (ranks > 1) {
      std::printf("D1 tutti_ms=%.2f best_raw_host_ms=%.2f ratio=%.3f\n", d1, best_raw,
                  d1 / best_raw);
    } else {
      std::printf("D1 tutti_ms=%.2f best_raw_host_ms=%.2f ratio=n/a (one rank)\n", d1, best_raw);
    }
    if (host_staged) {
      std::printf("D1 staged_ideal_ms=%.2f (D2H + one MPI_Allreduce + H2D) ratio=%.3f\n", staged,
                  d1 / staged);
    }
    std::fflush(stdout);
  }
#if TUTTI_BENCHMARK_NCCL
  if (!host_staged) {
    // Every rank has a GPU of its own (one rank included): the hand-written fused NCCL step.
    const tutti::examples::FusedNcclFigures fused =
        tutti::examples::fused_nccl_reference(counts, device, options.repeats);
    if (root) {
      std::printf(
          "D1 nccl_fused_ms=%.2f (pack %.2f + ncclAllReduce %.2f + unpack %.2f ms, CUDA events) "
          "ratio=%.3f (target <= 1.1)\n",
          fused.total_ms, fused.pack_ms, fused.allreduce_ms, fused.unpack_ms, d1 / fused.total_ms);
      std::fflush(stdout);
    }
  }
#endif
  d2(counts, device, options.kernel_repeats);
  if (root) {
    std::printf(
        "D3 lone_allreduce_us=%.1f order_us=%.2f (record_ready + wait_event per op, host)\n",
        lone_us, order_us);
  }
  return 0;
}
#endif  // TUTTI_BENCHMARK_CUDA

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  {  // First line: the machine (CPU model, MPI library, binding), as every benchmark prints it.
    const std::string machine = tutti::examples::machine_line_mpi();
    if (world_rank() == 0) std::printf("%s\n", machine.c_str());
  }
  Options options;
  int code = 2;
  if (const std::optional<int> status = parse_options(argc, argv, &options)) {
    code = *status;
  } else if (options.p10) {
    std::vector<std::int64_t> sizes;
    for (std::int64_t bytes : {4096LL, 65536LL, 1LL << 20, 16LL << 20})
      if (bytes <= options.p10_mb << 20) sizes.push_back(bytes);
    code = tutti::examples::run_p10(tutti::examples::grads_or_default(options.grads_path), sizes,
                                    options.repeats, 20);
  } else if (!options.cuda) {
    code = run_host(options);
  } else {
#if TUTTI_BENCHMARK_CUDA
    try {
      code = run_device(options);
    } catch (const std::exception& e) {  // A tutti::Error on one rank: end the job, not hang.
      std::fprintf(stderr, "rank %d: %s\n", world_rank(), e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
#else
    if (world_rank() == 0) {
      std::fprintf(stderr, "this build has no CUDA; rebuild with -Dcuda=enabled\n");
    }
    code = 2;
#endif
  }
  MPI_Finalize();
  return code;
}

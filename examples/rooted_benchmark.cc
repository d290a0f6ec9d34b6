// SPDX-License-Identifier: Apache-2.0
// P11 (DESIGN.md section 6): reduce, gather and scatter of ResNet-50's gradient set to or from
// root 0, in the same run as
//   - the way Tutti ran them before issue 24, composed of public ops: an allreduce whose
//     non-root output is scratch memory, an allgather, an alltoall in which only the root sends;
//   - raw MPI_Reduce / MPI_Gatherv / MPI_Scatterv over the same bytes, the best of 1, 4, 16 and
//     64 MB pieces (as P1's reference).
// reduce: every rank's 161 float32 gradients, Sum, to the root. gather: each rank holds a shard
// of every gradient (rank r the r-th of the size nearly equal parts, as reducescatter splits
// rows) and the root gathers them into whole gradients. scatter: the reverse, the root's
// gradients to their shards. Every figure is the slowest rank's time for the whole set, the
// best of --repeats rounds after a warm-up round, and the bytes the op delivers as results:
// per receiving rank, what arrives from the others (a reduction's result counts whole).
// Rank 0 prints a header (CPU, MPI library, ranks, host transport), then one line per op:
//   P11 <op> ranks=N tutti_ms=... old_ms=... raw_ms=... ratio=... tutti_MB=... old_MB=...
// where ratio = tutti_ms / raw_ms (target <= 1.2).
// Usage: mpirun -n N rooted_benchmark [--grads FILE] [--repeats N] [--ops LIST]
//   --grads FILE  element counts, one per line (default: the built-in reference list)
//   --repeats N   timed rounds after one warm-up (default 5)
//   --ops LIST    comma-separated subset of reduce,gather,scatter (default all three)
// Exits 2 for a bad flag.
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

#include "examples/figures.h"
#include "examples/grad_list.h"
#include "examples/machine_line.h"

namespace {

using Clock = std::chrono::steady_clock;
using tutti::examples::max_over_ranks;
using tutti::examples::ms_since;

constexpr int kRoot = 0;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

[[noreturn]] void usage(const std::string& why) {
  if (world_rank() == 0) {
    std::fprintf(stderr,
                 "rooted_benchmark: %s\nusage: mpirun -n N rooted_benchmark [--grads FILE] "
                 "[--repeats N] [--ops reduce,gather,scatter]\n",
                 why.c_str());
  }
  MPI_Finalize();
  std::exit(2);
}

// Best of `repeats` rounds of `round` after a warm-up round, each started together.
double best_of(int repeats, const std::function<void()>& round) {
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    round();
    const double ms = max_over_ranks(ms_since(start));
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

// Rank r's part of n rows: the first n % size ranks get one more (reducescatter's split).
std::int64_t share(std::int64_t n, int size, int r) { return n / size + (r < n % size ? 1 : 0); }

void wait_and_clear(std::vector<tutti::Handle>& handles) {
  tutti::wait_all(handles);
  handles.clear();
}

// The raw reference: `call(offset, count)` over `total` elements in pieces of `piece_mb`.
double raw_pieces(std::int64_t total, int repeats,
                  const std::function<void(std::int64_t, int)>& call, double* best_mb) {
  double best = 1e30;
  for (const int mb : {1, 4, 16, 64}) {
    const std::int64_t piece = static_cast<std::int64_t>(mb) * (1 << 20) / 4;
    const double ms = best_of(repeats, [&] {
      for (std::int64_t at = 0; at < total; at += piece) {
        call(at, static_cast<int>(std::min(piece, total - at)));
      }
    });
    if (ms < best) {
      best = ms;
      *best_mb = mb;
    }
  }
  return best;
}

struct Figures {
  double tutti_ms = 0, old_ms = 0, raw_ms = 0, raw_mb = 0;
  double tutti_bytes = 0, old_bytes = 0;
};

Figures run_reduce(const std::vector<std::int64_t>& counts, std::int64_t total, int repeats) {
  const int me = world_rank();
  const int size = world_size();
  std::vector<float> grads(static_cast<std::size_t>(total), 1e-3f * static_cast<float>(me + 1));
  std::vector<float> scratch(grads.size());  // The old way's non-root output.
  std::vector<tutti::Handle> handles;
  Figures f;
  f.tutti_ms = best_of(repeats, [&] {
    std::int64_t at = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      handles.push_back(tutti::reduce_async(tutti::TensorView(grads.data() + at, {counts[i]}),
                                            kRoot, "p11.reduce." + std::to_string(i),
                                            {.op = tutti::ReduceOp::Sum}));
      at += counts[i];
    }
    wait_and_clear(handles);
  });
  f.old_ms = best_of(repeats, [&] {
    std::int64_t at = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const tutti::TensorView input(grads.data() + at, {counts[i]});
      const tutti::TensorView output(me == kRoot ? grads.data() + at : scratch.data() + at,
                                     {counts[i]});
      handles.push_back(tutti::allreduce_async(input, output, "p11.old.reduce." + std::to_string(i),
                                               {.op = tutti::ReduceOp::Sum}));
      at += counts[i];
    }
    wait_and_clear(handles);
  });
  f.raw_ms = raw_pieces(
      total, repeats,
      [&](std::int64_t at, int n) {
        const void* send = me == kRoot ? MPI_IN_PLACE : grads.data() + at;
        MPI_Reduce(send, me == kRoot ? grads.data() + at : nullptr, n, MPI_FLOAT, MPI_SUM, kRoot,
                   MPI_COMM_WORLD);
      },
      &f.raw_mb);
  const double bytes = static_cast<double>(total) * 4;
  f.tutti_bytes = bytes;       // The root's result.
  f.old_bytes = bytes * size;  // Every rank's.
  return f;
}

// Rank `me`'s shard of every gradient, back to back, and where each starts.
struct Shards {
  std::vector<std::int64_t> rows;  // Per gradient: this rank's rows.
  std::int64_t total = 0;
};

Shards shards_of(const std::vector<std::int64_t>& counts, int size, int r) {
  Shards s;
  for (std::int64_t n : counts) {
    s.rows.push_back(share(n, size, r));
    s.total += s.rows.back();
  }
  return s;
}

Figures run_gather(const std::vector<std::int64_t>& counts, std::int64_t total, int repeats) {
  const int me = world_rank();
  const int size = world_size();
  const Shards mine = shards_of(counts, size, me);
  std::vector<float> input(static_cast<std::size_t>(mine.total), static_cast<float>(me));
  std::vector<tutti::Handle> handles;
  auto submit = [&](bool old) {
    std::int64_t at = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const tutti::TensorView view(input.data() + at, {mine.rows[i]});
      const std::string name =
          std::string(old ? "p11.old.gather." : "p11.gather.") + std::to_string(i);
      handles.push_back(old ? tutti::allgather_async(view, name)
                            : tutti::gather_async(view, kRoot, name));
      at += mine.rows[i];
    }
    wait_and_clear(handles);
  };
  Figures f;
  f.tutti_ms = best_of(repeats, [&] { submit(false); });
  f.old_ms = best_of(repeats, [&] { submit(true); });
  // Raw: the same bytes, one gatherv per piece of every rank's shards; the root's buffer holds
  // them rank block after rank block.
  std::vector<float> output(me == kRoot ? static_cast<std::size_t>(total) : 0);
  std::vector<std::int64_t> shard_totals(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r)
    shard_totals[static_cast<std::size_t>(r)] = shards_of(counts, size, r).total;
  f.raw_ms = raw_pieces(
      *std::max_element(shard_totals.begin(), shard_totals.end()), repeats,
      [&](std::int64_t at, int n) {
        std::vector<int> recv(static_cast<std::size_t>(size)), displ(recv.size());
        std::int64_t block = 0;
        for (int r = 0; r < size; ++r) {
          const std::int64_t left = shard_totals[static_cast<std::size_t>(r)] - at;
          recv[static_cast<std::size_t>(r)] =
              static_cast<int>(std::clamp<std::int64_t>(left, 0, n));
          displ[static_cast<std::size_t>(r)] =
              static_cast<int>(std::min<std::int64_t>(block + at, total));
          block += shard_totals[static_cast<std::size_t>(r)];
        }
        MPI_Gatherv(input.data() + std::min(at, mine.total), recv[static_cast<std::size_t>(me)],
                    MPI_FLOAT, output.data(), recv.data(), displ.data(), MPI_FLOAT, kRoot,
                    MPI_COMM_WORLD);
      },
      &f.raw_mb);
  f.tutti_bytes = static_cast<double>(total - shard_totals[kRoot]) * 4;
  f.old_bytes = 0;
  for (int r = 0; r < size; ++r)
    f.old_bytes += static_cast<double>(total - shard_totals[static_cast<std::size_t>(r)]) * 4;
  return f;
}

Figures run_scatter(const std::vector<std::int64_t>& counts, std::int64_t total, int repeats) {
  const int me = world_rank();
  const int size = world_size();
  const Shards mine = shards_of(counts, size, me);
  std::vector<float> grads(me == kRoot ? static_cast<std::size_t>(total) : 0, 1.0f);
  std::vector<tutti::Handle> handles;
  std::vector<std::vector<std::int64_t>> splits(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i)
    for (int r = 0; r < size; ++r) splits[i].push_back(share(counts[i], size, r));
  auto submit = [&](bool old) {
    std::int64_t at = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const std::string name =
          std::string(old ? "p11.old.scatter." : "p11.scatter.") + std::to_string(i);
      const tutti::TensorView view =
          me == kRoot ? tutti::TensorView(grads.data() + at, {counts[i]})
                      : tutti::TensorView(nullptr, tutti::DataType::Float32, {0});
      if (old) {  // Only the root sends: the others' splits are zeros.
        handles.push_back(tutti::alltoall_async(
            view, me == kRoot ? splits[i] : std::vector<std::int64_t>(splits[i].size(), 0), name));
      } else {
        handles.push_back(tutti::scatter_async(view, kRoot, splits[i], name));
      }
      at += counts[i];
    }
    wait_and_clear(handles);
  };
  Figures f;
  f.tutti_ms = best_of(repeats, [&] { submit(false); });
  f.old_ms = best_of(repeats, [&] { submit(true); });
  // Raw: the root's shards rank by rank, one scatterv per piece of each rank's shards.
  std::vector<std::int64_t> shard_totals(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r)
    shard_totals[static_cast<std::size_t>(r)] = shards_of(counts, size, r).total;
  std::vector<float> output(static_cast<std::size_t>(mine.total));
  f.raw_ms = raw_pieces(
      *std::max_element(shard_totals.begin(), shard_totals.end()), repeats,
      [&](std::int64_t at, int n) {
        std::vector<int> send(static_cast<std::size_t>(size)), displ(send.size());
        std::int64_t offset = 0;
        for (int r = 0; r < size; ++r) {
          const std::int64_t left = shard_totals[static_cast<std::size_t>(r)] - at;
          send[static_cast<std::size_t>(r)] =
              static_cast<int>(std::clamp<std::int64_t>(left, 0, n));
          // The root's grads as rank blocks: rank r's shards start after the lower ranks'.
          displ[static_cast<std::size_t>(r)] =
              static_cast<int>(std::min<std::int64_t>(offset + at, total));
          offset += shard_totals[static_cast<std::size_t>(r)];
        }
        MPI_Scatterv(grads.data(), send.data(), displ.data(), MPI_FLOAT,
                     output.data() + std::min(at, mine.total), send[static_cast<std::size_t>(me)],
                     MPI_FLOAT, kRoot, MPI_COMM_WORLD);
      },
      &f.raw_mb);
  f.tutti_bytes = static_cast<double>(total - shard_totals[kRoot]) * 4;
  f.old_bytes = f.tutti_bytes;  // The alltoall delivered the same parts.
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  std::string grads_path;  // Empty: the built-in list.
  int repeats = 5;
  std::string ops = "reduce,gather,scatter";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage("missing value after " + arg);
    const std::string value = argv[++i];
    if (arg == "--grads") {
      grads_path = value;
    } else if (arg == "--repeats") {
      repeats = std::atoi(value.c_str());
      if (repeats < 1) usage("--repeats needs a positive number, not " + value);
    } else if (arg == "--ops") {
      ops = value;
      for (std::size_t at = 0; at <= ops.size();) {
        const std::size_t comma = std::min(ops.find(',', at), ops.size());
        const std::string op = ops.substr(at, comma - at);
        if (op != "reduce" && op != "gather" && op != "scatter") usage("unknown op '" + op + "'");
        at = comma + 1;
      }
    } else {
      usage("unknown flag " + arg);
    }
  }
  const std::vector<std::int64_t> counts = tutti::examples::grads_or_default(grads_path);
  std::int64_t total = 0;
  for (std::int64_t n : counts) total += n;
  tutti::init();
  const bool root = world_rank() == 0;
  const std::string machine = tutti::examples::machine_line();  // Collective.
  if (root) {
    const char* transport = std::getenv("TUTTI_HOST_TRANSPORT");
    std::printf("%s\nhost_transport=%s\n", machine.c_str(), transport ? transport : "auto");
    std::printf("tensors=%zu floats=%lld (%.1f MB) root=%d repeats=%d\n", counts.size(),
                static_cast<long long>(total), static_cast<double>(total) * 4 / 1e6, kRoot,
                repeats);
  }
  auto report = [&](const char* op, const Figures& f) {
    if (!root) return;
    std::printf(
        "P11 %s ranks=%d tutti_ms=%.2f old_ms=%.2f raw_ms=%.2f ratio=%.3f raw_piece_MB=%.0f "
        "tutti_MB=%.1f old_MB=%.1f\n",
        op, world_size(), f.tutti_ms, f.old_ms, f.raw_ms, f.tutti_ms / f.raw_ms, f.raw_mb,
        f.tutti_bytes / 1e6, f.old_bytes / 1e6);
    std::fflush(stdout);
  };
  if (ops.find("reduce") != std::string::npos) report("reduce", run_reduce(counts, total, repeats));
  if (ops.find("gather") != std::string::npos) report("gather", run_gather(counts, total, repeats));
  if (ops.find("scatter") != std::string::npos) {
    report("scatter", run_scatter(counts, total, repeats));
  }
  tutti::shutdown();
  MPI_Finalize();
  return 0;
}

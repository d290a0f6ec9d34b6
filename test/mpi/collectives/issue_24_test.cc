// SPDX-License-Identifier: Apache-2.0
// Issue 24: rooted collectives are ordinary negotiated ops with rooted algorithms.
//  - reduce_async, gather_async and scatter_async return before the other members call;
//  - the root's own bad scatter arguments are InvalidArgument from its call, with nothing sent
//    (the others never call, and nothing hangs);
//  - a disputed root is Mismatch and a joined root InvalidArgument, both from wait();
//  - on MPI only the root receives a reduction or gathered rows (counted through the PMPI
//    profiling interface below), and a scatter's members receive only their part;
// on the global set and on a process set whose set ranks differ from the global ones.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/collectives/collective_util.h"

// Bytes this rank received as the payload of Tutti's large collectives (on its own
// communicators, never MPI_COMM_WORLD, and only calls of at least kLargeBytes, so that
// negotiation's small messages do not count). Written by Tutti's communication thread, read by
// the test after wait().
namespace {

constexpr std::int64_t kLargeBytes = 64 * 1024;
std::atomic<std::int64_t> g_received{0};

int rank_in(MPI_Comm comm) {
  int rank = 0;
  PMPI_Comm_rank(comm, &rank);
  return rank;
}

std::int64_t bytes_of(std::int64_t count, MPI_Datatype type) {
  int size = 0;
  PMPI_Type_size(type, &size);
  return count * size;
}

std::int64_t sum_but(const int* counts, int skip, MPI_Comm comm) {
  int size = 0;
  PMPI_Comm_size(comm, &size);
  std::int64_t sum = 0;
  for (int r = 0; r < size; ++r)
    if (r != skip) sum += counts[r];
  return sum;
}

void note(std::int64_t total_bytes, std::int64_t received_bytes, MPI_Comm comm) {
  if (comm != MPI_COMM_WORLD && total_bytes >= kLargeBytes) g_received += received_bytes;
}

}  // namespace

extern "C" {

int MPI_Allreduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op,
                  MPI_Comm comm) {
  const std::int64_t bytes = bytes_of(count, type);
  note(bytes, bytes, comm);
  return PMPI_Allreduce(send, receive, count, type, op, comm);
}

int MPI_Reduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, int root,
               MPI_Comm comm) {
  const std::int64_t bytes = bytes_of(count, type);
  note(bytes, rank_in(comm) == root ? bytes : 0, comm);
  return PMPI_Reduce(send, receive, count, type, op, root, comm);
}

int MPI_Bcast(void* data, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  const std::int64_t bytes = bytes_of(count, type);
  note(bytes, rank_in(comm) == root ? 0 : bytes, comm);
  return PMPI_Bcast(data, count, type, root, comm);
}

int MPI_Allgatherv(const void* send, int send_count, MPI_Datatype send_type, void* receive,
                   const int* counts, const int* displacements, MPI_Datatype type, MPI_Comm comm) {
  const int me = rank_in(comm);
  note(bytes_of(sum_but(counts, -1, comm), type), bytes_of(sum_but(counts, me, comm), type), comm);
  return PMPI_Allgatherv(send, send_count, send_type, receive, counts, displacements, type, comm);
}

int MPI_Gatherv(const void* send, int send_count, MPI_Datatype send_type, void* receive,
                const int* counts, const int* displacements, MPI_Datatype type, int root,
                MPI_Comm comm) {
  // Receive counts are significant at the root only; the others count what they send.
  const int me = rank_in(comm);
  if (me == root) {
    note(bytes_of(sum_but(counts, -1, comm), type), bytes_of(sum_but(counts, me, comm), type),
         comm);
  }
  return PMPI_Gatherv(send, send_count, send_type, receive, counts, displacements, type, root,
                      comm);
}

int MPI_Alltoallv(const void* send, const int* send_counts, const int* send_displacements,
                  MPI_Datatype send_type, void* receive, const int* counts,
                  const int* displacements, MPI_Datatype type, MPI_Comm comm) {
  const int me = rank_in(comm);
  const std::int64_t received = bytes_of(sum_but(counts, me, comm), type);
  note(std::max(received, bytes_of(sum_but(send_counts, me, comm), send_type)), received, comm);
  return PMPI_Alltoallv(send, send_counts, send_displacements, send_type, receive, counts,
                        displacements, type, comm);
}

int MPI_Scatterv(const void* send, const int* send_counts, const int* displacements,
                 MPI_Datatype send_type, void* receive, int count, MPI_Datatype type, int root,
                 MPI_Comm comm) {
  const std::int64_t bytes = bytes_of(count, type);
  if (rank_in(comm) != root) note(bytes, bytes, comm);
  return PMPI_Scatterv(send, send_counts, displacements, send_type, receive, count, type, root,
                       comm);
}

}  // extern "C"

namespace tutti::test {
namespace {

constexpr int kTag = 2424;  // The tests' own messages on MPI_COMM_WORLD.

// The sets the tests run on: the global set, and from 3 ranks one whose set ranks differ from
// the global ones ({1, n - 1}: set rank 0 is global rank 1). Created on every rank.
struct Sets {
  std::vector<ProcessSet> sets{ProcessSet::global()};
  Sets() {
    if (world_size() >= 3) sets.push_back(add_process_set({1, world_size() - 1}));
  }
  ~Sets() {
    try {
      barrier();
      for (std::size_t i = 1; i < sets.size(); ++i) remove_process_set(sets[i]);
    } catch (const Error&) {
      // The runtime stopped (a failed test): every rank's calls fail alike, nothing to free.
    }
  }
};

// `first` calls `call` and tells the set's other members through plain MPI once its call has
// returned; they wait for that (at most 10 s) before calling. An `_async` call that waited for
// the others misses the deadline (and returns once they call after it, so nothing hangs).
// Returns whether every member of `set` saw it in time, and leaves the handle in `handle`.
bool returned_alone(const ProcessSet& set, int first, const std::function<Handle()>& call,
                    Handle* handle) {
  const int me = world_rank();
  if (me == first) {
    *handle = call();
    int token = 1;
    for (int r : set.ranks())
      if (r != first) MPI_Send(&token, 1, MPI_INT, r, kTag, MPI_COMM_WORLD);
    return true;
  }
  int token = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Irecv(&token, 1, MPI_INT, first, kTag, MPI_COMM_WORLD, &request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *handle = call();
  if (!done) MPI_Wait(&request, MPI_STATUS_IGNORE);
  return done != 0;
}

// The root's input of a scatter: rows of 2 float32 values 10 k + j.
std::vector<float> scatter_rows(std::int64_t rows) {
  std::vector<float> v;
  for (std::int64_t k = 0; k < rows; ++k)
    for (int j = 0; j < 2; ++j) v.push_back(10.0f * static_cast<float>(k) + static_cast<float>(j));
  return v;
}

TEST_CASE("issue 24: rooted _async calls return before the other members call", "[rooted]") {
  Session session;
  Sets sets;
  Failures failures;
  for (const ProcessSet& set : sets.sets) {
    if (!set.included()) continue;
    const std::vector<int>& members = set.ranks();
    const int n = set.size();
    const int me = world_rank();
    // The root calls first, then (with more than one member) a non-root does.
    std::vector<std::pair<int, int>> cases = {{members.back(), members.back()}};
    if (n > 1) cases.emplace_back(members.back(), members.front());
    for (const std::pair<int, int>& root_first : cases) {
      // Named copies: lambdas may not capture structured bindings (clang before C++20's fix).
      const int root = root_first.first;
      const int first = root_first.second;
      const std::string tag = "set " + std::to_string(set.id()) + " root " + std::to_string(root) +
                              " first " + std::to_string(first);
      std::vector<float> input = scatter_rows(2 * n);
      const TensorView view = me == root ? TensorView(input.data(), {2 * n, 2})
                                         : TensorView(nullptr, DataType::Float32, {0});
      Handle h;
      failures.check(
          returned_alone(
              set, first, [&] { return scatter_async(view, root, {}, "alone.s", set); }, &h),
          tag + ": scatter_async waited for the others");
      const Tensor part = h.output();
      const std::vector<float> rows = scatter_rows(2 * n);
      const std::int64_t k = 2 * set.rank();
      failures.check(part.shape() == Shape{2, 2} && part.span<float>()[0] == rows[2 * k] &&
                         part.span<float>()[3] == rows[2 * k + 3],
                     tag + ": scatter result");
      std::vector<double> values(3, me + 1.0);
      failures.check(returned_alone(
                         set, first,
                         [&] {
                           return reduce_async(TensorView(values.data(), {3}), root, "alone.r",
                                               {.op = ReduceOp::Sum, .process_set = set});
                         },
                         &h),
                     tag + ": reduce_async waited for the others");
      h.wait();
      double sum = 0;
      for (int r : members) sum += r + 1.0;
      failures.check(values[2] == (me == root ? sum : me + 1.0), tag + ": reduce result");
      failures.check(
          returned_alone(
              set, first,
              [&] { return gather_async(TensorView(values.data(), {1}), root, "alone.g", set); },
              &h),
          tag + ": gather_async waited for the others");
      failures.check(h.output().num_elements() == (me == root ? n : 0), tag + ": gather result");
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("issue 24: the root's own bad scatter arguments fail its call; nothing is sent",
          "[rooted]") {
  Session session;
  Sets sets;
  Failures failures;
  for (const ProcessSet& set : sets.sets) {
    const int n = set.size();
    const int root = set.ranks().back();
    std::vector<float> input = scatter_rows(n + 1);
    const TensorView view(input.data(), {n + 1, 2});
    // n + 1 splits, a negative split, splits adding up past dim 0, and (from 2 members) no
    // splits with dim 0 (n + 1) not divisible by the set size.
    std::vector<std::vector<std::int64_t>> bad = {std::vector<std::int64_t>(n + 1, 0),
                                                  std::vector<std::int64_t>(n, 0),
                                                  std::vector<std::int64_t>(n, 1)};
    bad[1][0] = -1;
    bad[2][0] = 3;  // n + 2 rows in all, one more than dim 0.
    if (n > 1) {
      bad.emplace_back();
      // A sum past int64 wrapped negative and passed; the op then stranded its handle.
      bad.emplace_back(n, std::numeric_limits<std::int64_t>::max());
    }
    for (const std::vector<std::int64_t>& splits : bad) {
      const std::string tag = "set " + std::to_string(set.id()) + " splits " +
                              std::to_string(splits.size()) + " first " +
                              (splits.empty() ? "-" : std::to_string(splits.front()));
      if (world_rank() == root) {
        std::string message;
        failures.check(error_of([&] { scatter_async(view, root, splits, "bad.splits", set); },
                                &message) == ErrorCode::InvalidArgument,
                       tag + ": " + message);
        failures.check(message.find("SCATTER 'bad.splits'") != std::string::npos,
                       tag + ": message " + message);
      }
      // The others never call: the root's call must not have started anything they would
      // have to finish.
      MPI_Barrier(MPI_COMM_WORLD);
    }
    if (!set.included()) continue;
    // The name was never taken: a good scatter under it works.
    const Tensor part = scatter(world_rank() == root ? TensorView(input.data(), {n, 2})
                                                     : TensorView(nullptr, DataType::Float32, {0}),
                                root, {}, "bad.splits", set);
    failures.check(part.shape() == Shape{1, 2} &&
                       part.span<float>()[0] == 10.0f * static_cast<float>(set.rank()),
                   "set " + std::to_string(set.id()) + ": the scatter after the bad ones");
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("issue 24: a disputed root is Mismatch and a joined root InvalidArgument, from wait()",
          "[rooted]") {
  if (world_size() < 2) return;
  Session session;
  Sets sets;
  Failures failures;
  const int me = world_rank();
  for (const ProcessSet& set : sets.sets) {
    if (!set.included()) continue;
    const std::vector<int>& members = set.ranks();
    const std::string at = "set " + std::to_string(set.id());
    // The first member names itself as the root, the others the last member.
    const int root = me == members.front() ? members.front() : members.back();
    std::vector<float> v(static_cast<std::size_t>(2 * set.size()), 1.0f);
    const TensorView view = me == root ? TensorView(v.data(), {set.size(), 2})
                                       : TensorView(nullptr, DataType::Float32, {0});
    const std::vector<std::pair<std::string, std::function<Handle()>>> ops = {
        {"scatter", [&] { return scatter_async(view, root, {}, "disputed.s", set); }},
        {"reduce",
         [&] {
           return reduce_async(TensorView(v.data(), {2}), root, "disputed.r", {.process_set = set});
         }},
        {"gather",
         [&] { return gather_async(TensorView(v.data(), {2}), root, "disputed.g", set); }},
    };
    for (const auto& op_call : ops) {
      const std::string& op = op_call.first;
      const std::function<Handle()>& call = op_call.second;
      Handle h;
      std::string message;
      const std::optional<ErrorCode> from_call = error_of([&] { h = call(); }, &message);
      failures.check(!from_call.has_value(), at + ": " + op + " call threw " + message);
      if (from_call) continue;
      failures.check(error_of([&] { h.wait(); }, &message) == ErrorCode::Mismatch,
                     at + ": " + op + " wait: " + message);
      failures.check(message.find("root ranks") != std::string::npos, at + ": " + message);
    }
    // The last member joins; the others name it as the root.
    const int joined = members.back();
    if (me == joined) {
      static_cast<void>(join(set));
      continue;
    }
    const std::vector<std::pair<std::string, std::function<Handle()>>> joined_ops = {
        {"scatter",
         [&] {
           return scatter_async(TensorView(nullptr, DataType::Float32, {0}), joined, {}, "joined.s",
                                set);
         }},
        {"reduce",
         [&] {
           return reduce_async(TensorView(v.data(), {2}), joined, "joined.r", {.process_set = set});
         }},
        {"gather",
         [&] { return gather_async(TensorView(v.data(), {2}), joined, "joined.g", set); }},
    };
    for (const auto& op_call : joined_ops) {
      const std::string& op = op_call.first;
      const std::function<Handle()>& call = op_call.second;
      Handle h;
      std::string message;
      const std::optional<ErrorCode> from_call = error_of([&] { h = call(); }, &message);
      failures.check(!from_call.has_value(),
                     at + ": joined root, " + op + " call threw " + message);
      if (from_call) continue;
      failures.check(error_of([&] { h.wait(); }, &message) == ErrorCode::InvalidArgument,
                     at + ": joined root, " + op + " wait: " + message);
    }
    static_cast<void>(join(set));
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

// TUTTI_HOST_TRANSPORT=mpi for one session, so that the data moves through the counted MPI
// calls (shared memory would bypass them).
struct MpiTransport {
  MpiTransport() { setenv("TUTTI_HOST_TRANSPORT", "mpi", 1); }
  ~MpiTransport() { unsetenv("TUTTI_HOST_TRANSPORT"); }
};

TEST_CASE("issue 24: on MPI only the root receives a reduction or gathered rows", "[rooted]") {
  MpiTransport transport;
  Session session;
  Sets sets;
  Failures failures;
  const int me = world_rank();
  constexpr std::int64_t kCount = 100003;  // Float32 elements: 400 KB, above kLargeBytes.
  for (const ProcessSet& set : sets.sets) {
    if (!set.included()) continue;
    const std::vector<int>& members = set.ranks();
    const int n = set.size();
    for (int root : {members.front(), members.back()}) {
      const std::string at = "set " + std::to_string(set.id()) + " root " + std::to_string(root);
      // reduce, alone (in place) and three fused with the same root (packed), Sum.
      std::vector<std::vector<float>> tensors(4, std::vector<float>(kCount, me + 1.0f));
      g_received = 0;
      reduce(TensorView(tensors[0].data(), {kCount}), root, "bytes.r",
             {.op = ReduceOp::Sum, .process_set = set});
      std::vector<Handle> handles;
      for (int t = 1; t < 4; ++t) {
        handles.push_back(reduce_async(TensorView(tensors[t].data(), {kCount / 4}), root,
                                       "bytes.r" + std::to_string(t),
                                       {.op = ReduceOp::Sum, .process_set = set}));
      }
      wait_all(handles);
      const std::int64_t reduced = g_received;
      const std::int64_t reduced_bytes = 4 * (kCount + 3 * (kCount / 4));
      failures.check(reduced == (me == root ? reduced_bytes : 0),
                     at + ": reduce received " + std::to_string(reduced) + " bytes");
      float sum = 0;
      for (int r : members) sum += r + 1.0f;
      failures.check(tensors[0][kCount - 1] == (me == root ? sum : me + 1.0f) &&
                         tensors[3][0] == (me == root ? sum : me + 1.0f),
                     at + ": reduce result");
      // gather: set rank s gives (s + 1) * 5000 rows of 8 float32.
      const std::int64_t rows = (set.rank() + 1) * 5000;
      std::vector<float> mine(static_cast<std::size_t>(rows * 8), static_cast<float>(me));
      g_received = 0;
      const Tensor all = gather(TensorView(mine.data(), {rows, 8}), root, "bytes.g", set);
      const std::int64_t gathered = g_received;
      const std::int64_t others = (n * (n + 1) / 2 * 5000 - rows) * 8 * 4;
      failures.check(gathered == (me == root ? others : 0),
                     at + ": gather received " + std::to_string(gathered) + " bytes");
      failures.check(all.num_elements() == (me == root ? n * (n + 1) / 2 * 5000 * 8 : 0),
                     at + ": gather result");
      // scatter: set rank s receives (s + 1) * 5000 rows of 8 float32, and nothing else.
      std::vector<std::int64_t> splits;
      for (int s = 0; s < n; ++s) splits.push_back((s + 1) * 5000);
      std::vector<float> input;
      if (me == root) input.assign(static_cast<std::size_t>(n * (n + 1) / 2 * 5000 * 8), 1.0f);
      g_received = 0;
      const Tensor part = scatter(me == root ? TensorView(input.data(), {n * (n + 1) / 2 * 5000, 8})
                                             : TensorView(nullptr, DataType::Float32, {0}),
                                  root, splits, "bytes.s", set);
      const std::int64_t scattered = g_received;
      failures.check(scattered == (me == root ? 0 : rows * 8 * 4),
                     at + ": scatter received " + std::to_string(scattered) + " bytes");
      failures.check(part.shape() == Shape{rows, 8}, at + ": scatter result");
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

}  // namespace
}  // namespace tutti::test

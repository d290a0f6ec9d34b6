// SPDX-License-Identifier: Apache-2.0
// The torch.distributed tutorial's ring allreduce with tutti's point-to-point ops: the vector
// is cut into `size` chunks; in the reduce-scatter phase each rank sends one chunk to its
// right neighbour and adds the chunk it receives from its left one, size - 1 times, after
// which rank r holds the full sum of chunk (r + 1) % size; the allgather phase passes the
// finished chunks around the ring the same way. Checked against tutti::allreduce, with both
// times printed.
//
// Usage: mpirun -n 4 build/examples/ring_allreduce [--elements N]
//   --elements  the vector's length, 1 to 2^30 (default 2^20)
// Exits 1 if the ring's result differs from tutti::allreduce's, 2 for bad flags.
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "examples/flag_reader.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] = "usage: ring_allreduce [--elements N]\n";
// Two float vectors of 2^30 (8 GiB) are more than an example needs.
constexpr std::int64_t kMaxElements = std::int64_t{1} << 30;

// Sums `data` over every rank in place with a ring of isend/irecv.
void ring_allreduce(std::vector<float>& data) {
  const int size = tutti::size();
  const int rank = tutti::rank();
  if (size == 1) return;
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  const auto n = static_cast<std::int64_t>(data.size());
  // Chunk c covers [begin(c), begin(c + 1)): the first n % size chunks have one more element.
  const auto begin = [&](int c) {
    const std::int64_t q = n / size;
    const std::int64_t m = n % size;
    return c * q + std::min<std::int64_t>(c, m);
  };
  const auto chunk = [&](int c) {
    const int wrapped = ((c % size) + size) % size;
    return tutti::TensorView(data.data() + begin(wrapped), {begin(wrapped + 1) - begin(wrapped)});
  };
  std::vector<float> incoming(static_cast<std::size_t>(n / size + 1));
  // Reduce-scatter: at step s, send chunk rank - s, receive chunk rank - s - 1 and add it.
  for (int step = 0; step < size - 1; ++step) {
    const tutti::TensorView out = chunk(rank - step);
    const tutti::TensorView mine = chunk(rank - step - 1);
    const tutti::TensorView in(incoming.data(), {mine.num_elements()});
    std::vector<tutti::Handle> handles = tutti::batch_isend_irecv(
        {{tutti::P2POp::Kind::Send, out, right, 0}, {tutti::P2POp::Kind::Recv, in, left, 0}});
    tutti::wait_all(handles);
    float* target = static_cast<float*>(mine.data());
    for (std::int64_t i = 0; i < mine.num_elements(); ++i)
      target[i] += incoming[static_cast<std::size_t>(i)];
  }
  // Allgather: rank r now owns chunk r + 1; at step s it sends chunk rank + 1 - s and
  // receives chunk rank - s straight into place.
  for (int step = 0; step < size - 1; ++step) {
    tutti::Handle s = tutti::isend(chunk(rank + 1 - step), right, 1);
    tutti::Handle r = tutti::irecv(chunk(rank - step), left, 1);
    s.wait();
    r.wait();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t elements = 1 << 20;
  tutti::examples::FlagReader flags("ring_allreduce", argc, argv);
  while (flags.next()) {
    if (flags.is("--elements"))
      elements = flags.integer(1, kMaxElements);
    else
      flags.unknown();
  }
  if (const std::optional<int> exit_status = flags.exit_status(kUsage)) return *exit_status;
  tutti::init();
  const int rank = tutti::rank();
  std::vector<float> ring(static_cast<std::size_t>(elements));
  for (std::int64_t i = 0; i < elements; ++i)
    ring[static_cast<std::size_t>(i)] = static_cast<float>((rank + 1) * (i % 7));
  std::vector<float> reference = ring;

  const Clock::time_point t0 = Clock::now();
  ring_allreduce(ring);
  const Clock::time_point t1 = Clock::now();
  tutti::allreduce(tutti::TensorView(reference.data(), {elements}), "reference",
                   {.op = tutti::ReduceOp::Sum});
  const Clock::time_point t2 = Clock::now();

  // Both sum the same integers exactly; the closed form is sum(r + 1) * (i % 7).
  const float ranks_sum = static_cast<float>(tutti::size() * (tutti::size() + 1) / 2);
  int wrong = 0;
  for (std::int64_t i = 0; i < elements; ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (ring[k] != reference[k] || ring[k] != ranks_sum * static_cast<float>(i % 7)) ++wrong;
  }
  const std::int64_t total_wrong = [&] {
    std::vector<std::int64_t> w = {wrong};
    tutti::allreduce(tutti::TensorView(w.data(), {1}), "wrong", {.op = tutti::ReduceOp::Sum});
    return w[0];
  }();
  if (rank == 0) {
    std::printf(
        "ring allreduce of %lld floats on %d ranks: ring %.3f ms, tutti::allreduce %.3f ms, "
        "%s\n",
        static_cast<long long>(elements), tutti::size(),
        std::chrono::duration<double, std::milli>(t1 - t0).count(),
        std::chrono::duration<double, std::milli>(t2 - t1).count(),
        total_wrong == 0 ? "results equal" : "RESULTS DIFFER");
  }
  tutti::shutdown();
  return total_wrong == 0 ? 0 : 1;
}

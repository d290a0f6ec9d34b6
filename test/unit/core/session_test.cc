// SPDX-License-Identifier: Apache-2.0
// Whole sessions over the in-memory transport: N threads as N ranks, no MPI.
#include "src/core/session.h"

#include <algorithm>
#include <csignal>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "src/base/host_memory_cache.h"
#include "test/support/fake_transport.h"

namespace tutti::test {
namespace {

std::shared_ptr<core::Entry> allreduce_entry(const std::string& name, TensorView view,
                                             ReduceOp op = ReduceOp::Sum) {
  auto entry = std::make_shared<core::Entry>();
  entry->request.name = name;
  entry->request.op = core::Collective::Allreduce;
  entry->request.reduce_op = op;
  entry->request.tensors = {core::TensorSpec{.dtype = view.dtype(), .shape = view.shape()}};
  entry->inputs = {view};
  entry->outputs = {view};
  entry->state = std::make_shared<detail::OpState>();
  return entry;
}

// Runs `body(session, rank)` on `size` ranks, each with its own Session over one FakeWorld.
template <class F>
void with_sessions(int size, F&& body) {
  FakeWorld world(size);
  std::vector<std::unique_ptr<ops::Transport>> transports;
  for (int r = 0; r < size; ++r) transports.push_back(world.transport(r));
  run_ranks(size, [&](int rank) {
    // Session::create cannot fail over the fake transport (no MPI, no environment).
    std::shared_ptr<core::Session> session =
        core::Session::create(core::Config{}, std::move(transports[static_cast<std::size_t>(rank)]))
            .value();
    body(*session, rank);
    session->stop();
  });
}

TEST_CASE("Sessions sum tensors submitted in a different order on each rank", "[session]") {
  const int size = GENERATE(2, 3, 5);
  constexpr int kTensors = 40;
  std::vector<int> ok(static_cast<std::size_t>(size), 0);
  with_sessions(size, [&](core::Session& session, int rank) {
    std::vector<std::vector<float>> data(kTensors);
    std::vector<std::shared_ptr<core::Entry>> entries(kTensors);
    std::vector<int> order(kTensors);
    for (int i = 0; i < kTensors; ++i) {
      data[i].assign(static_cast<std::size_t>(i + 1), static_cast<float>(rank + i));
      entries[i] = allreduce_entry("t." + std::to_string(i), TensorView(data[i].data(), {i + 1}));
      order[i] = i;
    }
    std::mt19937 rng(static_cast<unsigned>(rank));
    std::shuffle(order.begin(), order.end(), rng);
    bool all = true;
    for (int i : order) all = all && session.submit(entries[i]).ok();
    for (int i = 0; i < kTensors; ++i) {
      all = all && entries[i]->state->wait().ok();
      // Closed form: sum over ranks of (rank + i).
      const float expected = static_cast<float>(size * (size - 1) / 2 + size * i);
      all = all &&
            std::all_of(data[i].begin(), data[i].end(), [&](float x) { return x == expected; });
    }
    ok[static_cast<std::size_t>(rank)] = all;
  });
  for (int v : ok) CHECK(v == 1);
}

TEST_CASE("Sessions fail a shape mismatch on every rank, naming both shapes", "[session]") {
  const int size = GENERATE(2, 3, 5);
  std::vector<std::string> messages(static_cast<std::size_t>(size));
  std::vector<int> codes(static_cast<std::size_t>(size), -1);
  std::vector<int> usable(static_cast<std::size_t>(size), 0);
  with_sessions(size, [&](core::Session& session, int rank) {
    const std::int64_t rows = rank == size - 1 ? 4 : 3;
    std::vector<float> data(68);
    auto entry = allreduce_entry("grad.fc1", TensorView(data.data(), {17, rows}));
    const Status submitted = session.submit(entry);
    const Status status = submitted.ok() ? entry->state->wait() : submitted;
    codes[static_cast<std::size_t>(rank)] = static_cast<int>(status.code());
    messages[static_cast<std::size_t>(rank)] = std::string(status.message());
    // Still usable afterwards.
    float one = 1.0f;
    auto after = allreduce_entry("after", TensorView(&one, {1}));
    usable[static_cast<std::size_t>(rank)] =
        session.submit(after).ok() && after->state->wait().ok() && one == static_cast<float>(size);
  });
  const std::string expected =
      "Mismatched ALLREDUCE tensor shapes for 'grad.fc1': rank 0 sent [17, 3], rank " +
      std::to_string(size - 1) + " sent [17, 4]";
  for (int r = 0; r < size; ++r) {
    CHECK(codes[static_cast<std::size_t>(r)] == static_cast<int>(ErrorCode::Mismatch));
    CHECK(messages[static_cast<std::size_t>(r)] == expected);
    CHECK(usable[static_cast<std::size_t>(r)] == 1);
  }
}

// An entry of a rooted op over one tensor; `view` is also the output (reduce is in place).
std::shared_ptr<core::Entry> rooted_entry(core::Collective op, const std::string& name,
                                          TensorView view, int root,
                                          std::vector<std::int64_t> splits = {}) {
  auto entry = allreduce_entry(name, view);
  entry->request.op = op;
  entry->request.root_rank = root;
  entry->request.splits = std::move(splits);
  return entry;
}

TEST_CASE("Sessions run reduce, gather and scatter: only the root receives", "[session][rooted]") {
  const int size = GENERATE(2, 3);
  std::vector<int> ok(static_cast<std::size_t>(size), 0);
  with_sessions(size, [&](core::Session& session, int rank) {
    const int root = size - 1;
    bool good = true;
    // reduce (Sum): rank r holds r + 1 in each of 3 elements.
    std::vector<float> reduced(3, static_cast<float>(rank + 1));
    auto reduce =
        rooted_entry(core::Collective::Reduce, "r", TensorView(reduced.data(), {3}), root);
    // gather: rank r gives r rows of 2 values r.
    std::vector<float> rows(static_cast<std::size_t>(2 * rank), static_cast<float>(rank));
    auto gather =
        rooted_entry(core::Collective::Gather, "g", TensorView(rows.data(), {rank, 2}), root);
    // scatter: the root's rows k = 0, 1, ... (one float each); rank r receives r + 1 of them.
    std::vector<float> input;
    std::vector<std::int64_t> splits;
    for (int r = 0; r < size; ++r) splits.push_back(r + 1);
    for (int k = 0; k < size * (size + 1) / 2; ++k) input.push_back(static_cast<float>(k));
    auto scatter = rooted_entry(core::Collective::Scatter, "s",
                                rank == root ? TensorView(input.data(), {size * (size + 1) / 2, 1})
                                             : TensorView(nullptr, DataType::Float32, {0}),
                                root, rank == root ? splits : std::vector<std::int64_t>{});
    for (const auto& entry : {reduce, gather, scatter}) good = good && session.submit(entry).ok();
    for (const auto& entry : {reduce, gather, scatter}) good = good && entry->state->wait().ok();
    const float sum = static_cast<float>(size * (size + 1) / 2);
    good = good && reduced[2] == (rank == root ? sum : static_cast<float>(rank + 1));
    const Tensor& all = gather->state->results().output;
    if (rank == root) {
      good = good && all.shape() == Shape{size * (size - 1) / 2, 2} &&
             all.span<float>().back() == static_cast<float>(size - 1);
    } else {
      good = good && all.data() == nullptr;
    }
    const Tensor& part = scatter->state->results().output;
    const int first = rank * (rank + 1) / 2;
    good = good && part.shape() == Shape{rank + 1, 1} &&
           part.span<float>()[0] == static_cast<float>(first) &&
           part.span<float>()[static_cast<std::size_t>(rank)] == static_cast<float>(first + rank);
    ok[static_cast<std::size_t>(rank)] = good;
  });
  for (int v : ok) CHECK(v == 1);
}

TEST_CASE("A name already in flight is refused by submit", "[session]") {
  // Each rank first submits an op that the other submits only later, so that it is surely in
  // flight when its name comes again (an op both submit at once may complete in between).
  std::vector<int> refused(2, 0);
  std::latch both_tried(2);
  with_sessions(2, [&](core::Session& session, int rank) {
    float mine = 1.0f;
    float theirs = 1.0f;
    const std::string own = "dup." + std::to_string(rank);
    auto first = allreduce_entry(own, TensorView(&mine, {1}));
    const bool submitted = session.submit(first).ok();
    const Status second = session.submit(allreduce_entry(own, TensorView(&mine, {1})));
    both_tried.arrive_and_wait();
    auto other = allreduce_entry("dup." + std::to_string(1 - rank), TensorView(&theirs, {1}));
    const bool other_done = session.submit(other).ok() && other->state->wait().ok();
    refused[static_cast<std::size_t>(rank)] = submitted &&
                                              second.code() == ErrorCode::InvalidArgument &&
                                              first->state->wait().ok() && other_done;
  });
  CHECK(refused == std::vector<int>{1, 1});
}

TEST_CASE("Stopping one rank fails the other's pending op with ShutDown", "[session]") {
  int code = -1;
  with_sessions(2, [&](core::Session& session, int rank) {
    if (rank != 1) return;  // Rank 0 stops at once; rank 1's op can never be matched.
    float x = 1.0f;
    auto lonely = allreduce_entry("lonely", TensorView(&x, {1}));
    // Either the submission already sees the stopped session, or the pending op is failed.
    const Status submitted = session.submit(lonely);
    code = static_cast<int>(submitted.ok() ? lonely->state->wait().code() : submitted.code());
  });
  CHECK(code == static_cast<int>(ErrorCode::ShutDown));
}

TEST_CASE("Ops submitted after a peer's shutdown are refused naming it", "[session]") {
  // Rank 1 never calls shutdown() itself: "Tutti has shut down" alone would not say why.
  std::string pending, later;
  int later_code = -1;
  with_sessions(2, [&](core::Session& session, int rank) {
    if (rank != 1) return;  // Rank 0 stops at once.
    float x = 1.0f;
    auto lonely = allreduce_entry("lonely", TensorView(&x, {1}));
    const Status submitted = session.submit(lonely);
    pending = std::string(submitted.ok() ? lonely->state->wait().message() : submitted.message());
    while (!session.stopped()) std::this_thread::yield();
    const Status refused = session.submit(allreduce_entry("later", TensorView(&x, {1})));
    later_code = static_cast<int>(refused.code());
    later = std::string(refused.message());
  });
  CHECK(later_code == static_cast<int>(ErrorCode::ShutDown));
  CHECK(later == "Tutti has shut down: rank 0 shut down");
  CHECK_THAT(pending, Catch::Contains("rank 0 shut down"));
}

TEST_CASE("Ops submitted after this rank's own stop are refused plainly", "[session]") {
  std::string later;
  with_sessions(1, [&](core::Session& session, int) {
    session.stop();
    float x = 1.0f;
    later = std::string(session.submit(allreduce_entry("later", TensorView(&x, {1}))).message());
  });
  CHECK(later == "Tutti has shut down");
}

void (*sigpipe_handler())(int) {
  struct sigaction current = {};
  sigaction(SIGPIPE, nullptr, &current);
  return current.sa_handler;
}

TEST_CASE("A session ignores SIGPIPE while it runs", "[session][sigpipe]") {
  // Note [SIGPIPE while a session runs] in src/core/sigpipe_guard.h.
  REQUIRE(sigpipe_handler() == SIG_DFL);
  std::vector<void (*)(int)> while_running(2, SIG_DFL);  // Checked here: Catch is one-thread.
  with_sessions(2, [&](core::Session&, int rank) {
    while_running[static_cast<std::size_t>(rank)] = sigpipe_handler();
  });
  CHECK(while_running[0] == SIG_IGN);
  CHECK(while_running[1] == SIG_IGN);
  CHECK(sigpipe_handler() == SIG_DFL);
}

TEST_CASE("A session keeps freed tensor storage up to its knob and frees it when it stops",
          "[session][host_cache]") {
  constexpr std::size_t kCapacity = std::size_t{5} << 20;
  FakeWorld world(1);
  core::Config config;
  config.host_memory_cache = static_cast<std::int64_t>(kCapacity);
  std::shared_ptr<core::Session> session =
      core::Session::create(config, world.transport(0)).value();
  CHECK(base::host_cache_capacity() == kCapacity);
  static_cast<void>(Tensor::empty(DataType::Float32, {1 << 20}));  // 4 MiB, freed at once.
  CHECK(base::host_cache_stats().cached_bytes > 0);
  session->stop();
  CHECK(base::host_cache_capacity() == 0);
  CHECK(base::host_cache_stats().cached_bytes == 0);
}

}  // namespace
}  // namespace tutti::test

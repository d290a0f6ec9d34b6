// SPDX-License-Identifier: Apache-2.0
// The response executor (stage 3 of Note [The cycle]) on N threads as N ranks over the
// in-memory transport: every rank executes the same hand-made ResponseList, as the coordinator
// would send it, and the outputs are checked against closed forms.
#include "src/core/execution/response_executor.h"

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/execution/executor.h"
#include "src/core/op_state.h"
#include "test/support/fake_transport.h"

namespace tutti::core {
namespace {

// One rank's stage 3 and everything it works with.
struct Rank {
  explicit Rank(std::unique_ptr<ops::Transport> t)
      : transport(std::move(t)),
        queue(&recorder),
        sets(*transport, 1),
        completer(nullptr, &recorder),
        device(sets, completer, transport->topology()),
        executor({.queue = queue,
                  .sets = sets,
                  .device = device,
                  .completer = completer,
                  .timeline = nullptr,
                  .recorder = &recorder},
                 1 << 20) {
    std::vector<int> everyone;
    for (int r = 0; r < transport->topology().size; ++r) everyone.push_back(r);
    ok = sets.add(0, everyone).ok();
  }
  // Submits an allreduce of `data` (Sum), as the API would.
  std::shared_ptr<Entry> submit(const std::string& name, std::vector<float>& data, int set = 0) {
    auto entry = std::make_shared<Entry>();
    entry->request.name = name;
    entry->request.process_set_id = set;
    entry->request.op = Collective::Allreduce;
    entry->request.reduce_op = ReduceOp::Sum;
    const TensorView view(data.data(), {static_cast<std::int64_t>(data.size())});
    entry->request.tensors = {TensorSpec{.dtype = DataType::Float32, .shape = view.shape()}};
    entry->inputs = {view};
    entry->outputs = {view};
    entry->state = std::make_shared<detail::OpState>();
    ok = ok && queue.push(entry).ok();
    queue.drain_new();  // As the request sender would.
    return entry;
  }

  std::unique_ptr<ops::Transport> transport;
  FlightRecorder recorder{16};
  TensorQueue queue;
  ProcessSetTable sets;
  Completer completer;
  DevicePath device;
  ResponseExecutor executor;
  bool ok = true;
};

Response allreduce_response(const std::string& name, std::int64_t count, ReduceOp op,
                            std::vector<int> joined = {}) {
  Response r;
  r.name = name;
  r.op = Collective::Allreduce;
  r.reduce_op = op;
  r.tensors = {TensorSpec{.dtype = DataType::Float32, .shape = {count}}};
  r.joined = std::move(joined);
  return r;
}

ResponseList responses_of(std::vector<Response> responses,
                          std::vector<std::int32_t> cache_ids = {}) {
  ResponseList list;
  if (cache_ids.empty()) cache_ids.assign(responses.size(), -1);
  list.cache_ids = std::move(cache_ids);
  list.hit.assign(responses.size(), 0);
  list.responses = std::move(responses);
  return list;
}

// Runs `body(rank)` on `size` threads, each with its own Rank of one world.
template <class F>
void with_ranks(int size, F&& body) {
  test::FakeWorld world(size);
  std::vector<std::unique_ptr<ops::Transport>> transports;
  for (int r = 0; r < size; ++r) transports.push_back(world.transport(r));
  test::run_ranks(size, [&](int r) {
    Rank rank(std::move(transports[static_cast<std::size_t>(r)]));
    body(rank, r);
  });
}

TEST_CASE("A fused list sums every tensor; Average divides; errors fail only their op",
          "[executor]") {
  const int size = GENERATE(2, 3);
  std::vector<int> ok(static_cast<std::size_t>(size), 0);
  with_ranks(size, [&](Rank& rank, int r) {
    std::vector<float> a(5, static_cast<float>(r + 1));
    std::vector<float> b(3, 2.0f * static_cast<float>(r));
    std::vector<float> c(2, 1.0f);
    auto ea = rank.submit("a", a);
    auto eb = rank.submit("b", b);
    auto ec = rank.submit("c", c);
    Response error = allreduce_response("c", 2, ReduceOp::Sum);
    error.ok = false;
    error.error_code = ErrorCode::Mismatch;
    error.error_message = "Mismatched ALLREDUCE tensor shapes for 'c'";
    const Status status =
        rank.executor.execute(responses_of({allreduce_response("a", 5, ReduceOp::Sum),
                                            allreduce_response("b", 3, ReduceOp::Average), error}));
    const float sum_a = static_cast<float>(size * (size + 1) / 2);  // Σ (r + 1)
    const float avg_b = static_cast<float>(size - 1);               // Σ 2r / size
    bool good = rank.ok && status.ok() && ea->state->wait().ok() && eb->state->wait().ok();
    for (float x : a) good = good && x == sum_a;
    for (float x : b) good = good && x == avg_b;
    const Status failed = ec->state->wait();
    good = good && failed.code() == ErrorCode::Mismatch && c == std::vector<float>(2, 1.0f);
    ok[static_cast<std::size_t>(r)] = good;
  });
  CHECK(ok == std::vector<int>(static_cast<std::size_t>(size), 1));
}

TEST_CASE("A cached response is filed on every rank and replayed by id", "[executor][cache]") {
  std::vector<int> ok(2, 0);
  with_ranks(2, [&](Rank& rank, int r) {
    std::vector<float> x(4, 1.0f);
    auto first = rank.submit("x", x);
    bool good =
        rank.executor.execute(responses_of({allreduce_response("x", 4, ReduceOp::Sum)}, {9})).ok();
    good = good && first->state->wait().ok() && rank.executor.cache().response(9) != nullptr;
    // The same request is now known by its id; a hit carries no body.
    auto again = rank.submit("x", x);
    good = good && rank.executor.cache().lookup(again->request) == std::optional<std::int32_t>(9);
    ResponseList hit = responses_of({Response{}}, {9});
    hit.hit = {1};
    hit.evicted = {9};  // Evicted after it ran.
    good = good && rank.executor.execute(std::move(hit)).ok() && again->state->wait().ok();
    good = good && x == std::vector<float>(4, 4.0f) && rank.executor.cache().response(9) == nullptr;
    ok[static_cast<std::size_t>(r)] = good && r >= 0;
  });
  CHECK(ok == std::vector<int>{1, 1});
}

TEST_CASE("A run of hits replays each cached op of its ids", "[executor][cache]") {
  const int size = GENERATE(2, 3);
  std::vector<int> ok(static_cast<std::size_t>(size), 0);
  with_ranks(size, [&](Rank& rank, int r) {
    const float value = static_cast<float>(r + 1);
    std::vector<float> a(3, value), b(1, value), c(2, value), d(4, value);
    for (const auto& [name, data] : {std::pair{"a", &a}, {"b", &b}, {"c", &c}})
      rank.submit(name, *data);
    bool good = rank.executor
                    .execute(responses_of({allreduce_response("a", 3, ReduceOp::Sum),
                                           allreduce_response("b", 1, ReduceOp::Average),
                                           allreduce_response("c", 2, ReduceOp::Sum)},
                                          {20, 21, 22}))
                    .ok();
    // Again, with a new op d negotiated between two runs: hits on 21-22, d, a hit on 20.
    for (std::vector<float>* data : {&a, &b, &c, &d}) data->assign(data->size(), value);
    auto ea = rank.submit("a", a);
    auto eb = rank.submit("b", b);
    auto ec = rank.submit("c", c);
    auto ed = rank.submit("d", d);
    ResponseList list = responses_of(
        {Response{}, allreduce_response("d", 4, ReduceOp::Sum), Response{}}, {21, 23, 20});
    list.hit = {2, 0, 1};
    good = good && rank.executor.execute(std::move(list)).ok();
    for (const auto& entry : {ea, eb, ec, ed}) good = good && entry->state->wait().ok();
    const float sum = static_cast<float>(size * (size + 1) / 2);  // Σ (r + 1)
    good = good && a == std::vector<float>(3, sum) && c == std::vector<float>(2, sum) &&
           d == std::vector<float>(4, sum) && b == std::vector<float>(1, sum / size);
    good = good && rank.executor.cache().response(23) != nullptr;
    ok[static_cast<std::size_t>(r)] = good;
  });
  CHECK(ok == std::vector<int>(static_cast<std::size_t>(size), 1));
}

TEST_CASE("A joined member adds zeros without an entry of its own", "[executor][join]") {
  std::vector<int> ok(3, 0);
  with_ranks(3, [&](Rank& rank, int r) {
    std::vector<float> g(6, static_cast<float>(r + 1));
    std::shared_ptr<Entry> entry;
    if (r != 1) entry = rank.submit("g", g);  // Rank 1 has joined.
    const bool ran =
        rank.executor.execute(responses_of({allreduce_response("g", 6, ReduceOp::Average, {1})}))
            .ok();
    bool good = ran;
    if (entry) {
      good = good && entry->state->wait().ok();
      for (float x : g) good = good && x == (1.0f + 3.0f) / 3.0f;  // Average over all 3.
    }
    ok[static_cast<std::size_t>(r)] = good;
  });
  CHECK(ok == std::vector<int>{1, 1, 1});
}

TEST_CASE("Set changes apply at their place in the list; removal fails ops in flight",
          "[executor][process_set]") {
  std::vector<int> ok(2, 0);
  with_ranks(2, [&](Rank& rank, int r) {
    // Every rank submits each set change (src/core/api/process_set.cc), as here.
    auto change = [&](const std::string& name, Collective op) {
      auto entry = std::make_shared<Entry>();
      entry->request.name = name;
      entry->request.op = op;
      entry->state = std::make_shared<detail::OpState>();
      rank.ok = rank.ok && rank.queue.push(entry).ok();
      return entry;
    };
    auto add = change("tutti.process_set.0", Collective::AddProcessSet);
    bool good = rank.ok;
    Response added;
    added.name = "tutti.process_set.0";
    added.op = Collective::AddProcessSet;
    added.set_ranks = {0, 1};
    added.target_set_id = 4;
    good = good && rank.executor.execute(responses_of({added})).ok() && add->state->wait().ok();
    good = good && add->state->results().created_set_id == 4;
    const Result<SetInfo> set = rank.sets.find(4);
    good = good && set.ok() && *set.value().ranks == std::vector<int>{0, 1} &&
           set.value().set_rank == r;
    std::vector<float> x(1, 1.0f);
    auto pending = rank.submit("on.4", x, 4);
    auto remove = change("tutti.process_set.1", Collective::RemoveProcessSet);
    Response removed;
    removed.name = "tutti.process_set.1";
    removed.op = Collective::RemoveProcessSet;
    removed.target_set_id = 4;
    good =
        good && rank.executor.execute(responses_of({removed})).ok() && remove->state->wait().ok();
    good = good && pending->state->wait().code() == ErrorCode::ShutDown && !rank.sets.find(4).ok();
    ok[static_cast<std::size_t>(r)] = good;
  });
  CHECK(ok == std::vector<int>{1, 1});
}

TEST_CASE("A batch that throws fails its ops and the list's later ones with Internal",
          "[executor]") {
  // Note [A batch that throws]: a scatter whose splits pass int64 (which the call now refuses)
  // threw from the output's shape inside the batch; its handle was never completed.
  std::vector<int> ok(2, 0);
  with_ranks(2, [&](Rank& rank, int r) {
    std::vector<float> input(4, 1.0f);
    auto scatter = std::make_shared<Entry>();
    scatter->request.name = "scatter";
    scatter->request.op = Collective::Scatter;
    scatter->request.root_rank = 0;
    scatter->request.tensors = {TensorSpec{.dtype = DataType::Float32, .shape = {4}}};
    scatter->inputs = {TensorView(input.data(), {4})};
    scatter->state = std::make_shared<detail::OpState>();
    rank.ok = rank.ok && rank.queue.push(scatter).ok();
    rank.queue.drain_new();
    std::vector<float> later(2, 1.0f);
    auto after = rank.submit("after", later);
    Response bad;
    bad.name = "scatter";
    bad.op = Collective::Scatter;
    bad.root_rank = 0;
    bad.tensors = {TensorSpec{.dtype = DataType::Float32, .shape = {4}}};
    bad.splits = {std::numeric_limits<std::int64_t>::max(),
                  std::numeric_limits<std::int64_t>::max()};
    const Status status =
        rank.executor.execute(responses_of({bad, allreduce_response("after", 2, ReduceOp::Sum)}));
    const Status scattered = scatter->state->wait();  // Returned: before, it never did.
    const Status summed = after->state->wait();
    ok[static_cast<std::size_t>(r)] =
        rank.ok && status.code() == ErrorCode::Internal &&
        scattered.code() == ErrorCode::Internal &&
        scattered.message().find("communication thread failed") != std::string_view::npos &&
        summed.code() == ErrorCode::Internal && later == std::vector<float>(2, 1.0f);
  });
  CHECK(ok == std::vector<int>{1, 1});
}

TEST_CASE("The bye records why the job stops", "[executor][shutdown]") {
  std::vector<int> ok(2, 0);
  with_ranks(2, [&](Rank& rank, int r) {
    ResponseList bye = responses_of({});
    bye.shutdown = true;
    bye.shutdown_code = ErrorCode::Stalled;
    bye.shutdown_message = "ops were submitted by some ranks but not by others ...";
    const bool ran = rank.executor.execute(std::move(bye)).ok();
    const std::optional<Status>& why = rank.executor.shutdown();
    ok[static_cast<std::size_t>(r)] = ran && why && why->code() == ErrorCode::Stalled;
  });
  CHECK(ok == std::vector<int>{1, 1});
}

TEST_CASE("The flight recorder follows each op from submission to done or failed",
          "[executor][flight_recorder]") {
  std::vector<int> ok(2, 0);
  std::vector<std::string> seen(2);  // What each rank's ring holds, for a failure's message.
  with_ranks(2, [&](Rank& rank, int r) {
    std::vector<float> a(5, 1.0f), b(3, 1.0f), c(2, 1.0f);
    rank.submit("a", a);
    rank.submit("b", b);
    rank.submit("c", c);  // Never answered: still waiting for the other ranks.
    Response error = allreduce_response("b", 3, ReduceOp::Sum);
    error.ok = false;
    error.error_code = ErrorCode::Mismatch;
    error.error_message = "shapes differ";
    const Status status =
        rank.executor.execute(responses_of({allreduce_response("a", 5, ReduceOp::Sum), error}));
    const std::vector<debug::OpRecord> ring = rank.recorder.snapshot();
    bool good = rank.ok && status.ok() && ring.size() == 3;
    if (good) {
      good = ring[0].name == "a" && ring[0].sequence == 0 && ring[0].state == "done" &&
             ring[0].op == "ALLREDUCE" && ring[0].dtype == "float32" && ring[0].shape == Shape{5} &&
             ring[0].finished_s >= ring[0].submitted_s && ring[1].name == "b" &&
             ring[1].sequence == 1 && ring[1].state == "failed" && ring[2].name == "c" &&
             ring[2].sequence == 2 && ring[2].state == "submitted" && ring[2].finished_s < 0;
    }
    for (const debug::OpRecord& record : ring) {
      seen[static_cast<std::size_t>(r)] += record.name + " #" + std::to_string(record.sequence) +
                                           " " + record.state + " " + record.op + " " +
                                           record.dtype + "; ";
    }
    ok[static_cast<std::size_t>(r)] = good;
  });
  INFO("rank 0's ring: " << seen[0] << " rank 1's: " << seen[1]);
  CHECK(ok == std::vector<int>(2, 1));
}

TEST_CASE("A batch's wire dtype and element count come from one pass", "[executor][fusion]") {
  const auto response = [](ReduceOp op, std::vector<TensorSpec> specs) {
    Response r;
    r.reduce_op = op;
    for (TensorSpec& spec : specs) r.tensors.push_back(std::move(spec));
    return r;
  };
  const Response floats = response(ReduceOp::Sum, {{.dtype = DataType::Float32, .shape = {3}},
                                                   {.dtype = DataType::Float32, .shape = {2, 5}}});
  const Response more_floats = response(ReduceOp::Sum, {{.dtype = DataType::Float32, .shape = {}}});
  const Response averaged_ints =
      response(ReduceOp::Average, {{.dtype = DataType::Int32, .shape = {4}}});
  const Response halves = response(ReduceOp::Sum, {{.dtype = DataType::Float16, .shape = {7, 0}},
                                                   {.dtype = DataType::BFloat16, .shape = {6}}});
  const auto batch = [](std::vector<const Response*> responses) {
    std::vector<Work> works;
    for (const Response* r : responses) {
      Work work;
      work.response = r;
      works.push_back(std::move(work));
    }
    return works;
  };
  // Counts: 3 + 2*5 = 13, a 0-d tensor 1, 4, 7*0 + 6 = 6.
  WireBatch one = wire_batch(batch({&floats, &more_floats}));
  CHECK(one.wire == DataType::Float32);
  CHECK(one.count == 14);
  // Integers averaged travel as float64 (API.md). A batch mixing them with floats is mixed: it
  // runs once per wire dtype (Note [Mixed wire dtypes]), the first's counted here.
  WireBatch mixed = wire_batch(batch({&floats, &averaged_ints}));
  CHECK(mixed.mixed);
  CHECK(mixed.wire == DataType::Float32);
  CHECK(mixed.count == 13);
  CHECK(wire_dtypes(batch({&floats, &averaged_ints})) ==
        std::vector<DataType>{DataType::Float32, DataType::Float64});
  CHECK(wire_count(batch({&floats, &averaged_ints}), DataType::Float64) == 4);
  const WireBatch ints = wire_batch(batch({&averaged_ints}));
  CHECK((ints.wire == DataType::Float64 && !ints.mixed && ints.count == 4));
  CHECK_FALSE(one.mixed);
  // 16-bit floats travel as float32, each kind alike.
  WireBatch half = wire_batch(batch({&halves}));
  CHECK(half.wire == DataType::Float32);
  CHECK(half.count == 6);
  CHECK(wire_batch(batch({&halves, &floats})).wire == DataType::Float32);
  CHECK_FALSE(wire_batch(batch({&halves, &floats})).mixed);
}

}  // namespace
}  // namespace tutti::core

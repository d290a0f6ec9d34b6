// SPDX-License-Identifier: Apache-2.0
// The flight recorder's ring (Note [Flight recorder]): sequence numbers per process set, phases
// that only move forward, a ring that keeps the newest ops, and the dump file. The JSON itself
// is read back by scripts/tutti-trace's tests (test/debug).
#include "src/core/flight_recorder.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "src/base/coarse_clock.h"
#include "src/core/tensor_queue.h"

namespace tutti::core {
namespace {

Request recorded_request(const std::string& name, int set = 0, Shape shape = {4}) {
  Request r;
  r.name = name;
  r.process_set_id = set;
  r.op = Collective::Allreduce;
  r.tensors = {TensorSpec{.dtype = DataType::Float64, .shape = std::move(shape)}};
  return r;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_CASE("The queue numbers each process set's ops on their own; records carry the number",
          "[flight_recorder]") {
  FlightRecorder recorder(10);
  TensorQueue queue(&recorder);
  std::vector<std::shared_ptr<Entry>> entries;
  for (const auto& [name, set] :
       std::vector<std::pair<std::string, int>>{{"a", 0}, {"b", 1}, {"c", 0}, {"d", 1}}) {
    entries.push_back(make_entry());
    entries.back()->request = recorded_request(name, set);
    REQUIRE(queue.push(entries.back()).ok());
  }
  // A refused push (the name is in flight) takes no number.
  std::shared_ptr<Entry> again = make_entry();
  again->request = recorded_request("a", 0);
  CHECK_FALSE(queue.push(again).ok());
  CHECK(entries[0]->sequence == 0);
  CHECK(entries[1]->sequence == 0);
  CHECK(entries[2]->sequence == 1);
  CHECK(entries[3]->sequence == 1);
  const std::vector<debug::OpRecord> ring = recorder.snapshot();
  REQUIRE(ring.size() == 4);
  CHECK(ring[0].sequence == 0);
  CHECK(ring[1].sequence == 0);
  CHECK(ring[2].sequence == 1);
  CHECK(ring[3].sequence == 1);
  CHECK(ring[1].process_set_id == 1);
  CHECK(ring[3].name == "d");
  CHECK(ring[0].dtype == "float64");
}

TEST_CASE("An op without tensors has no dtype in its record or the dump", "[flight_recorder]") {
  // Before, a barrier's record said "float32", a dtype no tensor of it had.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tutti_fr_dtype_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  FlightRecorder recorder(4);
  recorder.set_context({.job = "job-1", .rank = 0, .size = 2, .dir = dir.string()});
  Request barrier;
  barrier.name = "barrier.0";
  barrier.op = Collective::Barrier;
  recorder.submitted(barrier, 0);
  recorder.submitted(recorded_request("g"), 1);
  const std::vector<debug::OpRecord> ring = recorder.snapshot();
  REQUIRE(ring.size() == 2);
  CHECK(ring[0].dtype.empty());
  CHECK(ring[1].dtype == "float64");
  const std::string path = recorder.default_path();
  REQUIRE(recorder.dump(path, "test").ok());
  const std::string text = file_text(path);
  CHECK_THAT(text, Catch::Contains("\"op\": \"BARRIER\", \"dtype\": \"\", \"shape\": [],"));
  CHECK_THAT(text, Catch::Contains("\"op\": \"ALLREDUCE\", \"dtype\": \"float64\""));
  std::filesystem::remove_all(dir);
}

// Records are stamped with the coarse clock, up to a tick behind an exact reading: an op
// recorded right after the recorder started must not read as submitted before it.
TEST_CASE("An op recorded at once is not stamped before the recorder started",
          "[flight_recorder]") {
  for (int i = 0; i < 20; ++i) {  // Each try lands somewhere in the kernel's tick.
    FlightRecorder recorder(4);
    REQUIRE(recorder.submitted(recorded_request("first"), 0) == 0);
    const std::vector<debug::OpRecord> ring = recorder.snapshot();
    REQUIRE(ring.size() == 1);
    CHECK(ring[0].submitted_s >= 0);
  }
}

TEST_CASE("A dump path with a NUL in it is refused, nothing written", "[flight_recorder]") {
  FlightRecorder recorder(4);
  const std::string dir = std::filesystem::temp_directory_path() / "tutti_nul_path_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Status dumped = recorder.dump(dir + "/a" + std::string(1, '\0') + "b.json", "test");
  CHECK(dumped.code() == ErrorCode::InvalidArgument);
  CHECK(dumped.message().find("NUL") != std::string::npos);
  CHECK(std::filesystem::is_empty(dir));  // Not even the name before the NUL.
  std::filesystem::remove_all(dir);
}

TEST_CASE("A queued op's record carries the time the caller submitted it", "[flight_recorder]") {
  FlightRecorder recorder(4);
  TensorQueue queue(&recorder);
  const std::int64_t first = recorder.submitted(recorded_request("now"), 0);
  REQUIRE(first == 0);
  // Submitted 5 s before it reached the queue (a caller's clock read the recorder reuses).
  std::shared_ptr<Entry> entry = make_entry();
  entry->request = recorded_request("earlier");
  entry->submitted = std::chrono::steady_clock::now() - std::chrono::seconds(5);
  REQUIRE(queue.push(entry).ok());
  const std::vector<debug::OpRecord> ring = recorder.snapshot();
  REQUIRE(ring.size() == 2);
  CHECK(ring[0].submitted_s - ring[1].submitted_s == Approx(5.0).margin(0.5));
}

// Note [Records made as the queue is drained]: the queue records ops as it hands them on, and
// snapshot() and dump() have it record those still waiting first, so every accepted op is in
// every snapshot, once, with its place in the order of acceptance and its submission time.
TEST_CASE("Ops are recorded as they are drained, or first when the ring is read, once each",
          "[flight_recorder]") {
  FlightRecorder recorder(16);
  auto queue = std::make_unique<TensorQueue>(&recorder);
  std::vector<std::shared_ptr<Entry>> entries;
  const auto push = [&](const std::string& name) {
    entries.push_back(make_entry());
    entries.back()->request = recorded_request(name);
    REQUIRE(queue->push(entries.back()).ok());
  };
  const auto names = [&] {
    std::vector<std::string> out;
    for (const debug::OpRecord& record : recorder.snapshot()) out.push_back(record.name);
    return out;
  };

  SECTION("drained: a record each, stamped at the push, not at the drain") {
    push("a");
    push("b");
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    // A record made now, as a reference for "now".
    REQUIRE(recorder.submitted(recorded_request("reference"), 0) == 0);
    std::vector<Entry*> drained;
    queue->drain_new(&drained);
    REQUIRE(drained.size() == 2);
    CHECK(entries[0]->record == 1);
    CHECK(entries[1]->record == 2);
    const std::vector<debug::OpRecord> ring = recorder.snapshot();
    REQUIRE(ring.size() == 3);
    CHECK(ring[1].name == "a");
    CHECK(ring[2].state == "submitted");
    // The coarse stamp may be up to a tick early; the 60 ms wait is well past that.
    CHECK(ring[0].submitted_s - ring[1].submitted_s >= 0.04);
    CHECK(ring[0].submitted_s - ring[1].submitted_s < 5.0);
  }

  SECTION("waiting: in every snapshot and dump, and not recorded again when drained") {
    push("a");
    push("b");
    CHECK(names() == std::vector<std::string>{"a", "b"});
    CHECK(entries[0]->record == 0);
    CHECK(entries[1]->record == 1);
    push("c");
    const std::string path =
        (std::filesystem::temp_directory_path() / ("tutti_fr_waiting_" + std::to_string(getpid())))
            .string();
    REQUIRE(recorder.dump(path, "test").ok());
    const std::string text = file_text(path);
    std::filesystem::remove(path);
    CHECK(text.find("\"name\": \"c\"") != std::string::npos);
    CHECK(text.find("\"recorded\": 3") != std::string::npos);
    std::vector<Entry*> drained;
    queue->drain_new(&drained);
    REQUIRE(drained.size() == 3);
    CHECK(names() == std::vector<std::string>{"a", "b", "c"});
    CHECK(entries[2]->record == 2);
    recorder.update(entries[1]->record, OpPhase::Done);
    CHECK(recorder.snapshot()[1].state == "done");
  }

  SECTION("closed: ops never drained are recorded, so that their failure shows") {
    push("a");
    const std::vector<std::shared_ptr<Entry>> pending =
        queue->close(Status(ErrorCode::ShutDown, "x"));
    REQUIRE(pending.size() == 1);
    REQUIRE(entries[0]->record == 0);
    recorder.update(entries[0]->record, OpPhase::Failed, {}, "x");
    CHECK(recorder.snapshot().at(0).state == "failed");
  }

  SECTION("the queue gone, the recorder still reads") {
    push("a");
    queue.reset();
    CHECK(names() == std::vector<std::string>{});  // Never drained nor read: never recorded.
  }
}

// The same with a submitting thread, a draining thread and a reading thread at once (the TSan
// build runs it too): every op recorded once, in the order submitted.
TEST_CASE("Ops drained and read concurrently are each recorded once, in order",
          "[flight_recorder]") {
  constexpr int kOps = 3000;
  FlightRecorder recorder(kOps);
  TensorQueue queue(&recorder);
  std::atomic<bool> pushed{false};
  std::thread drainer([&] {
    std::vector<Entry*> drained;
    while (!pushed.load()) {
      queue.drain_new(&drained);
      drained.clear();
    }
  });
  std::atomic<int> out_of_order{0};  // Counted here, checked below: Catch2 asserts on one thread.
  std::thread reader([&] {
    while (!pushed.load()) {
      const std::vector<debug::OpRecord> ring = recorder.snapshot();
      for (std::size_t i = 0; i < ring.size(); ++i) {
        if (ring[i].sequence != static_cast<std::int64_t>(i)) out_of_order.fetch_add(1);
      }
    }
  });
  for (int i = 0; i < kOps; ++i) {
    std::shared_ptr<Entry> entry = make_entry();
    entry->request = recorded_request("op." + std::to_string(i));
    REQUIRE(queue.push(std::move(entry)).ok());
  }
  pushed.store(true);
  drainer.join();
  reader.join();
  CHECK(out_of_order.load() == 0);
  const std::vector<debug::OpRecord> ring = recorder.snapshot();
  REQUIRE(ring.size() == kOps);
  for (int i = 0; i < kOps; ++i) {
    REQUIRE(ring[i].sequence == i);
    REQUIRE(ring[i].name == "op." + std::to_string(i));
  }
}

// Note [Coarse clock]: the stamp of an op submitted without a clock reading is the kernel's last
// tick, never later than an exact reading taken after it and at most a tick (4 ms at 250 Hz;
// 10 at 100 Hz, with room for a descheduled thread) earlier than one taken before.
TEST_CASE("The coarse clock is never ahead of steady_clock and at most a tick behind",
          "[flight_recorder]") {
  for (int i = 0; i < 1000; ++i) {
    const auto before = std::chrono::steady_clock::now();
    const auto coarse = base::coarse_now();
    const auto after = std::chrono::steady_clock::now();
    REQUIRE(coarse <= after);
    REQUIRE(coarse >= before - std::chrono::milliseconds(50));
  }
}

TEST_CASE("Phases only move forward, and finishing stamps the time", "[flight_recorder]") {
  FlightRecorder recorder(4);
  const std::int64_t id = recorder.submitted(recorded_request("x"), 0);
  CHECK(recorder.snapshot()[0].state == "submitted");
  CHECK(recorder.snapshot()[0].finished_s < 0);
  recorder.update(id, OpPhase::Executing, "MPI");
  recorder.update(id, OpPhase::Negotiated);  // Late and out of order: ignored.
  CHECK(recorder.snapshot()[0].state == "executing");
  recorder.update(id, OpPhase::Failed, {}, "Stalled: rank 1 never submitted it");
  const debug::OpRecord record = recorder.snapshot()[0];
  CHECK(record.state == "failed");
  CHECK(record.finished_s >= record.submitted_s);
  recorder.update(-1, OpPhase::Done);  // An op recorded while recording was off.
}

// Note [Phases written as a batch ends]: a response list's ops read as negotiated, then
// executing, although their records are written once, as their batch ends.
std::int64_t same_id(std::int64_t id) { return id; }

std::string state_of(FlightRecorder& recorder, const std::string& name) {
  for (const debug::OpRecord& record : recorder.snapshot()) {
    if (record.name == name) return record.state;
  }
  return "absent";
}

TEST_CASE("A list's ops read as negotiated and executing before their batch writes them",
          "[flight_recorder]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tutti_fr_list_" + std::to_string(getpid()));
  FlightRecorder recorder(8);
  recorder.set_context({.job = "j", .rank = 0, .size = 1, .dir = dir.string()});
  const std::int64_t a = recorder.submitted(recorded_request("a"), 0);
  const std::int64_t b = recorder.submitted(recorded_request("b"), 1);
  const std::int64_t c = recorder.submitted(recorded_request("c"), 2);
  recorder.submitted(recorded_request("not_in_the_list"), 3);
  // Position 2 has no record (a joined rank's work).
  recorder.list_negotiated(std::vector<std::int64_t>{a, b, -1, c}, same_id);
  CHECK(state_of(recorder, "a") == "negotiated");
  CHECK(state_of(recorder, "c") == "negotiated");
  CHECK(state_of(recorder, "not_in_the_list") == "submitted");

  const std::vector<std::size_t> first{0, 1, 2};
  recorder.batch_begun(first);
  CHECK(state_of(recorder, "a") == "negotiated");  // Begun, not yet executing.
  recorder.batch_executing("shm");
  CHECK(state_of(recorder, "a") == "executing");
  CHECK(state_of(recorder, "b") == "executing");
  CHECK(state_of(recorder, "c") == "negotiated");
  // A dump made now (a hang's) shows the backend and the times of the phases reached.
  REQUIRE(recorder.dump(recorder.default_path(), "test").ok());
  const std::string during = file_text(recorder.default_path());
  CHECK_THAT(during, Catch::Contains("\"name\": \"a\", \"op\": \"ALLREDUCE\""));
  CHECK_THAT(during, Catch::Contains("\"state\": \"executing\", \"backend\": \"shm\""));
  CHECK_THAT(during, Catch::Contains("\"state\": \"negotiated\", \"backend\": \"\""));

  recorder.batch_finished(OpPhase::Done);
  CHECK(state_of(recorder, "a") == "done");
  CHECK(state_of(recorder, "b") == "done");
  CHECK(state_of(recorder, "c") == "negotiated");
  const std::vector<std::size_t> second{3};
  recorder.batch_begun(second);
  recorder.batch_executing("mpi");
  recorder.batch_finished(OpPhase::Failed, "peer gone");
  recorder.list_ended();
  const std::vector<debug::OpRecord> ring = recorder.snapshot();
  REQUIRE(ring.size() == 4);
  CHECK(ring[0].finished_s >= ring[0].submitted_s);
  CHECK(ring[2].state == "failed");
  CHECK(ring[3].state == "submitted");
  REQUIRE(recorder.dump(recorder.default_path(), "test").ok());
  const std::string after = file_text(recorder.default_path());
  CHECK_THAT(after, Catch::Contains("\"state\": \"done\", \"backend\": \"shm\""));
  CHECK_THAT(after, Catch::Contains("\"state\": \"failed\", \"backend\": \"mpi\""));
  CHECK_THAT(after, Catch::Contains("\"error\": \"peer gone\""));
  // Every time stamped: no -1 for an op that reached done.
  const std::size_t done_at = after.find("\"state\": \"done\"");
  REQUIRE(done_at != std::string::npos);
  const std::string done_record = after.substr(done_at, after.find('}', done_at) - done_at);
  CHECK_THAT(done_record, !Catch::Contains("-1.000000"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("A deferred batch is marked executing for the thread that finishes it",
          "[flight_recorder]") {
  FlightRecorder recorder(4);
  const std::int64_t gpu = recorder.submitted(recorded_request("gpu"), 0);
  const std::int64_t handed = recorder.submitted(recorded_request("handed"), 1);
  const std::int64_t never = recorder.submitted(recorded_request("never"), 2);
  recorder.list_negotiated(std::vector<std::int64_t>{gpu, handed, never}, same_id);
  const std::vector<std::size_t> first{0};
  recorder.batch_begun(first);
  recorder.batch_executing("nccl");
  recorder.batch_deferred();
  // The hand-over of the second batch fails after its records were marked: still finished.
  const std::vector<std::size_t> second{1};
  recorder.batch_begun(second);
  recorder.batch_executing("nccl");
  recorder.batch_deferred();
  recorder.batch_finished(OpPhase::Failed, "no event");
  recorder.list_ended();  // "never" ended in no batch: negotiated, for good.
  CHECK(state_of(recorder, "gpu") == "executing");
  CHECK(state_of(recorder, "handed") == "failed");
  CHECK(state_of(recorder, "never") == "negotiated");
  recorder.update(gpu, OpPhase::Done);  // The device thread, later.
  CHECK(state_of(recorder, "gpu") == "done");
}

TEST_CASE("A list's ops overwritten in the ring are skipped", "[flight_recorder]") {
  FlightRecorder recorder(2);
  const std::int64_t old = recorder.submitted(recorded_request("old"), 0);
  const std::int64_t kept = recorder.submitted(recorded_request("kept"), 1);
  recorder.list_negotiated(std::vector<std::int64_t>{old, kept}, same_id);
  recorder.submitted(recorded_request("newer"), 2);  // Takes old's slot.
  CHECK(state_of(recorder, "newer") == "submitted");
  const std::vector<std::size_t> both{0, 1};
  recorder.batch_begun(both);
  recorder.batch_executing("shm");
  CHECK(state_of(recorder, "newer") == "submitted");
  CHECK(state_of(recorder, "kept") == "executing");
  recorder.batch_finished(OpPhase::Done);
  recorder.list_ended();
  CHECK(state_of(recorder, "newer") == "submitted");
  CHECK(state_of(recorder, "kept") == "done");
  CHECK(state_of(recorder, "old") == "absent");
}

TEST_CASE("The ring keeps the newest ops; updates of overwritten ones are dropped",
          "[flight_recorder]") {
  FlightRecorder recorder(3);
  std::vector<std::int64_t> ids;
  for (int i = 0; i < 5; ++i)
    ids.push_back(recorder.submitted(recorded_request("op" + std::to_string(i)), i));
  recorder.update(ids[0], OpPhase::Done);  // Its slot now holds op3.
  const std::vector<debug::OpRecord> ring = recorder.snapshot();
  REQUIRE(ring.size() == 3);
  CHECK(ring[0].name == "op2");
  CHECK(ring[0].sequence == 2);
  CHECK(ring[1].name == "op3");
  CHECK(ring[1].state == "submitted");
  CHECK(ring[2].name == "op4");
}

TEST_CASE("A batch finds its records out of order and across the ring's end", "[flight_recorder]") {
  // Ids 0-5 in 4 slots (a record's slot is its id modulo the capacity); the batch names ids 5
  // (slot 1), 2 (slot 2), then 3 and 4 (slots 3, then 0 across the end).
  FlightRecorder recorder(4);
  std::vector<std::int64_t> ids;
  for (int i = 0; i < 6; ++i)
    ids.push_back(recorder.submitted(recorded_request("op" + std::to_string(i)), i));
  recorder.list_negotiated(std::vector<std::int64_t>{ids[5], ids[2], ids[3], ids[4]}, same_id);
  const std::vector<std::size_t> all{0, 1, 2, 3};
  recorder.batch_begun(all);
  recorder.batch_executing("shm");
  recorder.batch_finished(OpPhase::Done);
  recorder.list_ended();
  for (int i = 2; i < 6; ++i) CHECK(state_of(recorder, "op" + std::to_string(i)) == "done");
  CHECK(state_of(recorder, "op0") == "absent");
  const std::vector<debug::OpRecord> ring = recorder.snapshot();
  REQUIRE(ring.size() == 4);
  for (int i = 0; i < 4; ++i) CHECK(ring[static_cast<std::size_t>(i)].sequence == i + 2);
}

// Note [Two lines a record]: names up to 40 bytes and shapes up to 3 dims live in the slot, the
// rest beside it. Each side of both limits, and a slot reused by an op of the other kind.
TEST_CASE(
    "Long names, many dims and errors are kept beside the ring, and a reused slot forgets them",
    "[flight_recorder]") {
  const std::string fits(40, 'n');
  const std::string beside = fits + "+";  // 41 bytes.
  const Shape three{2, 3, 4};
  const Shape five{1, 2, 3, 4, 5};
  FlightRecorder recorder(2);
  const std::int64_t a = recorder.submitted(recorded_request(beside, 0, five), 0);
  const std::int64_t b = recorder.submitted(recorded_request(fits, 0, three), 1);
  recorder.update(a, OpPhase::Failed, {}, "the first op's error");
  recorder.update(b, OpPhase::Done);
  std::vector<debug::OpRecord> ring = recorder.snapshot();
  REQUIRE(ring.size() == 2);
  CHECK(ring[0].name == beside);
  CHECK(ring[0].shape == five);
  CHECK(ring[0].state == "failed");
  CHECK(ring[1].name == fits);
  CHECK(ring[1].shape == three);
  CHECK(ring[1].state == "done");

  // The next two ops take the same slots the other way round: short over long, long over short.
  recorder.submitted(recorded_request("short", 0, {}), 2);
  recorder.submitted(recorded_request(beside + beside, 0, Shape{9, 8, 7, 6}), 3);
  ring = recorder.snapshot();
  REQUIRE(ring.size() == 2);
  CHECK(ring[0].name == "short");
  CHECK(ring[0].shape.empty());
  CHECK(ring[0].state == "submitted");
  CHECK(ring[1].name == beside + beside);
  CHECK(ring[1].shape == Shape{9, 8, 7, 6});

  // A dump: the reused slot carries no error, the failed op's message was written while it lived.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tutti_fr_beside_" + std::to_string(getpid()));
  FlightRecorder failing(1);
  failing.set_context({.job = "j", .rank = 0, .size = 1, .dir = dir.string()});
  const std::int64_t id = failing.submitted(recorded_request(beside, 0, five), 0);
  failing.update(id, OpPhase::Executing, "mpi");
  failing.update(id, OpPhase::Failed, {}, "peer \"gone\"");
  REQUIRE(failing.dump(failing.default_path(), "test").ok());
  const std::string text = file_text(failing.default_path());
  CHECK_THAT(text, Catch::Contains("\"name\": \"" + beside + "\""));
  CHECK_THAT(text, Catch::Contains("\"shape\": [1, 2, 3, 4, 5]"));
  CHECK_THAT(text, Catch::Contains("\"backend\": \"mpi\""));
  CHECK_THAT(text, Catch::Contains("\"error\": \"peer \\\"gone\\\"\""));
  failing.submitted(recorded_request("next", 0, {1}), 1);
  REQUIRE(failing.dump(failing.default_path(), "test").ok());
  const std::string after = file_text(failing.default_path());
  CHECK_THAT(after, Catch::Contains("\"name\": \"next\""));
  CHECK_THAT(after, Catch::Contains("\"backend\": \"\""));
  CHECK_THAT(after, Catch::Contains("\"error\": \"\""));
  std::filesystem::remove_all(dir);
}

TEST_CASE("Capacity 0 records nothing", "[flight_recorder]") {
  FlightRecorder recorder(0);
  CHECK_FALSE(recorder.enabled());
  CHECK(recorder.submitted(recorded_request("a"), 0) == -1);
  recorder.update(-1, OpPhase::Done);
  CHECK(recorder.snapshot().empty());
}

TEST_CASE("A dump names the job, the rank, the sets and every op", "[flight_recorder]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tutti_fr_test_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  FlightRecorder recorder(8);
  recorder.set_context({.job = "job-1", .rank = 2, .size = 4, .dir = dir.string()});
  recorder.set_process_sets({{0, {0, 1, 2, 3}}, {5, {1, 2}}});
  const std::int64_t id = recorder.submitted(recorded_request("grad \"fc1\"", 5, {3, 2}), 7);
  recorder.update(id, OpPhase::Executing, "shared memory");
  const std::string path = recorder.default_path();
  CHECK(path == (dir / "rank2.json").string());
  REQUIRE(recorder.dump(path, "SIGUSR1").ok());  // Creates the directory.
  const std::string text = file_text(path);
  CHECK_THAT(text, Catch::Contains("\"job\": \"job-1\""));
  CHECK_THAT(text, Catch::Contains("\"rank\": 2, \"size\": 4"));
  CHECK_THAT(text, Catch::Contains("\"reason\": \"SIGUSR1\""));
  CHECK_THAT(text, Catch::Contains("\"5\": [1, 2]"));
  CHECK_THAT(text, Catch::Contains("\"sequence\": 7,"));
  CHECK_THAT(text, Catch::Contains("\"name\": \"grad \\\"fc1\\\"\""));
  CHECK_THAT(text, Catch::Contains("\"shape\": [3, 2]"));
  CHECK_THAT(text, Catch::Contains("\"state\": \"executing\", \"backend\": \"shared memory\""));
  // Written through a temporary file that is gone afterwards.
  int files = 0;
  for ([[maybe_unused]] const auto& file : std::filesystem::directory_iterator(dir)) ++files;
  CHECK(files == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Dumps from several threads to one path each replace the file whole",
          "[flight_recorder]") {
  // A stall's dump, a signal's and the application's may run at once, all to rank<R>.json.
  // Before, they shared one temporary file: dumps failed ("rename: No such file or directory")
  // and the file read back empty or with an older dump's tail after its end.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tutti_fr_race_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "rank0.json").string();
  FlightRecorder recorder(64);
  for (int i = 0; i < 64; ++i) {  // Dumps of different lengths: names of different lengths.
    recorder.submitted(recorded_request(std::string(static_cast<std::size_t>(i), 'x')), i);
  }
  constexpr int kThreads = 3, kDumps = 150;
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string reason = t == 0 ? "a" : t == 1 ? "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" : "c";
      for (int i = 0; i < kDumps; ++i) {
        if (!recorder.dump(path, reason).ok()) ++failed;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(failed == 0);
  const std::string text = file_text(path);
  // Whole: one dump's text, ending where a dump ends, holding every op once.
  CHECK(text.size() > 1000);
  CHECK(text.ends_with("\n]}\n"));
  CHECK(text.find("\n]}\n") == text.size() - 4);
  CHECK(text.find("\"sequence\": 63,") != std::string::npos);
  int files = 0;  // No temporary file left behind.
  for ([[maybe_unused]] const auto& file : std::filesystem::directory_iterator(dir)) ++files;
  CHECK(files == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("A signal's dump goes beside the dump of an error, never over it", "[flight_recorder]") {
  // A stuck rank's "Stalled: ..." dump explains the job; the SIGTERM of the MPI_Abort that
  // follows must not replace it with one that says only "SIGTERM".
  FlightRecorder recorder(2);
  recorder.set_context({.job = "j", .rank = 3, .size = 4, .dir = "/d"});
  CHECK(recorder.signal_dump_path("SIGTERM") == "/d/rank3.json");  // No error yet.
  CHECK(recorder.error_dump_path() == "/d/rank3.json");
  CHECK(recorder.signal_dump_path("SIGTERM") == "/d/rank3.SIGTERM.json");
  CHECK(recorder.signal_dump_path("SIGUSR1") == "/d/rank3.SIGUSR1.json");
  CHECK(recorder.default_path() == "/d/rank3.json");  // dump_flight_recorder()'s, as API.md.
}

TEST_CASE("A dump that cannot be written says where and why", "[flight_recorder]") {
  FlightRecorder recorder(2);
  const Status status = recorder.dump("/proc/no/such/dir/rank0.json", "test");
  CHECK(status.code() == ErrorCode::InvalidArgument);
  CHECK_THAT(std::string(status.message()), Catch::Contains("/proc/no/such/dir/rank0.json"));
}

}  // namespace
}  // namespace tutti::core

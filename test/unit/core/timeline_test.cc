// SPDX-License-Identifier: Apache-2.0
// Timeline files: parsed by Python's json module (a real JSON parser), B/E balance checked per
// track, and the events compared with the expected ones written out.
#include "src/core/timeline.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::test {
namespace {

namespace fs = std::filesystem;

// Loads the trace, checks it (a list; pid 0; ts numeric and non-decreasing; B/E balanced on
// every track; instants thread-scoped), and prints each non-metadata event as one line
// [track name, phase, name, args] in JSON with sorted keys.
constexpr const char* kChecker = R"(import json, sys
events = json.load(open(sys.argv[1], encoding='utf-8'))
assert isinstance(events, list), 'not a JSON array'
names = {e['tid']: e['args']['name'] for e in events
         if e['ph'] == 'M' and e['name'] == 'thread_name'}
depth, last_ts, out = {}, 0.0, []
for e in events:
    assert e['pid'] == 0 and isinstance(e['ts'], (int, float)), e
    assert e['ts'] >= last_ts, ('ts goes back', e)
    last_ts = e['ts']
    if e['ph'] == 'M':
        continue
    tid = e['tid']
    depth[tid] = depth.get(tid, 0) + {'B': 1, 'E': -1}.get(e['ph'], 0)
    assert depth[tid] >= 0, ('E without B', names[tid])
    assert e['ph'] != 'i' or e['s'] == 't', e
    out.append(json.dumps([names[tid], e['ph'], e.get('name', ''), e.get('args', {})],
                          sort_keys=True))
assert all(d == 0 for d in depth.values()), ('unbalanced', depth)
open(sys.argv[2], 'w').write(''.join(line + '\n' for line in out))
)";

// A scratch directory, removed afterwards.
class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("tutti_timeline_" + std::to_string(getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The events of the trace at `path`, one line each (see kChecker); fails the test if the file
// is not valid JSON or its spans do not balance.
std::vector<std::string> events_of(const TempDir& dir, const std::string& path) {
  const std::string script = dir.file("check.py");
  const std::string out = dir.file("events.txt");
  const std::string err = dir.file("errors.txt");
  std::ofstream(script) << kChecker;
  const std::string command =
      "python3 '" + script + "' '" + path + "' '" + out + "' 2>'" + err + "'";
  const int rc = std::system(command.c_str());
  INFO("checker: " << read_all(err) << "file:\n" << read_all(path));
  REQUIRE(rc == 0);
  std::vector<std::string> lines;
  std::istringstream text(read_all(out));
  for (std::string line; std::getline(text, line);) lines.push_back(line);
  return lines;
}

TEST_CASE("the timeline records negotiation, op and activities per tensor", "[timeline]") {
  TempDir dir;
  const std::string path = dir.file("trace.json");
  core::Timeline timeline;
  REQUIRE(timeline.start(path, false).ok());
  CHECK(timeline.enabled());
  timeline.negotiate_start("grad.w", "ALLREDUCE");
  timeline.negotiate_rank_ready("grad.w", 1);
  timeline.negotiate_start("grad.b", "ALLREDUCE");
  timeline.negotiate_rank_ready("grad.w", 0);
  timeline.negotiate_end("grad.w");
  timeline.op_start("grad.w", "ALLREDUCE", "float32", "[2, 3]");
  timeline.activity_start("grad.w", "FUSION_PACK");
  timeline.activity_start("grad.w", "MPI_ALLREDUCE");  // Ends FUSION_PACK.
  timeline.activity_end("grad.w");
  timeline.activity_start("grad.w", "FUSION_UNPACK");
  timeline.op_end("grad.w", "OK");  // Ends FUSION_UNPACK too.
  timeline.mark_cycle();            // Not marking cycles: ignored.
  timeline.negotiate_end("unknown");
  timeline.activity_end("grad.b");  // No activity open: ignored.
  timeline.stop();
  CHECK_FALSE(timeline.enabled());

  const std::vector<std::string> expected = {
      R"(["grad.w", "B", "NEGOTIATE_ALLREDUCE", {}])",
      R"(["grad.w", "i", "rank 1", {"rank": 1}])",
      R"(["grad.b", "B", "NEGOTIATE_ALLREDUCE", {}])",
      R"(["grad.w", "i", "rank 0", {"rank": 0}])",
      R"(["grad.w", "E", "", {}])",
      R"(["grad.w", "B", "ALLREDUCE", {"dtype": "float32", "shape": "[2, 3]"}])",
      R"(["grad.w", "B", "FUSION_PACK", {}])",
      R"(["grad.w", "E", "", {}])",
      R"(["grad.w", "B", "MPI_ALLREDUCE", {}])",
      R"(["grad.w", "E", "", {}])",
      R"(["grad.w", "B", "FUSION_UNPACK", {}])",
      R"(["grad.w", "E", "", {}])",
      R"(["grad.w", "E", "", {"status": "OK"}])",
      R"(["grad.b", "E", "", {}])",  // stop() closed grad.b's negotiation.
  };
  CHECK(events_of(dir, path) == expected);
  const std::string text = read_all(path);
  CHECK(text.find(R"("name":"thread_name","args":{"name":"grad.w"})") != std::string::npos);
  CHECK(text.find(R"("tid":2,"name":"thread_name","args":{"name":"grad.b"})") != std::string::npos);
}

TEST_CASE("the timeline escapes names", "[timeline]") {
  TempDir dir;
  const std::string path = dir.file("trace.json");
  core::Timeline timeline;
  REQUIRE(timeline.start(path, false).ok());
  // Quote, backslash, newline, tab, a control byte, valid UTF-8 (é) and a stray byte.
  const std::string tensor = "we\"ird\\name\n\t\x01\xc3\xa9\xff";
  timeline.op_start(tensor, "ALL\"REDUCE", "float16", "[]");
  timeline.op_end(tensor, "Mismatch: \"x\" differs");
  timeline.stop();
  const std::vector<std::string> expected = {
      R"(["we\"ird\\name\n\t\u0001\u00e9\ufffd", "B", "ALL\"REDUCE", {"dtype": "float16", "shape": "[]"}])",
      R"(["we\"ird\\name\n\t\u0001\u00e9\ufffd", "E", "", {"status": "Mismatch: \"x\" differs"}])",
  };
  CHECK(events_of(dir, path) == expected);
}

TEST_CASE("the timeline starts again with a new file", "[timeline]") {
  TempDir dir;
  const std::string first = dir.file("first.json");
  const std::string second = dir.file("second.json");
  core::Timeline timeline;
  REQUIRE(timeline.start(first, false).ok());
  timeline.op_start("a", "BROADCAST", "int32", "[4]");
  timeline.activity_start("a", "MPI_BCAST");
  // Restarting stops the first file: its open spans are closed there.
  REQUIRE(timeline.start(second, true).ok());
  timeline.activity_end("a");  // Began in the first file: not in the second.
  timeline.op_end("a", "OK");
  timeline.mark_cycle();
  timeline.op_start("b", "ALLGATHER", "float64", "[1]");
  timeline.op_end("b", "OK");
  timeline.stop();

  CHECK(events_of(dir, first) ==
        std::vector<std::string>{
            R"(["a", "B", "BROADCAST", {"dtype": "int32", "shape": "[4]"}])",
            R"(["a", "B", "MPI_BCAST", {}])",
            R"(["a", "E", "", {}])",
            R"(["a", "E", "", {}])",
        });
  CHECK(events_of(dir, second) ==
        std::vector<std::string>{
            R"(["cycles", "i", "CYCLE_START", {}])",
            R"(["b", "B", "ALLGATHER", {"dtype": "float64", "shape": "[1]"}])",
            R"(["b", "E", "", {"status": "OK"}])",
        });
  // Track ids start again at 1 in the new file.
  CHECK(read_all(second).find(R"("tid":1,"name":"thread_name","args":{"name":"b"})") !=
        std::string::npos);
}

TEST_CASE("the timeline keeps events recorded by several threads at once", "[timeline]") {
  TempDir dir;
  const std::string path = dir.file("trace.json");
  core::Timeline timeline;
  REQUIRE(timeline.start(path, true).ok());
  constexpr int kThreads = 8;
  constexpr int kTensors = 300;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&timeline, t] {
      for (int i = 0; i < kTensors; ++i) {
        const std::string name = "t" + std::to_string(t) + "." + std::to_string(i);
        timeline.op_start(name, "ALLREDUCE", "float32", "[1]");
        timeline.activity_start(name, "MPI_ALLREDUCE");
        timeline.mark_cycle();
        timeline.op_end(name, "OK");
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  timeline.stop();
  // Each thread's events in its order; the threads' events interleave in any order.
  std::vector<std::string> expected;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kTensors; ++i) {
      const std::string track = "[\"t" + std::to_string(t) + "." + std::to_string(i) + "\", ";
      expected.push_back(track + R"("B", "ALLREDUCE", {"dtype": "float32", "shape": "[1]"}])");
      expected.push_back(track + R"("B", "MPI_ALLREDUCE", {}])");
      expected.push_back(R"(["cycles", "i", "CYCLE_START", {}])");
      expected.push_back(track + R"("E", "", {}])");
      expected.push_back(track + R"("E", "", {"status": "OK"}])");
    }
  }
  std::vector<std::string> events = events_of(dir, path);
  std::sort(events.begin(), events.end());
  std::sort(expected.begin(), expected.end());
  CHECK(events == expected);
}

TEST_CASE("the timeline stays valid when restarted while threads record", "[timeline]") {
  TempDir dir;
  core::Timeline timeline;
  std::atomic<bool> done{false};
  std::atomic<int> iterations{0};  // Finished by all threads together.
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&timeline, &done, &iterations, t] {
      // Spans cut by a restart: their B in one file, their E dropped or in the next one.
      for (int i = 0; !done.load(); ++i) {
        const std::string name = "t" + std::to_string(t) + "." + std::to_string(i % 50);
        timeline.negotiate_start(name, "ALLREDUCE");
        timeline.negotiate_rank_ready(name, t);
        timeline.negotiate_end(name);
        timeline.op_start(name, "ALLREDUCE", "float32", "[1]");
        timeline.activity_start(name, "MPI_ALLREDUCE");
        timeline.op_end(name, "OK");
        iterations.fetch_add(1);
      }
    });
  }
  std::vector<std::string> paths;
  for (int round = 0; round < 5; ++round) {
    paths.push_back(dir.file("trace" + std::to_string(round) + ".json"));
    REQUIRE(timeline.start(paths.back(), round % 2 == 0).ok());
    // At least 20 ms, and until some thread has run a whole iteration inside this round: after
    // kThreads + 1 more, one thread finished two, the second begun after start() returned. A
    // fixed 20 ms alone let a loaded machine (the ASan build beside the other builds) record
    // nothing in a round.
    const int before = iterations.load();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    while (iterations.load() < before + kThreads + 1 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  timeline.stop();
  done.store(true);
  for (std::thread& thread : threads) thread.join();
  for (const std::string& path : paths) {
    INFO(path);
    CHECK_FALSE(events_of(dir, path).empty());  // Valid, balanced, and recorded something.
  }
}

TEST_CASE("the timeline's stop is harmless when not started or repeated", "[timeline]") {
  TempDir dir;
  core::Timeline timeline;
  timeline.stop();
  timeline.op_start("x", "ALLREDUCE", "float32", "[1]");  // Not started: ignored.
  timeline.mark_cycle();
  CHECK_FALSE(timeline.enabled());

  const std::string path = dir.file("trace.json");
  REQUIRE(timeline.start(path, false).ok());
  timeline.stop();
  timeline.stop();
  timeline.op_end("x", "OK");
  CHECK(events_of(dir, path).empty());
  const std::string text = read_all(path);
  CHECK(text.rfind("[\n{\"ph\":\"M\",", 0) == 0);
  CHECK(text.find(R"("name":"process_name","args":{"name":"tutti"}})") != std::string::npos);
  CHECK(text.ends_with("}\n]\n"));
}

TEST_CASE("the timeline's destructor leaves a complete file", "[timeline]") {
  TempDir dir;
  const std::string path = dir.file("trace.json");
  {
    core::Timeline timeline;
    REQUIRE(timeline.start(path, false).ok());
    timeline.negotiate_start("late", "ALLREDUCE");
  }
  CHECK(events_of(dir, path) == std::vector<std::string>{
                                    R"(["late", "B", "NEGOTIATE_ALLREDUCE", {}])",
                                    R"(["late", "E", "", {}])",
                                });
}

TEST_CASE("the timeline refuses a path it cannot open", "[timeline]") {
  core::Timeline timeline;
  const Status status = timeline.start("/nonexistent-tutti-dir/trace.json", false);
  CHECK(status.code() == ErrorCode::InvalidArgument);
  CHECK(status.message() ==
        "cannot open timeline file '/nonexistent-tutti-dir/trace.json': No such file or directory");
  CHECK_FALSE(timeline.enabled());
  timeline.op_start("x", "ALLREDUCE", "float32", "[1]");
  timeline.stop();
}

}  // namespace
}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// The timeline: rank 0 writes a Chrome-trace file that is valid JSON after stop_timeline() and
// at shutdown, with a negotiation span per tensor, an instant per rank's arrival, and the op
// span with its activities. Checked with Python's json module (a real parser).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Exit status of a Python check that `path` parses as a JSON list of trace events and that
// every name in `names` occurs as an event or track name.
int check_json(const std::string& path, const std::vector<std::string>& names) {
  // Event names, plus track names (a tensor's track is named by thread_name metadata).
  std::string script =
      "import json,sys; e=json.load(open(sys.argv[1])); "
      "n={x.get('name') for x in e} | {x.get('args',{}).get('name') for x in e}; "
      "sys.exit(0 if all(a in n for a in sys.argv[2:]) else 3)";
  std::string command = "python3 -c \"" + script + "\" " + path;
  for (const std::string& name : names) command += " '" + name + "'";
  return std::system(command.c_str());
}

TEST_CASE("start_timeline writes valid JSON naming tensors, ranks and activities", "[timeline]") {
  init();
  const std::string path = "/tmp/tutti_timeline_test_" + std::to_string(getppid()) + ".json";
  start_timeline(path, true);
  std::vector<float> a(1000, 1.0f), b(3, 1.0f);
  allreduce(TensorView(a.data(), {1000}), "grad.big");
  allreduce(TensorView(b.data(), {3}), "grad.small");
  broadcast(TensorView(b.data(), {3}), 0, "weights");
  stop_timeline();
  MPI_Barrier(MPI_COMM_WORLD);
  bool ok = true;
  std::string contents;
  if (world_rank() == 0) {
    std::vector<std::string> names = {"grad.big",  "grad.small", "NEGOTIATE_ALLREDUCE",
                                      "ALLREDUCE", "BROADCAST",  "rank 0"};
    if (world_size() > 1) names.push_back("rank " + std::to_string(world_size() - 1));
    ok = check_json(path, names) == 0;
    contents = read_file(path);
    std::remove(path.c_str());
  }
  INFO(contents.substr(0, 2000));
  CHECK(all_ranks(ok));
  shutdown();
}

TEST_CASE("start_timeline has one outcome on every rank", "[timeline]") {
  // Before, only rank 0 failed for a path it cannot open, though the call is collective.
  init();
  std::string message;
  const std::optional<ErrorCode> code =
      error_of([] { start_timeline("/nonexistent/dir/t.json"); }, &message);
  CHECK(all_ranks(code == ErrorCode::InvalidArgument));
  CHECK(message.find("/nonexistent/dir/t.json") != std::string::npos);
  // The runtime still works, and a good path still starts.
  std::vector<float> v(3, 1.0f);
  allreduce(TensorView(v.data(), {3}), "after.bad.timeline", {.op = ReduceOp::Sum});
  CHECK(v[0] == static_cast<float>(size()));
  const std::string path = "/tmp/tutti_timeline_again_" + std::to_string(getppid()) + ".json";
  start_timeline(path);
  stop_timeline();
  if (world_rank() == 0) std::remove(path.c_str());
  shutdown();
}

TEST_CASE("TUTTI_TIMELINE records from init and is complete after shutdown", "[timeline]") {
  const std::string path = "/tmp/tutti_timeline_env_" + std::to_string(getppid()) + ".json";
  setenv("TUTTI_TIMELINE", path.c_str(), 1);
  init();
  std::vector<double> v(10, 2.0);
  allreduce(TensorView(v.data(), {10}), "env.tensor", {.op = ReduceOp::Sum});
  shutdown();
  unsetenv("TUTTI_TIMELINE");
  MPI_Barrier(MPI_COMM_WORLD);
  bool ok = true;
  if (world_rank() == 0) {
    ok = check_json(path, {"env.tensor", "NEGOTIATE_ALLREDUCE"}) == 0;
    std::remove(path.c_str());
  }
  CHECK(all_ranks(ok));
}

// One session of TUTTI_TIMELINE=path: init, an allreduce of `tensor`, shutdown.
void env_timeline_session(const std::string& path, const std::string& tensor) {
  setenv("TUTTI_TIMELINE", path.c_str(), 1);
  init();
  std::vector<double> v(10, 2.0);
  allreduce(TensorView(v.data(), {10}), tensor, {.op = ReduceOp::Sum});
  shutdown();
  unsetenv("TUTTI_TIMELINE");
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("TUTTI_TIMELINE goes on across init() after shutdown(), one pid per session",
          "[timeline]") {
  // Before, the second init() truncated the file: the first session's trace was lost.
  const std::string path = "/tmp/tutti_timeline_sessions_" + std::to_string(getppid()) + ".json";
  env_timeline_session(path, "first.session");
  env_timeline_session(path, "second.session");
  bool ok = true;
  if (world_rank() == 0) {
    // Valid JSON; each tensor's events under its session's pid (0, then 1, named "tutti
    // session 2"); the second session's events after the first's on one clock.
    const std::string script =
        "import json,sys; e=json.load(open(sys.argv[1])); "
        "pid=lambda t: {x['pid'] for x in e if x.get('args',{}).get('name')==t}; "
        "ts=lambda p: [x['ts'] for x in e if x['pid']==p and x['ph']!='M']; "
        "names={x['args']['name'] for x in e if x.get('name')=='process_name'}; "
        "sys.exit(0 if pid('first.session')=={0} and pid('second.session')=={1} "
        "and names=={'tutti','tutti session 2'} and max(ts(0))<=min(ts(1)) else 3)";
    ok = std::system(("python3 -c \"" + script + "\" " + path).c_str()) == 0;
    INFO(read_file(path).substr(0, 3000));
    CHECK(ok);
    // A file someone else rewrote since is not continued: the next session starts it afresh.
    std::ofstream(path) << "not a timeline";
  }
  env_timeline_session(path, "third.session");
  if (world_rank() == 0) {
    ok = check_json(path, {"third.session"}) == 0 &&
         read_file(path).find("not a timeline") == std::string::npos;
    std::remove(path.c_str());
  }
  CHECK(all_ranks(ok));
}

}  // namespace
}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// Usage: fault_program MODE   (under mpirun with 3 ranks, TUTTI_FLIGHT_RECORDER_DIR set)
// A training loop's gradient allreduces, three per step ('grad.a' [4], 'grad.b' [8],
// 'grad.c' [2], submitted together and then waited for), with a fault on rank 1 in step 2:
//   skip    rank 1 skips 'grad.b' (its 'grad.c' takes that sequence number) and then spends
//           6 s in "evaluation" before it shuts down: a stall (under TUTTI_DEBUG=DETAIL, a
//           desync that stops the job at once)
//   stuck   rank 1 sleeps in "user code" before step 2 until the stall shutdown has passed
//   shape   rank 1 submits 'grad.b' of step 1 with shape [9]: Mismatch, no stall; every rank
//           then dumps with tutti::debug::dump_flight_recorder() and goes on
//   kill    rank 1 kills itself (SIGKILL) after submitting step 2's 'grad.a'
//   throw   rank 0 throws an exception nobody catches after submitting step 2's 'grad.a':
//           std::terminate() (Note [An uncaught exception leaves its traces])
//   usr1    no fault: rank 0 prints "ready" after step 2, and every rank trains until its
//           own dump appears (the test sends SIGUSR1 to mpirun), at most 30 s
// The stall modes need TUTTI_STALL_SHUTDOWN_TIME_SECONDS (the test sets 2). Prints
// "rank R: <error>" for an op that failed; exits 0 unless the mode's own check failed (4).
#include <tutti/debug.h>
#include <tutti/tutti.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Gradients {
  std::vector<float> a = std::vector<float>(4, 1.0f);
  std::vector<float> b = std::vector<float>(8, 1.0f);
  std::vector<float> c = std::vector<float>(2, 1.0f);
};

tutti::TensorView view(std::vector<float>& data, std::int64_t rows) {
  return tutti::TensorView(data.data(), {rows});
}

// One step's allreduces; `skip_b` leaves 'grad.b' out, `b_rows` is its shape.
void step(Gradients& g, bool skip_b, std::int64_t b_rows) {
  std::vector<tutti::Handle> handles;
  handles.push_back(tutti::allreduce_async(view(g.a, 4), "grad.a"));
  if (!skip_b) handles.push_back(tutti::allreduce_async(view(g.b, b_rows), "grad.b"));
  handles.push_back(tutti::allreduce_async(view(g.c, 2), "grad.c"));
  for (tutti::Handle& h : handles) {
    try {
      h.wait();
    } catch (const tutti::Error& e) {
      std::printf("rank %d: %s\n", tutti::rank(), e.what());
      std::fflush(stdout);
    }
  }
}

bool own_dump_exists() {
  const char* dir = std::getenv("TUTTI_FLIGHT_RECORDER_DIR");
  return dir != nullptr && std::filesystem::exists(std::string(dir) + "/rank" +
                                                   std::to_string(tutti::rank()) + ".json");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  tutti::init();
  // Rank 0 for "throw", the timeline's writer, whose file must be whole after all.
  const bool faulty = tutti::rank() == (mode == "throw" ? 0 : 1);
  Gradients g;
  int status = 0;
  try {
    for (int s = 0; s < 3; ++s) {
      if (s == 2 && faulty && mode == "stuck") std::this_thread::sleep_for(std::chrono::seconds(6));
      if (s == 2 && faulty && mode == "kill") {
        tutti::Handle h = tutti::allreduce_async(view(g.a, 4), "grad.a");
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        raise(SIGKILL);
      }
      if (s == 2 && faulty && mode == "throw") {
        tutti::Handle h = tutti::allreduce_async(view(g.a, 4), "grad.a");
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        throw std::runtime_error("boom in user code");  // Not a tutti::Error: nobody catches it.
      }
      step(g, s == 2 && faulty && mode == "skip", s == 1 && faulty && mode == "shape" ? 9 : 8);
    }
    if (mode == "skip" && faulty) std::this_thread::sleep_for(std::chrono::seconds(6));
    if (mode == "shape") tutti::debug::dump_flight_recorder();
    if (mode == "usr1") {
      if (tutti::rank() == 0) {
        std::printf("ready\n");
        std::fflush(stdout);
      }
      // Until every rank has its dump: the ranks decide together (a minimum over them), so
      // that all run the same number of steps.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      for (std::vector<float> all_dumped{0.0f}; all_dumped[0] == 0.0f;) {
        step(g, false, 8);
        const bool late = std::chrono::steady_clock::now() > deadline;
        all_dumped[0] = own_dump_exists() || late ? 1.0f : 0.0f;
        tutti::allreduce(view(all_dumped, 1), "all_dumped", {.op = tutti::ReduceOp::Min});
      }
      if (!own_dump_exists()) {
        std::printf("rank %d: no dump within 30 s of SIGUSR1\n", tutti::rank());
        status = 4;
      }
      step(g, false, 8);  // The job goes on after a dump.
    }
  } catch (const tutti::Error& e) {
    std::printf("rank %d: %s\n", tutti::rank(), e.what());
  }
  tutti::shutdown();
  return status;
}

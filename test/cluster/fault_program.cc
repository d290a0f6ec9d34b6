// SPDX-License-Identifier: Apache-2.0
// Usage: fault_program SECONDS
// A training loop's communication, for the fault tests: every rank allreduces a 1 MiB
// gradient over and over for SECONDS, rank 0 printing "step N" every 20 steps. A rank whose
// op fails prints "rank R on HOST: tutti error: ..." and exits 3 (a surviving rank that got
// an error); a run that is not interrupted exits 0.
#include <tutti/tutti.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 60.0;
  tutti::init();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::vector<float> grad(256 * 1024, 1.0f);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  try {
    for (int step = 0; std::chrono::steady_clock::now() < end; ++step) {
      tutti::allreduce(tutti::TensorView(grad.data(), {static_cast<std::int64_t>(grad.size())}),
                       "grad");
      if (tutti::rank() == 0 && step % 20 == 0) {
        std::printf("step %d\n", step);
        std::fflush(stdout);
      }
    }
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "rank %d on %s: tutti error: %s\n", tutti::rank(), host, e.what());
    return 3;
  }
  tutti::shutdown();
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// Device fusion speed without MPI: the figures of allreduce_benchmark --device cuda's D2 on one
// chosen device (fusion_kernel_figures.h: Tutti's batched copy kernel packing and unpacking
// ResNet-50's 161 gradients, plain, scaled, float16 and bfloat16 <-> float32, against
// cudaMemcpyAsync D2D of the same bytes; target >= 0.9x the one-call memcpy).
// Usage: cuda_fusion_benchmark [--grads FILE] [--repeats N] [--device I]
//   --grads FILE  another gradient list, one element count per line (default: the built-in
//                 ResNet-50 list, examples/grad_list.h, so it runs from anywhere)
// Its first line is the machine's (examples/machine_line.h; "mpi=none": one process, no MPI),
// then the device's. Exits 77 with "no CUDA device" when there is none, 1 if a CUDA call fails
// or the kernel's round trip changes a tensor.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "examples/fusion_kernel_figures.h"
#include "examples/grad_list.h"
#include "examples/machine_line.h"
#include "ops/device_ops.h"

int main(int argc, char** argv) {
  std::string grads_path;  // Empty: the built-in ResNet-50 list (examples/grad_list.h).
  int repeats = 50;
  int device_index = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--grads" && i + 1 < argc) {
      grads_path = argv[++i];
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--device" && i + 1 < argc) {
      device_index = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--grads FILE] [--repeats N] [--device I]\n", argv[0]);
      return 2;
    }
  }
  if (device_index < 0 || tutti::ops::device_ops().device_count() <= device_index) {
    std::printf("no CUDA device: skipping\n");
    return 77;
  }
  std::printf("%s\n", tutti::examples::machine_line_alone().c_str());
  std::vector<std::size_t> counts;
  for (std::int64_t n : tutti::examples::grads_or_default(grads_path))
    counts.push_back(static_cast<std::size_t>(n));
  try {
    tutti::examples::print_fusion_kernel_figures(
        tutti::examples::measure_fusion_kernel(counts, device_index, repeats));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

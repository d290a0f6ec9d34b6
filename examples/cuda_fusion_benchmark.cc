// SPDX-License-Identifier: Apache-2.0
// Device fusion speed: Tutti's batched copy kernel packing ResNet-50's 161 gradients into one
// fused buffer and unpacking them (plain, scaled by 1/2, and float16 <-> float32 with scaling),
// against cudaMemcpyAsync device-to-device of the same bytes (one call, and one per tensor),
// measured in the same run. Target: pack and unpack at >= 0.8x the one-call memcpy.
// Usage: cuda_fusion_benchmark [--grads FILE] [--repeats N] [--device I]
// Exits 77 with "no CUDA device" when there is none. Not a client of the public API only: it
// drives ops::DeviceOps (the seam core uses) directly, to time the kernel alone.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "ops/device_ops.h"
#include "src/common/status.h"

namespace {

using Clock = std::chrono::steady_clock;
using tutti::DataType;
using tutti::ops::CopySpec;

void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(code));
    std::exit(1);
  }
}

void check(const tutti::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, std::string(status.message()).c_str());
    std::exit(1);
  }
}

std::vector<std::size_t> read_grads(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot open %s (use --grads FILE)\n", path.c_str());
    std::exit(2);
  }
  std::vector<std::size_t> counts;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    counts.push_back(std::stoull(line));
  }
  return counts;
}

// Seconds per run of `enqueue` (which only enqueues), after warm-up, including the host's
// launch cost: each repeat is what a fusion cycle pays.
double seconds_per_run(const std::function<void()>& enqueue, const std::function<void()>& wait,
                       int repeats) {
  for (int i = 0; i < 3; ++i) enqueue();
  wait();
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < repeats; ++i) enqueue();
  wait();
  return std::chrono::duration<double>(Clock::now() - start).count() / repeats;
}

// Tensors laid out in one allocation at 256-byte aligned offsets (as cudaMalloc would place
// them), and a fused buffer with 16-byte aligned offsets (as core packs).
struct Layout {
  std::vector<std::size_t> tensor_offsets;  // Bytes.
  std::vector<std::size_t> fused_offsets;   // Bytes.
  std::size_t tensor_bytes = 0;
  std::size_t fused_bytes = 0;
};

Layout layout(const std::vector<std::size_t>& counts, std::size_t element, std::size_t wire) {
  Layout l;
  for (std::size_t n : counts) {
    l.tensor_offsets.push_back(l.tensor_bytes);
    l.tensor_bytes += (n * element + 255) / 256 * 256;
    l.fused_offsets.push_back(l.fused_bytes);
    l.fused_bytes += (n * wire + 15) / 16 * 16;
  }
  return l;
}

std::vector<CopySpec> copies(const std::vector<std::size_t>& counts, const Layout& l,
                             std::byte* tensors, DataType tensor_type, std::byte* fused,
                             DataType fused_type, bool pack, double factor) {
  std::vector<CopySpec> out;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    std::byte* tensor = tensors + l.tensor_offsets[t];
    std::byte* slot = fused + l.fused_offsets[t];
    out.push_back(CopySpec{.destination = pack ? slot : tensor,
                           .destination_type = pack ? fused_type : tensor_type,
                           .source = pack ? tensor : slot,
                           .source_type = pack ? tensor_type : fused_type,
                           .count = counts[t],
                           .factor = factor});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string grads_path = "../shared/bench/resnet50_grads.txt";
  int repeats = 50;
  int device_index = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--grads" && i + 1 < argc) {
      grads_path = argv[++i];
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else if (arg == "--device" && i + 1 < argc) {
      device_index = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--grads FILE] [--repeats N] [--device I]\n", argv[0]);
      return 2;
    }
  }
  tutti::ops::DeviceOps& device = tutti::ops::device_ops();
  if (device.device_count() <= device_index) {
    std::printf("no CUDA device: skipping\n");
    return 77;
  }
  const std::vector<std::size_t> counts = read_grads(grads_path);
  check(cudaSetDevice(device_index), "cudaSetDevice");
  const tutti::ops::DeviceStream stream{tutti::Device::cuda(device_index), 0};
  cudaStream_t reference = nullptr;
  check(cudaStreamCreateWithFlags(&reference, cudaStreamNonBlocking), "cudaStreamCreate");

  const Layout f32 = layout(counts, 4, 4);
  const Layout f16 = layout(counts, 2, 4);
  std::size_t elements = 0;
  for (std::size_t n : counts) elements += n;
  const double bytes = static_cast<double>(elements) * 4;
  auto allocate = [&](std::size_t n) {
    tutti::Result<std::shared_ptr<void>> memory = device.allocate(n, stream.device);
    check(memory.status(), "allocate");
    check(cudaMemset(memory.value().get(), 0, n), "cudaMemset");
    return std::move(memory).value();
  };
  const std::shared_ptr<void> tensors32 = allocate(f32.tensor_bytes);
  const std::shared_ptr<void> tensors16 = allocate(f16.tensor_bytes);
  const std::shared_ptr<void> fused = allocate(f32.fused_bytes);
  auto* t32 = static_cast<std::byte*>(tensors32.get());
  auto* t16 = static_cast<std::byte*>(tensors16.get());
  auto* buffer = static_cast<std::byte*>(fused.get());

  auto wait_kernel = [&] { check(device.synchronize(stream), "synchronize"); };
  auto wait_reference = [&] { check(cudaStreamSynchronize(reference), "cudaStreamSynchronize"); };
  auto kernel = [&](const std::vector<CopySpec>& specs) {
    return seconds_per_run([&] { check(device.batched_copy(specs, stream), "batched_copy"); },
                           wait_kernel, repeats);
  };

  const double memcpy_one = seconds_per_run(
      [&] {
        check(cudaMemcpyAsync(buffer, t32, elements * 4, cudaMemcpyDeviceToDevice, reference),
              "cudaMemcpyAsync");
      },
      wait_reference, repeats);
  const double memcpy_each = seconds_per_run(
      [&] {
        for (std::size_t t = 0; t < counts.size(); ++t) {
          check(cudaMemcpyAsync(buffer + f32.fused_offsets[t], t32 + f32.tensor_offsets[t],
                                counts[t] * 4, cudaMemcpyDeviceToDevice, reference),
                "cudaMemcpyAsync");
        }
      },
      wait_reference, repeats);

  struct Row {
    const char* name;
    double seconds;
    double bytes;  // Bytes written (float32 side for conversions).
  };
  const std::vector<Row> rows = {
      {"cudaMemcpyAsync D2D, one call", memcpy_one, bytes},
      {"cudaMemcpyAsync D2D, one per tensor", memcpy_each, bytes},
      {"kernel pack float32",
       kernel(copies(counts, f32, t32, DataType::Float32, buffer, DataType::Float32, true, 1.0)),
       bytes},
      {"kernel unpack float32",
       kernel(copies(counts, f32, t32, DataType::Float32, buffer, DataType::Float32, false, 1.0)),
       bytes},
      {"kernel unpack float32 x 1/2",
       kernel(copies(counts, f32, t32, DataType::Float32, buffer, DataType::Float32, false, 0.5)),
       bytes},
      {"kernel pack float16->float32 x 1/2",
       kernel(copies(counts, f16, t16, DataType::Float16, buffer, DataType::Float32, true, 0.5)),
       bytes},
      {"kernel unpack float32->float16 x 1/2",
       kernel(copies(counts, f16, t16, DataType::Float16, buffer, DataType::Float32, false, 0.5)),
       bytes},
  };

  // The figures mean nothing if the kernel is wrong: a round trip must give the input back.
  std::vector<float> pattern(f32.tensor_bytes / 4);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<float>(i % 1021);
  check(cudaMemcpy(t32, pattern.data(), f32.tensor_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(device.batched_copy(
            copies(counts, f32, t32, DataType::Float32, buffer, DataType::Float32, true, 2.0),
            stream),
        "batched_copy");
  check(device.batched_copy(
            copies(counts, f32, t32, DataType::Float32, buffer, DataType::Float32, false, 0.5),
            stream),
        "batched_copy");
  wait_kernel();
  std::vector<float> back(pattern.size());
  check(cudaMemcpy(back.data(), t32, f32.tensor_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const std::size_t first = f32.tensor_offsets[t] / 4;
    if (std::memcmp(back.data() + first, pattern.data() + first, counts[t] * 4) != 0) {
      std::fprintf(stderr, "round trip through the fused buffer changed tensor %zu\n", t);
      return 1;
    }
  }

  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device_index), "cudaGetDeviceProperties");
  std::printf("device fusion on %s: %zu tensors, %zu floats (%.1f MB), %d repeats\n",
              properties.name, counts.size(), elements, bytes / 1e6, repeats);
  std::printf("%-40s %10s %10s %14s\n", "", "ms", "GB/s", "vs memcpy");
  for (const Row& row : rows) {
    std::printf("%-40s %10.3f %10.1f %13.2fx\n", row.name, row.seconds * 1e3,
                row.bytes / row.seconds / 1e9, memcpy_one / row.seconds);
  }
  std::printf(
      "(GB/s: float32 bytes per second, each read once and written once; target for "
      "pack/unpack: >= 0.80x the one-call memcpy)\n");
  check(cudaStreamDestroy(reference), "cudaStreamDestroy");
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// The fusion kernel's figures: see fusion_kernel_figures.h.
#include "examples/fusion_kernel_figures.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "examples/cuda_check.h"
#include "ops/device_ops.h"
#include "src/common/status.h"

namespace tutti::examples {
namespace {

using Clock = std::chrono::steady_clock;
using ops::CopySpec;

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

// The reference copies' own non-blocking stream, destroyed on every way out.
struct StreamDeleter {
  void operator()(cudaStream_t stream) const {
    static_cast<void>(cudaStreamDestroy(stream));  // Nothing to report from a destructor.
  }
};
using OwnedStream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;

OwnedStream create_stream() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return OwnedStream(stream);
}

// Packs with x2 and unpacks with x1/2 (both exact on the pattern's small integers) and throws
// unless every tensor comes back bit for bit.
void check_round_trip(ops::DeviceOps& device, ops::DeviceStream stream,
                      const std::vector<std::size_t>& counts, const Layout& f32, std::byte* t32,
                      std::byte* fused) {
  std::vector<float> pattern(f32.tensor_bytes / 4);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<float>(i % 1021);
  check(cudaMemcpy(t32, pattern.data(), f32.tensor_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  // From pageable memory, cudaMemcpy may return before the data lands, and the kernel's
  // non-blocking stream does not wait for the legacy default stream.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(
      device.batched_copy(
          copies(counts, f32, t32, DataType::Float32, fused, DataType::Float32, true, 2.0), stream),
      "batched_copy");
  check(device.batched_copy(
            copies(counts, f32, t32, DataType::Float32, fused, DataType::Float32, false, 0.5),
            stream),
        "batched_copy");
  check(device.synchronize(stream), "synchronize");
  std::vector<float> back(pattern.size());
  check(cudaMemcpy(back.data(), t32, f32.tensor_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const std::size_t first = f32.tensor_offsets[t] / 4;
    if (std::memcmp(back.data() + first, pattern.data() + first, counts[t] * 4) != 0) {
      throw std::runtime_error("round trip through the fused buffer changed tensor " +
                               std::to_string(t));
    }
  }
}

}  // namespace

FusionKernelFigures measure_fusion_kernel(const std::vector<std::size_t>& counts, int device_index,
                                          int repeats) {
  ops::DeviceOps& device = ops::device_ops();
  check(cudaSetDevice(device_index), "cudaSetDevice");
  const ops::DeviceStream stream{Device::cuda(device_index), 0};
  const OwnedStream reference = create_stream();

  const Layout f32 = layout(counts, 4, 4);
  const Layout f16 = layout(counts, 2, 4);
  std::size_t elements = 0;
  for (std::size_t n : counts) elements += n;
  const double bytes = static_cast<double>(elements) * 4;
  auto allocate = [&](std::size_t n) {
    Result<std::shared_ptr<void>> memory = device.allocate(n, stream.device);
    check(memory.status(), "allocate");
    check(cudaMemset(memory.value().get(), 0, n), "cudaMemset");
    return std::move(memory).value();
  };
  const std::shared_ptr<void> tensors32 = allocate(f32.tensor_bytes);
  const std::shared_ptr<void> tensors16 = allocate(f16.tensor_bytes);
  const std::shared_ptr<void> fused = allocate(f32.fused_bytes);
  // cudaMemset runs on the legacy default stream, which the non-blocking streams below do not
  // wait for: finish it before timing.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  auto* t32 = static_cast<std::byte*>(tensors32.get());
  auto* t16 = static_cast<std::byte*>(tensors16.get());
  auto* buffer = static_cast<std::byte*>(fused.get());

  auto wait_kernel = [&] { check(device.synchronize(stream), "synchronize"); };
  auto wait_reference = [&] {
    check(cudaStreamSynchronize(reference.get()), "cudaStreamSynchronize");
  };
  auto kernel = [&](const std::vector<CopySpec>& specs) {
    return seconds_per_run([&] { check(device.batched_copy(specs, stream), "batched_copy"); },
                           wait_kernel, repeats);
  };

  const double memcpy_one = seconds_per_run(
      [&] {
        check(cudaMemcpyAsync(buffer, t32, elements * 4, cudaMemcpyDeviceToDevice, reference.get()),
              "cudaMemcpyAsync");
      },
      wait_reference, repeats);
  const double memcpy_each = seconds_per_run(
      [&] {
        for (std::size_t t = 0; t < counts.size(); ++t) {
          check(cudaMemcpyAsync(buffer + f32.fused_offsets[t], t32 + f32.tensor_offsets[t],
                                counts[t] * 4, cudaMemcpyDeviceToDevice, reference.get()),
                "cudaMemcpyAsync");
        }
      },
      wait_reference, repeats);

  FusionKernelFigures figures;
  figures.device = device_index;
  figures.tensors = counts.size();
  figures.elements = elements;
  figures.repeats = repeats;
  figures.memcpy_seconds = memcpy_one;
  auto row = [&](const char* name, double seconds) {
    figures.rows.push_back(KernelFigure{.name = name, .seconds = seconds, .bytes = bytes});
  };
  using enum DataType;
  row("cudaMemcpyAsync D2D, one call", memcpy_one);
  row("cudaMemcpyAsync D2D, one per tensor", memcpy_each);
  row("kernel pack float32", kernel(copies(counts, f32, t32, Float32, buffer, Float32, true, 1.0)));
  row("kernel unpack float32",
      kernel(copies(counts, f32, t32, Float32, buffer, Float32, false, 1.0)));
  row("kernel unpack float32 x 1/2",
      kernel(copies(counts, f32, t32, Float32, buffer, Float32, false, 0.5)));
  row("kernel pack float16->float32 x 1/2",
      kernel(copies(counts, f16, t16, Float16, buffer, Float32, true, 0.5)));
  row("kernel unpack float32->float16 x 1/2",
      kernel(copies(counts, f16, t16, Float16, buffer, Float32, false, 0.5)));
  row("kernel pack bfloat16->float32 x 1/2",
      kernel(copies(counts, f16, t16, BFloat16, buffer, Float32, true, 0.5)));
  row("kernel unpack float32->bfloat16 x 1/2",
      kernel(copies(counts, f16, t16, BFloat16, buffer, Float32, false, 0.5)));

  check_round_trip(device, stream, counts, f32, t32, buffer);
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device_index), "cudaGetDeviceProperties");
  figures.device_name = properties.name;
  return figures;
}

void print_fusion_kernel_figures(const FusionKernelFigures& figures) {
  std::printf("device fusion on cuda:%d (%s): %zu tensors, %zu floats (%.1f MB), %d repeats\n",
              figures.device, figures.device_name.c_str(), figures.tensors, figures.elements,
              static_cast<double>(figures.elements) * 4 / 1e6, figures.repeats);
  std::printf("%-40s %10s %10s %14s\n", "", "ms", "GB/s", "vs memcpy");
  for (const KernelFigure& row : figures.rows) {
    std::printf("%-40s %10.3f %10.1f %13.2fx\n", row.name.c_str(), row.seconds * 1e3,
                row.bytes / row.seconds / 1e9, figures.memcpy_seconds / row.seconds);
  }
  std::printf(
      "(GB/s: float32 bytes per second, each read once and written once; target for "
      "pack/unpack, plain and converting: >= 0.90x the one-call memcpy)\n");
}

}  // namespace tutti::examples

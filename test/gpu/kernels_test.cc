// SPDX-License-Identifier: Apache-2.0
// The batched copy-and-scale kernel against ops::cpu::convert_scale (the CPU reference) for
// every dtype pair, odd sizes, misaligned offsets and scale factors, in one launch; and the
// CUDA DeviceOps: allocation, copies, events, errors for devices that do not exist.
#include "ops/cuda/kernels.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include "ops/convert.h"
#include "ops/cuda/device_ops.h"
#include "ops/device_ops.h"
#include "test/gpu/gpu_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

using ops::CopySpec;
using ops::DeviceStream;

constexpr std::byte kGuard{0xab};  // Fills destinations, so stray writes show.

// Source values mixing small integers, fractions, negatives and values that saturate the
// narrow types (and overflow float16 to infinity); no NaN, so results compare bit for bit.
double source_value(std::size_t k) {
  const double i = static_cast<double>(k % 1000);
  switch (k % 7) {
    case 0: return i - 50;
    case 1: return i * 0.37 - 100;
    case 2: return -i * 1.5;
    case 3: return 1e6 + i;
    case 4: return -3e9 - i;
    case 5: return 0.4999 + i / 8;
    default: return 70000.5 - i;
  }
}

struct Case {
  DataType from;
  DataType to;
  std::size_t count;
  std::size_t source_offset;       // Bytes into the source buffer.
  std::size_t destination_offset;  // Bytes into the destination buffer.
  double factor;
};

std::string describe(const Case& c) {
  return std::string(to_string(c.from)) + " -> " + std::string(to_string(c.to)) + " count " +
         std::to_string(c.count) + " offsets " + std::to_string(c.source_offset) + "/" +
         std::to_string(c.destination_offset) + " factor " + std::to_string(c.factor);
}

// Every ordered dtype pair four times, cycling through sizes (0, 1, odd, across several 4 KiB
// units of Note [Batched copy launch]), element offsets that misalign either side, and
// factors.
std::vector<Case> make_cases(std::size_t* source_bytes, std::size_t* destination_bytes) {
  const std::size_t sizes[] = {0, 1, 3, 17, 255, 4097, 16385, 40001};
  const std::size_t offsets[] = {0, 1, 3, 7};
  const double factors[] = {1.0, 0.5, -3.0, 1.0 / 3.0};
  std::vector<Case> cases;
  std::size_t source = 0;
  std::size_t destination = 0;
  std::size_t n = 0;
  for (DataType from : kEveryDtype) {
    for (DataType to : kEveryDtype) {
      for (std::size_t k = 0; k < 4; ++k, ++n) {
        Case c{.from = from,
               .to = to,
               .count = sizes[(n * 3 + k) % 8],
               .source_offset = source + offsets[n % 4] * element_size(from),
               .destination_offset = destination + offsets[(n + k) % 4] * element_size(to),
               .factor = factors[(n / 4 + k) % 4]};
        cases.push_back(c);
        // 256-byte aligned regions, then the chosen misalignment inside them.
        source = (c.source_offset + c.count * element_size(from) + 511) / 256 * 256;
        destination = (c.destination_offset + c.count * element_size(to) + 511) / 256 * 256;
      }
    }
  }
  *source_bytes = source;
  *destination_bytes = destination;
  return cases;
}

DeviceStream stream0() { return DeviceStream{Device::cuda(0), 0}; }

TEST_CASE("batched copy equals convert_scale for every dtype pair, size, offset and factor",
          "[kernel]") {
  ops::DeviceOps& device = ops::device_ops();
  std::size_t source_bytes = 0;
  std::size_t destination_bytes = 0;
  const std::vector<Case> cases = make_cases(&source_bytes, &destination_bytes);

  std::vector<std::byte> source(source_bytes);
  std::vector<std::byte> expected(destination_bytes, kGuard);
  for (const Case& c : cases) {
    std::vector<double> values(c.count);
    for (std::size_t i = 0; i < c.count; ++i) values[i] = source_value(i + c.source_offset);
    const std::vector<std::byte> encoded = encode(values, c.from);
    std::memcpy(source.data() + c.source_offset, encoded.data(), encoded.size());
    ops::cpu::convert_scale(expected.data() + c.destination_offset, c.to,
                            source.data() + c.source_offset, c.from, c.count, c.factor);
  }
  DeviceBuffer source_device(source_bytes);
  DeviceBuffer destination_device(destination_bytes);
  upload(source_device.get(), source, stream0());
  upload(destination_device.get(), std::vector<std::byte>(destination_bytes, kGuard), stream0());

  std::vector<CopySpec> copies;
  for (const Case& c : cases) {
    copies.push_back(CopySpec{.destination = destination_device.get() + c.destination_offset,
                              .destination_type = c.to,
                              .source = source_device.get() + c.source_offset,
                              .source_type = c.from,
                              .count = c.count,
                              .factor = c.factor});
  }
  REQUIRE(device.batched_copy(copies, stream0()).ok());  // One launch for all 484 copies.
  REQUIRE(device.synchronize(stream0()).ok());
  const std::vector<std::byte> got = download(destination_device.get(), destination_bytes);

  for (const Case& c : cases) {
    const std::size_t bytes = c.count * element_size(c.to);
    const bool same = std::memcmp(got.data() + c.destination_offset,
                                  expected.data() + c.destination_offset, bytes) == 0;
    INFO(describe(c));
    CHECK(same);
  }
  CHECK(got == expected);  // Also nothing written outside the destinations.
}

TEST_CASE("batched copy scales in place for every dtype", "[kernel]") {
  ops::DeviceOps& device = ops::device_ops();
  const std::size_t count = 50001;
  for (DataType dtype : kEveryDtype) {
    std::vector<double> values(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = source_value(i);
    std::vector<std::byte> expected = encode(values, dtype);
    DeviceBuffer data(expected.size());
    upload(data.get(), expected, stream0());
    ops::cpu::convert_scale(expected.data(), dtype, expected.data(), dtype, count, 0.5);
    const CopySpec copy{.destination = data.get(),
                        .destination_type = dtype,
                        .source = data.get(),
                        .source_type = dtype,
                        .count = count,
                        .factor = 0.5};
    REQUIRE(device.batched_copy(std::span<const CopySpec>(&copy, 1), stream0()).ok());
    REQUIRE(device.synchronize(stream0()).ok());
    INFO(to_string(dtype));
    CHECK(download(data.get(), expected.size()) == expected);
  }
}

TEST_CASE("half conversions scale in float32 and keep infinities and NaN", "[kernel]") {
  ops::DeviceOps& device = ops::device_ops();
  const std::vector<float> special = {0.0f,  -0.0f,  1.0f / 3.0f, 65504.0f,   65520.0f,
                                      1e-8f, -1e-5f, 3.0e38f,     INFINITY,   -INFINITY,
                                      NAN,   2.5f,   -2.5f,       1.00390625f};
  for (DataType half : {DataType::Float16, DataType::BFloat16}) {
    for (double factor : {1.0, 1.0 / 3.0, 4096.0}) {
      std::vector<std::byte> input(special.size() * sizeof(float));
      std::memcpy(input.data(), special.data(), input.size());
      std::vector<std::byte> narrow(special.size() * 2);
      std::vector<std::byte> wide(input.size());
      ops::cpu::convert_scale(narrow.data(), half, input.data(), DataType::Float32, special.size(),
                              factor);
      ops::cpu::convert_scale(wide.data(), DataType::Float32, narrow.data(), half, special.size(),
                              factor);
      DeviceBuffer in(input.size());
      DeviceBuffer mid(narrow.size());
      DeviceBuffer out(wide.size());
      upload(in.get(), input, stream0());
      const CopySpec there{.destination = mid.get(),
                           .destination_type = half,
                           .source = in.get(),
                           .source_type = DataType::Float32,
                           .count = special.size(),
                           .factor = factor};
      const CopySpec back{.destination = out.get(),
                          .destination_type = DataType::Float32,
                          .source = mid.get(),
                          .source_type = half,
                          .count = special.size(),
                          .factor = factor};
      REQUIRE(device.batched_copy(std::span<const CopySpec>(&there, 1), stream0()).ok());
      REQUIRE(device.batched_copy(std::span<const CopySpec>(&back, 1), stream0()).ok());
      REQUIRE(device.synchronize(stream0()).ok());
      const std::vector<std::byte> got = download(out.get(), wide.size());
      for (std::size_t i = 0; i < special.size(); ++i) {
        float g = 0;
        float e = 0;
        std::memcpy(&g, got.data() + i * sizeof(float), sizeof(float));
        std::memcpy(&e, wide.data() + i * sizeof(float), sizeof(float));
        INFO(std::string(to_string(half)) + " value " + std::to_string(special[i]) + " factor " +
             std::to_string(factor));
        // NaN payloads may differ between the CPU and the GPU; NaN-ness may not.
        if (std::isnan(e)) {
          CHECK(std::isnan(g));
        } else {
          CHECK(std::memcmp(&g, &e, sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("modular copies narrow integers keeping the low bits", "[kernel]") {
  const std::vector<std::int32_t> wide = {70000, -70000, 65535, -1, 32768, 123};
  DeviceBuffer in(wide.size() * sizeof(std::int32_t));
  DeviceBuffer out(wide.size() * sizeof(std::int16_t));
  std::vector<std::byte> bytes(wide.size() * sizeof(std::int32_t));
  std::memcpy(bytes.data(), wide.data(), bytes.size());
  upload(in.get(), bytes, stream0());
  for (ops::cuda::KernelType to : {ops::cuda::KernelType::Int16, ops::cuda::KernelType::UInt16}) {
    const ops::cuda::CopyDescriptor copy{.source = in.get(),
                                         .destination = out.get(),
                                         .count = wide.size(),
                                         .factor = 1.0,
                                         .first_unit = 0,
                                         .source_type = ops::cuda::KernelType::Int32,
                                         .destination_type = to,
                                         .flags = ops::cuda::kCopyFlagModular};
    REQUIRE(ops::cuda::cuda_device_ops()
                .batched_copy(std::span<const ops::cuda::CopyDescriptor>(&copy, 1), stream0())
                .ok());
    REQUIRE(ops::device_ops().synchronize(stream0()).ok());
    const std::vector<std::byte> got = download(out.get(), wide.size() * 2);
    for (std::size_t i = 0; i < wide.size(); ++i) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, got.data() + i * 2, 2);
      CHECK(bits == static_cast<std::uint16_t>(static_cast<std::uint32_t>(wide[i]) & 0xffffu));
    }
  }
}

TEST_CASE("ResNet-50-like gradients pack and unpack through a fused buffer in one launch each",
          "[kernel]") {
  ops::DeviceOps& device = ops::device_ops();
  // Odd sizes of ResNet-50's kinds: biases, batch norms, 1x1 and 3x3 convolutions, the fc.
  const std::vector<std::size_t> counts = {1000,    2048000, 2048, 2048, 1048576, 512, 512,
                                           2359296, 256,     64,   9408, 37,      1,   4097};
  std::size_t total = 0;
  std::vector<std::size_t> offsets;  // Elements into the fused buffer, 16-byte aligned.
  for (std::size_t n : counts) {
    offsets.push_back(total);
    total += (n + 3) / 4 * 4;
  }
  std::vector<std::unique_ptr<DeviceBuffer>> tensors;
  std::vector<std::vector<float>> host;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    std::vector<float> values(counts[t]);
    for (std::size_t i = 0; i < counts[t]; ++i) values[i] = static_cast<float>((i + t) % 251);
    std::vector<std::byte> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    tensors.push_back(std::make_unique<DeviceBuffer>(bytes.size()));
    upload(tensors.back()->get(), bytes, stream0());
    host.push_back(std::move(values));
  }
  Result<std::shared_ptr<void>> fused = device.allocate(total * sizeof(float), Device::cuda(0));
  REQUIRE(fused.ok());
  auto* buffer = static_cast<float*>(fused.value().get());
  std::vector<CopySpec> pack;
  std::vector<CopySpec> unpack;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    pack.push_back(CopySpec{.destination = buffer + offsets[t],
                            .source = tensors[t]->get(),
                            .count = counts[t],
                            .factor = 2.0});
    unpack.push_back(CopySpec{.destination = tensors[t]->get(),
                              .source = buffer + offsets[t],
                              .count = counts[t],
                              .factor = 0.25});
  }
  REQUIRE(device.batched_copy(pack, stream0()).ok());
  REQUIRE(device.batched_copy(unpack, stream0()).ok());
  Result<std::unique_ptr<ops::DeviceEvent>> done = device.record_event(stream0());
  REQUIRE(done.ok());
  REQUIRE(poll_until_done(*done.value()).ok());
  REQUIRE(done.value()->wait().ok());
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const std::vector<std::byte> got = download(tensors[t]->get(), counts[t] * sizeof(float));
    std::vector<float> values(counts[t]);
    std::memcpy(values.data(), got.data(), got.size());
    for (float& v : host[t]) v = v * 2.0f * 0.25f;
    INFO("tensor " << t);
    CHECK(values == host[t]);
  }
}

TEST_CASE("CUDA DeviceOps allocates zeroed memory and copies both ways", "[device_ops]") {
  ops::DeviceOps& device = ops::device_ops();
  CHECK(device.device_count() >= 1);
  const std::size_t bytes = 12345;
  std::shared_ptr<void> zeroed = device.allocate_zeroed(bytes, Device::cuda(0));
  REQUIRE(zeroed != nullptr);
  CHECK(download(zeroed.get(), bytes) == std::vector<std::byte>(bytes, std::byte{0}));
  CHECK(device.allocate_zeroed(0, Device::cuda(0)) != nullptr);

  std::vector<std::byte> pattern(bytes);
  for (std::size_t i = 0; i < bytes; ++i) pattern[i] = std::byte(i * 7 % 256);
  std::shared_ptr<void> other = device.allocate_zeroed(bytes, Device::cuda(0));
  REQUIRE(device.copy_to_device(zeroed.get(), pattern.data(), bytes, Device::cuda(0)).ok());
  REQUIRE(device.copy_device_to_device(other.get(), zeroed.get(), bytes, Device::cuda(0)).ok());
  std::vector<std::byte> back(bytes);
  REQUIRE(device.copy_to_host(back.data(), other.get(), bytes, Device::cuda(0)).ok());
  CHECK(back == pattern);

  // Asynchronous staging through page-locked memory, ordered on one stream.
  Result<std::shared_ptr<void>> pinned = device.allocate_pinned(bytes);
  REQUIRE(pinned.ok());
  REQUIRE(device.fill_zero(other.get(), bytes, stream0()).ok());
  REQUIRE(device.copy_async(pinned.value().get(), other.get(), bytes, stream0()).ok());
  REQUIRE(device.synchronize(stream0()).ok());
  CHECK(std::memcmp(pinned.value().get(), std::vector<std::byte>(bytes).data(), bytes) == 0);
}

// Holds back the work behind it on its stream for 100 ms: a slow producer.
void CUDART_CB sleep_100ms(void* /*unused*/) {
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

TEST_CASE("record_ready and wait_event order Tutti's stream after a slow producer stream",
          "[device_ops][ordering]") {
  ops::DeviceOps& device = ops::device_ops();
  const std::size_t count = 4096;
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 251 + 1);
  cudaStream_t own = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  void* staging = nullptr;
  cuda_check(cudaMallocHost(&staging, count * sizeof(float)), "cudaMallocHost");
  std::memcpy(staging, values.data(), count * sizeof(float));
  for (cudaStream_t producer : {cudaStream_t{nullptr}, own}) {
    const cudaStream_t native = producer == nullptr ? cudaStreamLegacy : producer;
    const std::shared_ptr<void> source = device.allocate_zeroed(count * 4, Device::cuda(0));
    const std::shared_ptr<void> destination = device.allocate_zeroed(count * 4, Device::cuda(0));
    // The producer writes `source` 100 ms from now; Tutti's stream copies it at once unless
    // it waits for the producer.
    cuda_check(cudaLaunchHostFunc(native, &sleep_100ms, nullptr), "cudaLaunchHostFunc");
    cuda_check(cudaMemcpyAsync(source.get(), staging, count * 4, cudaMemcpyHostToDevice, native),
               "cudaMemcpyAsync");
    Result<std::unique_ptr<ops::DeviceEvent>> ready =
        device.record_ready(producer, Device::cuda(0));
    REQUIRE(ready.ok());
    REQUIRE(device.wait_event(*ready.value(), stream0()).ok());
    ready.value().reset();  // Back to the pool: the wait holds the record it saw.
    const CopySpec copy{.destination = destination.get(), .source = source.get(), .count = count};
    REQUIRE(device.batched_copy(std::span<const CopySpec>(&copy, 1), stream0()).ok());
    REQUIRE(device.synchronize(stream0()).ok());
    std::vector<float> got(count);
    REQUIRE(device.copy_to_host(got.data(), destination.get(), count * 4, Device::cuda(0)).ok());
    INFO((producer == nullptr ? "legacy default stream" : "a non-blocking stream"));
    CHECK(got == values);
  }
  cuda_check(cudaStreamSynchronize(own), "cudaStreamSynchronize");
  cuda_check(cudaStreamDestroy(own), "cudaStreamDestroy");
  cuda_check(cudaFreeHost(staging), "cudaFreeHost");
}

TEST_CASE("Tensors on CUDA devices are zero-filled and refuse devices that do not exist",
          "[device_ops]") {
  const Tensor t(DataType::Float32, {3, 5}, Device::cuda(0));
  CHECK(t.device() == Device::cuda(0));
  CHECK(download(t.data(), t.byte_size()) == std::vector<std::byte>(t.byte_size()));
  const Tensor copy = t.clone();
  CHECK(copy.data() != t.data());
  CHECK(copy.device() == Device::cuda(0));

  const int missing = ops::device_ops().device_count();
  try {
    const Tensor bad(DataType::Float32, {4}, Device::cuda(missing));
    FAIL("a tensor on a device that does not exist was created");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("cuda:" + std::to_string(missing)) != std::string::npos);
  }
  const Status status = ops::device_ops().batched_copy(std::span<const CopySpec>(),
                                                       DeviceStream{Device::cuda(missing), 0});
  CHECK(status.ok());  // Nothing to copy: nothing checked, nothing enqueued.
  const CopySpec one{.count = 1};
  const Status refused = ops::device_ops().batched_copy(std::span<const CopySpec>(&one, 1),
                                                        DeviceStream{Device::cuda(missing), 0});
  CHECK(refused.code() == ErrorCode::InvalidArgument);
  const Status cpu = ops::device_ops().copy_to_host(nullptr, nullptr, 4, Device::cpu());
  CHECK(cpu.code() == ErrorCode::InvalidArgument);
}

}  // namespace
}  // namespace tutti::test

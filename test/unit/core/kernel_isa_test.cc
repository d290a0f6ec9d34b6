// SPDX-License-Identifier: Apache-2.0
// The host's element loops in each instruction set this build and CPU can run (Note [Kernel
// ISA] in ops/cpu/kernel_isa.h): the reduction and the scaling against values computed here
// element by element, in the order the contracts give, bit for bit. Lengths cover the vector
// bodies and their tails, below and above the size from which the AVX2 copies run.
#include "ops/cpu/kernel_isa.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/convert.h"
#include "ops/shm/reduce.h"

namespace tutti::ops::cpu {
namespace {

// Restores the process's choice when a test case ends.
class IsaGuard {
 public:
  IsaGuard() : saved_(kernel_isa()) {}
  ~IsaGuard() { set_kernel_isa(saved_); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;

 private:
  KernelIsa saved_;
};

std::vector<KernelIsa> available_isas() {
  std::vector<KernelIsa> isas{KernelIsa::Baseline};
  if (kernel_isa_available(KernelIsa::Avx2)) isas.push_back(KernelIsa::Avx2);
  return isas;
}

constexpr std::size_t kLengths[] = {1, 7, 255, 256, 257, 1000, 4099};

// Distinct, sign-changing values that are exact in every type used here.
template <class T>
std::vector<T> values(std::size_t n, int seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int x = static_cast<int>((i * 37 + static_cast<std::size_t>(seed) * 11) % 23) - 11;
    v[i] = static_cast<T>(x == 0 ? seed + 1 : x);
  }
  return v;
}

template <class T, class Op>
void check_reduce(DataType dtype, WireOp op, Op expected_op) {
  for (const std::size_t n : kLengths) {
    const std::vector<T> a = values<T>(n, 1), b = values<T>(n, 2), c = values<T>(n, 3);
    std::vector<T> expected(n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = expected_op(expected_op(a[i], b[i]), c[i]);
    std::vector<T> out(n);
    const void* sources[] = {a.data(), b.data(), c.data()};
    reduce(out.data(), sources, n, dtype, op);
    INFO("n = " << n);
    CHECK(out == expected);
    // In place: the destination is the first source.
    std::vector<T> in_place = a;
    const void* aliased[] = {in_place.data(), b.data(), c.data()};
    reduce(in_place.data(), aliased, n, dtype, op);
    CHECK(in_place == expected);
  }
}

TEST_CASE("the kernel ISA is AVX2 exactly where the build has copies and the CPU runs them",
          "[kernel_isa]") {
#if TUTTI_KERNEL_AVX2_CLONES
  const bool cpu_has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  const bool cpu_has = false;
#endif
  CHECK(kernel_isa() == (cpu_has ? KernelIsa::Avx2 : KernelIsa::Baseline));
  CHECK(kernel_isa_available(KernelIsa::Baseline));
  CHECK(kernel_isa_available(KernelIsa::Avx2) == cpu_has);
  IsaGuard guard;
  CHECK(set_kernel_isa(KernelIsa::Baseline));
  CHECK(kernel_isa() == KernelIsa::Baseline);
  CHECK(set_kernel_isa(KernelIsa::Avx2) == cpu_has);
  CHECK(kernel_isa() == (cpu_has ? KernelIsa::Avx2 : KernelIsa::Baseline));
  CHECK(std::string(kernel_isa_name(KernelIsa::Avx2)) == "avx2");
  CHECK(std::string(kernel_isa_name(KernelIsa::Baseline)) == "baseline");
  WARN("kernel ISAs available here: " << (cpu_has ? "baseline, avx2" : "baseline only"));
}

TEST_CASE("reductions give the element-wise results in every available ISA", "[kernel_isa]") {
  IsaGuard guard;
  for (const KernelIsa isa : available_isas()) {
    REQUIRE(set_kernel_isa(isa));
    INFO("isa = " << kernel_isa_name(isa));
    check_reduce<float>(DataType::Float32, WireOp::Sum, [](float x, float y) { return x + y; });
    check_reduce<float>(DataType::Float32, WireOp::Max,
                        [](float x, float y) { return x < y ? y : x; });
    check_reduce<double>(DataType::Float64, WireOp::Product,
                         [](double x, double y) { return x * y; });
    check_reduce<std::int32_t>(DataType::Int32, WireOp::Min,
                               [](std::int32_t x, std::int32_t y) { return y < x ? y : x; });
    check_reduce<std::int64_t>(DataType::Int64, WireOp::Sum,
                               [](std::int64_t x, std::int64_t y) { return x + y; });
    check_reduce<std::uint8_t>(DataType::UInt8, WireOp::Sum, [](std::uint8_t x, std::uint8_t y) {
      return static_cast<std::uint8_t>(x + y);  // Wraps, as MPI's.
    });
  }
}

TEST_CASE("scaling gives the element-wise results in every available ISA", "[kernel_isa]") {
  IsaGuard guard;
  for (const KernelIsa isa : available_isas()) {
    REQUIRE(set_kernel_isa(isa));
    for (const std::size_t n : kLengths) {
      INFO("isa = " << kernel_isa_name(isa) << ", n = " << n);
      // float32 is scaled in float (ops/convert.h), by a factor that is not a power of two.
      const std::vector<float> f = values<float>(n, 4);
      const double factor = 1.0 / 3.0;
      std::vector<float> f_expected(n);
      for (std::size_t i = 0; i < n; ++i) f_expected[i] = f[i] * static_cast<float>(factor);
      std::vector<float> f_out(n);
      convert_scale(f_out.data(), DataType::Float32, f.data(), DataType::Float32, n, factor);
      CHECK(f_out == f_expected);
      std::vector<float> f_in_place = f;  // In place, as an unpack's postscale.
      convert_scale(f_in_place.data(), DataType::Float32, f_in_place.data(), DataType::Float32, n,
                    factor);
      CHECK(f_in_place == f_expected);
      // float64 in double; int32 in double, truncated toward zero (integer Average).
      const std::vector<double> d = values<double>(n, 5);
      std::vector<double> d_expected(n), d_out(n);
      for (std::size_t i = 0; i < n; ++i) d_expected[i] = d[i] * 0.25;
      convert_scale(d_out.data(), DataType::Float64, d.data(), DataType::Float64, n, 0.25);
      CHECK(d_out == d_expected);
      const std::vector<std::int32_t> k = values<std::int32_t>(n, 6);
      std::vector<std::int32_t> k_expected(n), k_out(n);
      for (std::size_t i = 0; i < n; ++i) k_expected[i] = static_cast<std::int32_t>(k[i] * 0.5);
      convert_scale(k_out.data(), DataType::Int32, k.data(), DataType::Int32, n, 0.5);
      CHECK(k_out == k_expected);
    }
  }
}

}  // namespace
}  // namespace tutti::ops::cpu

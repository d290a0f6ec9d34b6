// SPDX-License-Identifier: Apache-2.0
#include "ops/cpu/kernel_isa.h"

#include <atomic>

namespace tutti::ops::cpu {
namespace {

bool cpu_runs_avx2_copies() {
#if TUTTI_KERNEL_AVX2_CLONES
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// Read by every loop call of kAvx2MinBytes or more: relaxed, since the choice guards no other
// data.
std::atomic<KernelIsa>& chosen_isa() {
  static std::atomic<KernelIsa> isa{cpu_runs_avx2_copies() ? KernelIsa::Avx2 : KernelIsa::Baseline};
  return isa;
}

}  // namespace

KernelIsa kernel_isa() { return chosen_isa().load(std::memory_order_relaxed); }

bool kernel_isa_available(KernelIsa isa) {
  return isa == KernelIsa::Baseline || cpu_runs_avx2_copies();
}

bool set_kernel_isa(KernelIsa isa) {
  if (!kernel_isa_available(isa)) return false;
  chosen_isa().store(isa, std::memory_order_relaxed);
  return true;
}

const char* kernel_isa_name(KernelIsa isa) { return isa == KernelIsa::Avx2 ? "avx2" : "baseline"; }

}  // namespace tutti::ops::cpu

// SPDX-License-Identifier: Apache-2.0
// Which instruction set the host's element loops run in: the reduction of the shared-memory
// collectives (ops/shm/reduce.cc) and the conversion and scaling of fusion's pack and unpack
// (ops/cpu/convert.cc).
//
// Note [Kernel ISA]
// Those loops touch every byte a CPU collective moves. A build for any x86-64
// (-Dnative_arch=false, as a distribution or a binary carried to another machine is built)
// vectorizes them for SSE2 only, while Open MPI's own reductions pick AVX2 or AVX-512 at run
// time. So where the build's baseline lacks AVX2, each loop is compiled twice: for the baseline,
// and in a function marked `target("avx2,fma")` into which the same body is inlined; every call
// takes the AVX2 copy where the CPU has AVX2 and FMA. Only the marked functions are compiled
// for AVX2, never a whole file: an inline function that other files share (a std:: template, a
// header's helper) is still emitted for the baseline, so no AVX2 instruction can reach a CPU
// without it through the linker's choice of one copy. A native build (-march=native) compiles
// each loop once, for the machine it is built on. AVX-512 stays out, as in native builds
// (meson.build). On the 2-core AMD EPYC VM (family 26) the AVX2 copies take 0.67-0.93 of the
// SSE2 ones' time per element in L1, L2 and from memory, about the same at 1 MB (README, Quick
// start, on -Dnative_arch); P1 moved by less than its noise.
#pragma once

#include <cstddef>

#if defined(__x86_64__) && !defined(__AVX2__) && (defined(__GNUC__) || defined(__clang__))
#define TUTTI_KERNEL_AVX2_CLONES 1
// Marks the AVX2 copy of a loop (Note [Kernel ISA]).
#define TUTTI_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define TUTTI_KERNEL_AVX2_CLONES 0
#endif

namespace tutti::ops::cpu {

enum class KernelIsa {
  Baseline,  // The build's own target: SSE2 in a portable build, the build machine's natively.
  Avx2,      // The AVX2 copies of a portable x86-64 build.
};

// The instruction set the loops run in: Avx2 where the build has AVX2 copies and the CPU has
// AVX2 and FMA, else Baseline. The same for every thread of the process.
KernelIsa kernel_isa();

// Baseline always; Avx2 where the build has AVX2 copies and the CPU can run them.
bool kernel_isa_available(KernelIsa isa);

// Makes later calls run in `isa` (tests run each available one). Returns false, changing
// nothing, where `isa` is not available.
bool set_kernel_isa(KernelIsa isa);

// "baseline" or "avx2".
const char* kernel_isa_name(KernelIsa isa);

// Loops over fewer bytes than this stay in the baseline: their time is the call's, not the
// loop's, and the AVX2 copy is one call further away (a lone 1-float allreduce took 0.1 us
// longer, 4 %, with every call dispatched).
inline constexpr std::size_t kAvx2MinBytes = 1024;

// Whether a loop over `bytes` runs its AVX2 copy.
inline bool use_avx2(std::size_t bytes) {
  return TUTTI_KERNEL_AVX2_CLONES && bytes >= kAvx2MinBytes && kernel_isa() == KernelIsa::Avx2;
}

}  // namespace tutti::ops::cpu

// SPDX-License-Identifier: Apache-2.0
// TUTTI_FAST_TLS: a thread_local on every op's submission path, read without a call.
//
// Note [Thread-locals read without a call]
// libtutti is a shared library, so by default each thread_local it owns is found through
// __tls_get_addr(), a call of some 25 instructions. The submission path reads two (the
// thread's session cache in Runtime::session_for_op() and its SubmissionWindow), about 55
// instructions of an op's ~3,300 on the two threads of a rank in P3 (10,000 tiny allreduces a
// step; callgrind, examples/BENCHMARK_LOG.md twenty-third round); an op's entry is made and
// freed through a third (the kept blocks of src/base/recycling_allocator.h). The initial-exec model
// reads them at a fixed offset from the thread pointer instead. Its price: a program that loads
// libtutti with dlopen() after it started (a Python extension) places them in the spare room
// glibc keeps in the static TLS block for such libraries, which these few dozen bytes fit.
// Only for the variables on that path; the rest keep the default model.
#pragma once

#define TUTTI_FAST_TLS __attribute__((tls_model("initial-exec")))

// SPDX-License-Identifier: Apache-2.0
// The flags zero_benchmark and comm_hook_benchmark share: timed steps over ResNet-50's gradient
// list (or a file's), read strictly with examples/flag_reader.h.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "examples/flag_reader.h"

namespace tutti::examples {

struct StepBenchmarkFlags {
  int iters = 10;          // --iters: timed steps per round
  int warmup = 3;          // --warmup: untimed steps first
  int rounds = 3;          // --rounds: the variants run in turn this many times
  int tensors = 0;         // --tensors: the last T tensors of the list only (0: all)
  std::string grads = {};  // --grads: the list's file; empty: the built-in ResNet-50 list
};

// The flags over `defaults`, or nullopt with *status the exit status, after the usage (stdout,
// for --help) or the fault naming the flag (stderr) was printed where `print`.
inline std::optional<StepBenchmarkFlags> read_step_benchmark_flags(const char* program,
                                                                   const char* usage, int argc,
                                                                   char** argv,
                                                                   StepBenchmarkFlags defaults,
                                                                   bool print, int* status) {
  StepBenchmarkFlags f = std::move(defaults);
  FlagReader flags(program, argc, argv);
  while (flags.next()) {
    if (flags.is("--grads"))
      f.grads = flags.text();
    else if (flags.is("--iters"))
      f.iters = static_cast<int>(flags.integer(1, 100000));
    else if (flags.is("--warmup"))
      f.warmup = static_cast<int>(flags.integer(1, 100000));
    else if (flags.is("--rounds"))
      f.rounds = static_cast<int>(flags.integer(1, 100000));
    else if (flags.is("--tensors"))
      f.tensors = static_cast<int>(flags.integer(0, 100000));
    else
      flags.unknown();
  }
  if (const std::optional<int> exit = flags.exit_status(usage, print)) {
    *status = *exit;
    return std::nullopt;
  }
  return f;
}

}  // namespace tutti::examples

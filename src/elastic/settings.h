// SPDX-License-Identifier: Apache-2.0
// The elastic layer's knobs (TUTTI_ELASTIC_DIR, TUTTI_ELASTIC_KEEP: src/common/knobs.def) and
// its log lines. The elastic layer is a client of the public API, so it reads the environment
// itself, the way src/common/env.cc does for the runtime.
#pragma once

#include <string>

namespace tutti::elastic::internal {

struct Settings {
  std::string directory;  // TUTTI_ELASTIC_DIR, "%h" expanded; empty: commits written nowhere.
  int keep = 2;           // TUTTI_ELASTIC_KEEP.
};

// Reads the knobs, TUTTI_<NAME> else HOROVOD_<NAME>. Throws Error(InvalidArgument) naming the
// variable for a value that does not parse or is out of knobs.def's range.
Settings read_settings();

enum class Level { Info, Warning };
// One line on stderr, written at once so that ranks' lines do not interleave:
// "[tutti rank R] elastic: <message>", if TUTTI_LOG_LEVEL lets `level` through (INFO lines
// need INFO or finer; warnings are hidden by ERROR and FATAL).
void log_line(Level level, const std::string& message);

}  // namespace tutti::elastic::internal

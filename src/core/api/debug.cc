// SPDX-License-Identifier: Apache-2.0
// API.md's flight recorder (tutti/debug.h).
#include "tutti/debug.h"

#include "src/core/runtime.h"

namespace tutti::debug {

std::vector<OpRecord> flight_recorder() {
  return core::Runtime::get().flight_recorder().value_or_throw()->snapshot();
}

void dump_flight_recorder(const std::string& path) {
  const std::shared_ptr<core::FlightRecorder> recorder =
      core::Runtime::get().flight_recorder().value_or_throw();
  recorder->dump(path.empty() ? recorder->default_path() : path, "dump_flight_recorder()")
      .throw_if_error();
}

}  // namespace tutti::debug

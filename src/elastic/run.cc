// SPDX-License-Identifier: Apache-2.0
// elastic::run: the restore / reset / train / relaunch loop of one launch (see tutti/elastic.h).
#include <string>

#include "src/base/strings.h"
#include "src/elastic/settings.h"
#include "tutti/elastic.h"
#include "tutti/error.h"
#include "tutti/runtime.h"

namespace tutti::elastic {
namespace {

// The errors after which Tutti's runtime is stopped on this rank (API.md: a fault or a stall
// stops it, and every later op fails with ShutDown): nothing more can be done in this launch,
// but a relaunch on the hosts that are up can go on from the last commit.
bool stops_the_runtime(ErrorCode code) {
  switch (code) {
    case ErrorCode::ShutDown:
    case ErrorCode::Stalled:
    case ErrorCode::Communication: return true;
    case ErrorCode::InvalidArgument:
    case ErrorCode::Mismatch:
    case ErrorCode::NotInitialized:
    case ErrorCode::Internal:
    case ErrorCode::Timeout: return false;
  }
  return false;
}

}  // namespace

int run(State& state, const std::function<void(State&)>& train) {
  try {
    if (!state.restore()) {
      state.sync(0);
    } else if (state.restored_world_size() != size()) {
      state.reset();
    }
    train(state);
    return 0;
  } catch (const HostsUpdated&) {
    return kRelaunchExitCode;
  } catch (const Error& e) {
    if (!stops_the_runtime(e.code())) throw;
    internal::log_line(
        internal::Level::Warning,
        detail::str_cat("the runtime stopped (", e.what(), "): exiting with status ",
                        kRelaunchExitCode, " for the launcher to relaunch from commit ",
                        state.commits()));
    return kRelaunchExitCode;
  }
}

}  // namespace tutti::elastic

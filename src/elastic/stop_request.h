// SPDX-License-Identifier: Apache-2.0
// The launcher's request that the job stop at its next commit: SIGUSR2, which scripts/tuttirun
// sends to mpirun and mpirun forwards to every rank.
#pragma once

namespace tutti::elastic::internal {

// Installs the SIGUSR2 handler, once per process; later calls do nothing. A handler that was
// installed before is kept and called after ours.
void install_stop_handler();

// Whether SIGUSR2 arrived since the last clear_stop_request(). Any thread.
bool stop_requested();
void clear_stop_request();

}  // namespace tutti::elastic::internal

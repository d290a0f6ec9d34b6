// SPDX-License-Identifier: Apache-2.0
// Transport faults on demand, for tests only (no setting reaches this): a test makes one rank's
// host collective fail as a broken network would, and checks that the error reaches every rank
// in bounded time (README "Troubleshooting": a job that does not end after an error).
#pragma once

#include "src/common/status.h"

namespace tutti::ops {

// The `nth` host allreduce from now (1 = the next) fails with Communication without entering
// MPI; 0 disables. Any thread.
void inject_allreduce_fault(int nth);

// Communication if this call is the injected fault, else OK. Communication thread.
Status take_allreduce_fault();

}  // namespace tutti::ops

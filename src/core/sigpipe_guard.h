// SPDX-License-Identifier: Apache-2.0
// SIGPIPE is ignored while a session runs, so that a peer's death cannot end this rank silently.
//
// Note [SIGPIPE while a session runs]
// Open MPI's TCP transport writes to its sockets with writev(), which raises SIGPIPE in the
// writing thread once the peer at the other end is gone (a crashed rank, a lost host). SIGPIPE's
// default action ends the process at once: no flight-recorder dump, no error, no message, and
// the rank's death then looks like a second failure. In the cluster test "fault crash" (a host
// killed under training) a surviving rank died so, inside MPI_Allreduce's writev(), on the
// 2-core VM with two busy processes beside it; with the daemon's early SIGKILL (Note [Dump on
// SIGUSR1] in signal_dump.h) that lost a rank's dump in 8 of 91 runs. Ignored, the write fails
// with EPIPE and the rank lives on; in those runs it then waited until mpirun's SIGTERM, and
// dumped.
//
// The disposition is changed only where it is the default: an application that handles or
// ignores SIGPIPE itself keeps its choice. The first session of the process to start ignores
// it, the last to stop restores the default (unless the application changed it meanwhile).
// Meanwhile the application's own writes to a closed pipe or socket fail with EPIPE instead of
// ending the process, as in a Python program, which ignores SIGPIPE from its start.
#pragma once

namespace tutti::core {

// RAII: SIGPIPE ignored from construction to destruction, as above. Any thread.
class SigpipeGuard {
 public:
  SigpipeGuard();
  ~SigpipeGuard();
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;
};

}  // namespace tutti::core

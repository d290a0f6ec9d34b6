// SPDX-License-Identifier: Apache-2.0
// SIGUSR1 writes the flight recorder's dump without stopping the job; SIGTERM writes it, then
// ends the process as SIGTERM would have.
//
// Note [Dump on SIGUSR1]
// A signal handler may not lock or allocate, so the handler only posts a semaphore (sem_post
// is async-signal-safe) and a thread of its own ("tutti-sigdump") waits on it and writes the
// dump. That thread needs nothing from the communication thread, so a rank whose
// communication thread is stuck inside an MPI call still dumps. Open MPI's mpirun forwards
// SIGUSR1 to every rank, so `kill -USR1 <mpirun's pid>` dumps them all.
//
// SIGTERM is how mpirun ends the other ranks when one dies (a crash, a kill -9, a failed
// host): those ranks write their dumps on the way out, and the missing one's absence is what
// scripts/tutti-trace reports. After the dump the thread restores the default action and
// raises SIGTERM again, so the process ends with the status it would have had (mpirun's
// SIGKILL a few seconds later ends one whose dump hangs).
//
// Between the dump and that raise it waits kSigtermLinger (250 ms), for the other ranks of its
// host. Open MPI's daemon sends SIGTERM to all of its local ranks, then sleep()s a second
// before it sends SIGKILL (orte/mca/odls, 4.1); but the SIGCHLD of the first rank to exit cuts
// that sleep short. So the first rank to dump and die had the daemon kill its siblings while
// they were still writing theirs: on the 2-core VM with two busy processes beside the job, a
// sibling's dump thread woke 2.7 ms after its SIGTERM, when the first rank had already ended,
// and was killed before it had opened its file. A dump takes well under a millisecond once its
// thread runs. (This and SIGPIPE, Note [SIGPIPE while a session runs] in sigpipe_guard.h, lost
// a rank's dump in 8 of 91 runs of the cluster test "fault crash" there; none in 110 since.)
//
// Once the runtime has stopped on an error and dumped rank<R>.json for it, a signal's dump goes
// to rank<R>.SIGTERM.json (.SIGUSR1) instead (FlightRecorder::signal_dump_path()): a stuck
// rank's "Stalled: ..." dump must not be replaced by the "SIGTERM" one that MPI_Abort, called
// on a peer after the same error, brings a moment later.
//
// Each handler is installed only where the signal still has its default action (an
// application's own handler is left alone, and then that signal dumps nothing), and the
// default is restored when the session ends where Tutti's handler is still the one installed
// (a handler the application installed after init() is left alone too).
#pragma once

#include <atomic>
#include <thread>

#include "src/core/flight_recorder.h"

namespace tutti::core {

// Created and destroyed by the session's thread (init(), shutdown()).
class SignalDumper {
 public:
  // `recorder` must outlive this object.
  explicit SignalDumper(FlightRecorder& recorder);
  ~SignalDumper();
  SignalDumper(const SignalDumper&) = delete;
  SignalDumper& operator=(const SignalDumper&) = delete;

  // Whether SIGUSR1 dumps (false where the application handles SIGUSR1 itself).
  bool installed() const { return usr1_installed_; }

 private:
  void run();  // The "tutti-sigdump" thread.

  FlightRecorder& recorder_;
  bool usr1_installed_ = false;
  bool term_installed_ = false;
  std::atomic<bool> stopping_{false};
  // run() has returned. The destructor posts until it sees this: a session starting on another
  // thread may drain the semaphore (stale requests) and take the one post meant for this thread.
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace tutti::core

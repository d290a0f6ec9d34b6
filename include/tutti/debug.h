// SPDX-License-Identifier: Apache-2.0
// The flight recorder (API.md "Flight recorder"): each rank's ring of its most recent
// collectives, to explain a hang or a crash after the fact.
//
// Every rank records each collective it submits (point-to-point ops are not recorded): its
// sequence number in its process set, name, op, dtype, shape, set and how far it got
// (submitted: waiting for the other ranks; negotiated; executing; done; failed). The ring keeps
// the last TUTTI_FLIGHT_RECORDER_SIZE ops (default 2000; 0 turns recording off); recording an
// op costs a copy of its name and shape into a slot reused in turn, under a lock the
// communication thread takes for a few nanoseconds per state.
//
// Each rank writes its ring as rank<R>.json into TUTTI_FLIGHT_RECORDER_DIR (default
// $TMPDIR/tutti-flight-recorder, or /tmp/...) by itself when the runtime stops on a stall or
// an error, on SIGUSR1 (if the application installed no handler of its own; mpirun forwards
// the signal to every rank, and the job goes on), and when dump_flight_recorder() is called.
// `scripts/tutti-trace DIR` reads every rank's dump and names the first op where the ranks
// diverge (README, "Troubleshooting"). The file format is documented there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/tensor.h"

namespace tutti::debug {

// One recorded op, as flight_recorder() returns it.
struct OpRecord {
  std::int64_t sequence = 0;  // Per process set, in submission order on this rank, from 0.
  std::string name, op;       // op as to_string() writes it ("ALLREDUCE", "BROADCAST", ...).
  std::string dtype;          // "float32", ...; "" for an op without tensors (barrier, join).
  Shape shape;                // A grouped op's first tensor's.
  int process_set_id = 0;
  std::string state;       // "submitted", "negotiated", "executing", "done", "failed".
  double submitted_s = 0;  // Seconds since init().
  double finished_s = -1;  // Seconds since init(); < 0 while not done or failed.
};

// A copy of this rank's ring, oldest op first (empty when TUTTI_FLIGHT_RECORDER_SIZE is 0).
// After shutdown() it is the last session's, until the next init(). Any thread. Throws
// NotInitialized before the first init().
TUTTI_API std::vector<OpRecord> flight_recorder();

// Writes this rank's ring as JSON to `path`, or with an empty path to
// TUTTI_FLIGHT_RECORDER_DIR/rank<R>.json (the directory is created). Not collective: each rank
// that calls it writes its own. Any thread; after shutdown() as flight_recorder(). Throws
// NotInitialized before the first init(), InvalidArgument naming the path and the OS's reason
// if the file cannot be written (an existing file is replaced whole, never left half-written).
TUTTI_API void dump_flight_recorder(const std::string& path = {});

}  // namespace tutti::debug

// SPDX-License-Identifier: Apache-2.0
// Process sets: sub-groups of ranks with their own communicator, negotiation and cache.
#pragma once

#include <vector>

#include "tutti/export.h"

namespace tutti {

// A handle to a set of ranks. Cheap to copy; holds only the set's id. Ops on a set are
// matched by name within that set only. Every method is thread-safe.
class TUTTI_API ProcessSet {
 public:
  // The set of all ranks (id 0). Never throws, even before init(); its accessors reflect the
  // current session.
  static ProcessSet global() { return ProcessSet(0); }
  // A handle to the set with this id, as returned by id(). Accessors throw InvalidArgument
  // if no such set exists in the current session.
  explicit ProcessSet(int id) : id_(id) {}

  int id() const { return id_; }  // 0 for the global set; equal on every rank.
  // Sorted global ranks of the members. The reference stays valid for the life of the
  // process (Tutti keeps one copy of each rank list it has used). Throws NotInitialized
  // outside a session.
  const std::vector<int>& ranks() const;
  bool included() const;  // This process is a member.
  int rank() const;       // Rank within the set; throws InvalidArgument if not included.
  int size() const;       // Number of members.

  friend bool operator==(const ProcessSet& a, const ProcessSet& b) { return a.id_ == b.id_; }

 private:
  int id_ = 0;
};

// Creates a process set of the given global ranks. Collective over ALL ranks of the job (not
// only the members): every rank makes the same calls, with the same ranks, in the same order.
// Blocking. Throws InvalidArgument (on every rank) for an empty list, a rank out of range, a
// repeated rank, or ranks equal to an existing set's (in any order). The first three are
// refused by the call itself, before anything is sent (API.md): a list bad on one rank only
// fails that rank's call alone, and the others wait for its change as for any missing rank
// (the stall inspector names it, and stops the job with Stalled after the shutdown limit).
TUTTI_API ProcessSet add_process_set(std::vector<int> ranks);
// Removes a set. Collective over all ranks like add_process_set(). Ops still in flight on the
// set fail with ShutDown: collectives, and point-to-point ops except transfers already under
// way (a receive some message has reached, a send being taken), which finish. A send of more
// than 2 KB that no receive takes cannot fail (MPI keeps its buffer until a receive takes it):
// the stall inspector stops the job with Stalled naming it. Throws InvalidArgument for the
// global set or an unknown set.
TUTTI_API void remove_process_set(const ProcessSet& set);

}  // namespace tutti

// SPDX-License-Identifier: Apache-2.0
// An owned MPI communicator: a duplicate (or split) of a parent, with MPI_ERRORS_RETURN so
// failures become Status(Communication) instead of aborting. Freed by its destructor, which
// is collective like MPI_Comm_free: every member destroys its copy.
#pragma once

#include <vector>

#include <mpi.h>

#include "src/common/status.h"

namespace tutti::ops::mpi {

class MpiComm {
 public:
  MpiComm() = default;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  MpiComm(MpiComm&& other) noexcept;
  MpiComm& operator=(MpiComm&& other) noexcept;
  ~MpiComm();

  // Collective over `parent`.
  static Result<MpiComm> duplicate(MPI_Comm parent);
  // Collective over `parent`: the members of `ranks` (ranks of `parent`, sorted) get a
  // communicator of those ranks; the others get an empty MpiComm.
  static Result<MpiComm> subset(MPI_Comm parent, const std::vector<int>& ranks);
  // Collective over `parent`: ranks with the same `color` form one communicator, ordered by
  // `key`.
  static Result<MpiComm> split(MPI_Comm parent, int color, int key);

  MPI_Comm get() const { return comm_; }
  // Forgets the communicator without freeing it: MPI keeps it until MPI_Finalize, and its
  // context is never given to another communicator. Local.
  void leak() { comm_ = MPI_COMM_NULL; }
  bool valid() const { return comm_ != MPI_COMM_NULL; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  explicit MpiComm(MPI_Comm comm);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = -1;
  int size_ = 0;
};

}  // namespace tutti::ops::mpi

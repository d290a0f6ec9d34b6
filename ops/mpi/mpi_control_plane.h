// SPDX-License-Identifier: Apache-2.0
// ControlPlane over MPI point-to-point on a communicator of its own: MPI_Isend with the bytes
// kept alive until the send completes, MPI_Iprobe + MPI_Recv to receive.
#pragma once

#include <deque>
#include <string>

#include "ops/control_plane.h"
#include "ops/mpi/mpi_comm.h"

namespace tutti::ops::mpi {

class MpiControlPlane final : public ControlPlane {
 public:
  explicit MpiControlPlane(MpiComm comm);
  ~MpiControlPlane() override;

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  Status send(int destination, std::string bytes) override;
  Result<std::optional<Message>> poll() override;
  bool sends_done() override;

 private:
  struct PendingSend {
    std::string bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  MpiComm comm_;
  int tag_;
  std::deque<PendingSend> sends_;  // Oldest first; a deque keeps `bytes` in place.
};

}  // namespace tutti::ops::mpi

// SPDX-License-Identifier: Apache-2.0
// ControlPlane over MPI point-to-point on a communicator of its own: MPI_Isend with the bytes
// kept alive until the send completes, MPI_Improbe + MPI_Imrecv to receive: a large message
// (RPC's payloads) completes over later polls, and poll() never waits for its bytes.
#pragma once

#include <deque>
#include <optional>
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
  bool receiving() const override { return receiving_.has_value(); }
  bool sends_done() override;

 private:
  struct PendingSend {
    std::string bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  MpiComm comm_;
  int tag_;
  std::deque<PendingSend> sends_;  // Oldest first; a deque keeps `bytes` in place.
  // The message being received, once matched; one at a time keeps each sender's order.
  std::optional<Message> receiving_;
  MPI_Request receive_ = MPI_REQUEST_NULL;
};

}  // namespace tutti::ops::mpi

// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/mpi_control_plane.h"

#include "ops/mpi/mpi_error.h"
#include "ops/mpi/mpi_types.h"

namespace tutti::ops::mpi {
namespace {
constexpr int kTag = 7411;  // Any tag: the communicator is the control plane's alone.
}

MpiControlPlane::~MpiControlPlane() {
  // Sends still in flight at teardown go to ranks that are tearing down too; cancel rather
  // than wait on a peer that may be gone.
  for (PendingSend& send : sends_) {
    int done = 0;
    MPI_Test(&send.request, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(&send.request);
      MPI_Request_free(&send.request);
    }
  }
}

Status MpiControlPlane::send(int destination, std::string bytes) {
  sends_.push_back(PendingSend{.bytes = std::move(bytes)});
  PendingSend& send = sends_.back();
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Isend(send.bytes.data(), to_mpi_count(send.bytes.size()), MPI_BYTE,
                                      destination, kTag, comm_.get(), &send.request));
  static_cast<void>(sends_done());  // Frees the buffers of completed sends.
  return Status();
}

bool MpiControlPlane::sends_done() {
  while (!sends_.empty()) {
    int done = 0;
    if (MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) {
      return false;
    }
    sends_.pop_front();
  }
  return true;
}

Result<std::optional<Message>> MpiControlPlane::poll() {
  int arrived = 0;
  MPI_Status status;
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_.get(), &arrived, &status));
  if (!arrived) return std::optional<Message>();
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  Message message{.source = status.MPI_SOURCE, .bytes = std::string(static_cast<std::size_t>(count), '\0')};
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Recv(message.bytes.data(), count, MPI_BYTE, status.MPI_SOURCE, kTag,
                                     comm_.get(), MPI_STATUS_IGNORE));
  return std::optional<Message>(std::move(message));
}

}  // namespace tutti::ops::mpi

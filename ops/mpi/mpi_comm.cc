// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/mpi_comm.h"

#include <utility>

#include "ops/mpi/mpi_error.h"

namespace tutti::ops::mpi {

MpiComm::MpiComm(MPI_Comm comm) : comm_(comm) {
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
}

MpiComm::MpiComm(MpiComm&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(std::exchange(other.rank_, -1)),
      size_(std::exchange(other.size_, 0)) {}

MpiComm& MpiComm::operator=(MpiComm&& other) noexcept {
  if (this != &other) {
    this->~MpiComm();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = std::exchange(other.rank_, -1);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Result<MpiComm> MpiComm::duplicate(MPI_Comm parent) {
  MPI_Comm comm = MPI_COMM_NULL;
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Comm_dup(parent, &comm));
  return MpiComm(comm);
}

Result<MpiComm> MpiComm::subset(MPI_Comm parent, const std::vector<int>& ranks) {
  int rank = 0;
  MPI_Comm_rank(parent, &rank);
  int color = MPI_UNDEFINED;
  for (int member : ranks) color = member == rank ? 0 : color;
  return split(parent, color, rank);
}

Result<MpiComm> MpiComm::split(MPI_Comm parent, int color, int key) {
  MPI_Comm comm = MPI_COMM_NULL;
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Comm_split(parent, color, key, &comm));
  return MpiComm(comm);
}

}  // namespace tutti::ops::mpi

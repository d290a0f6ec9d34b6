// SPDX-License-Identifier: Apache-2.0
// An owned NCCL communicator over one process set, bootstrapped through the set's host
// backend: set rank 0 makes the unique id, the host backend broadcasts it (MPI_Bcast for the
// MPI backend), every member joins with its set rank. NCCL's bootstrap is kept behind
// ops::Backend so that this file needs no MPI type and core can create communicators lazily
// with nothing but the backend it already has.
#pragma once

#include <nccl.h>

#include "ops/backend.h"
#include "src/common/status.h"

namespace tutti::ops::nccl {

// Communication thread only. Move-only; the destructor frees the communicator (aborting it if
// it failed asynchronously, so that destruction never waits for a lost peer).
class NcclComm {
 public:
  NcclComm() = default;
  NcclComm(NcclComm&& other) noexcept;
  NcclComm& operator=(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm();

  // Collective over `bootstrap`'s set, which must call it in the same order on every member
  // (it broadcasts and allreduces through `bootstrap`). `prepared` is this rank's own
  // readiness (e.g. its stream could be created): if it or any peer's is not OK, or set rank
  // 0 cannot make the id, every member returns an error and none enters ncclCommInitRank, so
  // a local failure never leaves peers waiting in NCCL.
  static Result<NcclComm> create(Backend& bootstrap, int device, const Status& prepared = {});

  // Collective over `bootstrap`'s set: whether every member runs on a different GPU (compared
  // by UUID, so ranks on different hosts never collide). NCCL refuses two ranks on one device;
  // the answer is the same on every member.
  static Result<bool> one_device_per_rank(Backend& bootstrap, int device);

  ncclComm_t get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

  // An error NCCL found asynchronously (a peer lost mid-collective), or OK. Never blocks.
  Status async_error() const;

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = -1;
  int size_ = 0;
  int device_ = -1;
};

}  // namespace tutti::ops::nccl

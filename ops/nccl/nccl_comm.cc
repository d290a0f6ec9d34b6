// SPDX-License-Identifier: Apache-2.0
#include "ops/nccl/nccl_comm.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "ops/cuda/cuda_error.h"
#include "ops/cuda/stream.h"
#include "ops/nccl/nccl_error.h"
#include "src/base/strings.h"

namespace tutti::ops::nccl {
namespace {

// What set rank 0 broadcasts: the id, and whether making it worked.
struct IdMessage {
  ncclUniqueId id;
  std::uint8_t ok;
};

// What every member contributes to one_device_per_rank: its GPU's UUID, and whether reading
// it worked.
constexpr std::size_t kUuidBytes = 16;
constexpr std::size_t kUuidMessageBytes = kUuidBytes + 1;

Result<std::array<std::uint8_t, kUuidBytes>> device_uuid(int device) {
  TUTTI_RETURN_IF_ERROR(cuda::check_device(Device::cuda(device)));
  cudaDeviceProp properties{};
  TUTTI_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device));
  std::array<std::uint8_t, kUuidBytes> uuid{};
  static_assert(sizeof(properties.uuid.bytes) == kUuidBytes);
  std::memcpy(uuid.data(), properties.uuid.bytes, kUuidBytes);
  return uuid;
}

}  // namespace

NcclComm::NcclComm(NcclComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      rank_(std::exchange(other.rank_, -1)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, -1)) {}

NcclComm& NcclComm::operator=(NcclComm&& other) noexcept {
  if (this != &other) {
    this->~NcclComm();
    comm_ = std::exchange(other.comm_, nullptr);
    rank_ = std::exchange(other.rank_, -1);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr) return;
  cuda::ScopedDevice scoped;
  // A destructor cannot report; failures below leave at most a leaked communicator.
  static_cast<void>(scoped.enter(device_));
  if (async_error().ok()) {
    static_cast<void>(ncclCommDestroy(comm_));  // Finalizes first: pending work completes.
  } else {
    static_cast<void>(ncclCommAbort(comm_));  // A failed peer would never let it finish.
  }
  comm_ = nullptr;
}

Result<NcclComm> NcclComm::create(Backend& bootstrap, int device, const Status& prepared) {
  IdMessage message{};
  Status made;
  if (bootstrap.rank() == 0) {
    made = nccl_status(ncclGetUniqueId(&message.id), "ncclGetUniqueId");
    message.ok = made.ok() ? 1 : 0;
  }
  // Every member takes part in both collectives whatever happened locally: a member that
  // returned early would leave the others waiting in them.
  TUTTI_RETURN_IF_ERROR(bootstrap.broadcast(&message, sizeof(message), DataType::UInt8, 0));
  std::int32_t ready = prepared.ok() && message.ok != 0 ? 1 : 0;
  TUTTI_RETURN_IF_ERROR(bootstrap.allreduce(&ready, 1, DataType::Int32, WireOp::Min));
  if (!prepared.ok()) return prepared;
  if (!made.ok()) return made;
  if (message.ok == 0) {
    return Status(ErrorCode::Communication,
                  "NCCL communicator not created: set rank 0 could not make its unique id");
  }
  if (ready == 0) {
    return Status(ErrorCode::Communication,
                  "NCCL communicator not created: another member of the set failed to prepare");
  }
  cuda::ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(device));
  NcclComm comm;
  TUTTI_NCCL_RETURN_IF_ERROR(
      ncclCommInitRank(&comm.comm_, bootstrap.size(), message.id, bootstrap.rank()));
  comm.rank_ = bootstrap.rank();
  comm.size_ = bootstrap.size();
  comm.device_ = device;
  return comm;
}

Result<bool> NcclComm::one_device_per_rank(Backend& bootstrap, int device) {
  std::array<std::uint8_t, kUuidMessageBytes> mine{};
  Result<std::array<std::uint8_t, kUuidBytes>> uuid = device_uuid(device);
  if (uuid.ok()) {
    std::copy(uuid.value().begin(), uuid.value().end(), mine.begin());
    mine[kUuidBytes] = 1;
  }
  const auto size = static_cast<std::size_t>(bootstrap.size());
  std::vector<std::uint8_t> all(size * kUuidMessageBytes);
  const std::vector<std::size_t> counts(size, kUuidMessageBytes);
  TUTTI_RETURN_IF_ERROR(bootstrap.allgatherv(mine.data(), all.data(), counts, DataType::UInt8));
  if (!uuid.ok()) return uuid.status();
  std::vector<std::array<std::uint8_t, kUuidMessageBytes>> seen(size);
  for (std::size_t r = 0; r < size; ++r) {
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(r * kUuidMessageBytes), kUuidMessageBytes,
                seen[r].begin());
    if (seen[r][kUuidBytes] == 0) {
      return Status(ErrorCode::Communication,
                    detail::str_cat("set rank ", r, " could not identify its CUDA device"));
    }
  }
  std::sort(seen.begin(), seen.end());
  return std::adjacent_find(seen.begin(), seen.end()) == seen.end();
}

Status NcclComm::async_error() const {
  if (comm_ == nullptr) return Status();
  ncclResult_t result = ncclSuccess;
  TUTTI_RETURN_IF_ERROR(
      nccl_status(ncclCommGetAsyncError(comm_, &result), "ncclCommGetAsyncError", comm_));
  return nccl_status(result, "NCCL (asynchronously)", comm_);
}

}  // namespace tutti::ops::nccl

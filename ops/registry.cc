// SPDX-License-Identifier: Apache-2.0
// The one C++ file that knows which backends and device code were compiled in: TUTTI_HAVE_*
// is tested here and in meson.build files only.
#include "ops/registry.h"

#include <atomic>

#include "ops/device_ops.h"
#include "ops/mpi/host_staged_backend.h"
#include "src/base/device_memory.h"
#include "src/base/strings.h"
#include "tutti_config.h"
#if TUTTI_HAVE_CUDA
#include "ops/cuda/device_ops.h"
#endif
#if TUTTI_HAVE_NCCL
#include "ops/nccl/nccl_backend.h"
#include "ops/nccl/nccl_comm.h"
#endif

namespace tutti::ops {
namespace {

#if !TUTTI_HAVE_CUDA
// DeviceOps of a build without CUDA: device tensors are refused with a clear message.
class NoDeviceOps final : public DeviceOps {
 public:
  std::shared_ptr<void> allocate_zeroed(std::size_t, Device device) override {
    throw Error(ErrorCode::InvalidArgument, refusal(device));
  }
  Status copy_device_to_device(void*, const void*, std::size_t, Device device) override {
    return invalid_argument(refusal(device));
  }
  Status copy_to_host(void*, const void*, std::size_t, Device device) override {
    return invalid_argument(refusal(device));
  }
  Status copy_to_device(void*, const void*, std::size_t, Device device) override {
    return invalid_argument(refusal(device));
  }

 private:
  static std::string refusal(Device device) {
    return detail::str_cat("cuda:", device.index,
                           " tensors need a Tutti built with CUDA (meson -Dcuda=enabled)");
  }
};
#endif

#if TUTTI_HAVE_NCCL
Result<std::unique_ptr<Backend>> make_nccl_backend(Backend& host_backend, DeviceStream stream) {
  TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<nccl::NcclBackend> backend,
                         nccl::NcclBackend::create(host_backend, stream));
  return std::unique_ptr<Backend>(std::move(backend));
}
#endif

}  // namespace

bool built_with_cuda() { return TUTTI_HAVE_CUDA; }
bool built_with_nccl() { return TUTTI_HAVE_NCCL; }

namespace {
std::atomic<DeviceOps*> installed{nullptr};  // set_device_ops; null = this build's own.
}  // namespace

DeviceOps& device_ops() {
  if (DeviceOps* ops = installed.load(std::memory_order_acquire)) return *ops;
#if TUTTI_HAVE_CUDA
  return cuda::cuda_device_ops();
#else
  static NoDeviceOps none;
  return none;
#endif
}

void set_device_ops(DeviceOps* ops) { installed.store(ops, std::memory_order_release); }

namespace {

// Tensor's device memory (Note [Device memory registry] in src/base/device_memory.h): whatever
// device_ops() is at the time of the call, so a test's set_device_ops() applies to it too.
class RegisteredDeviceMemory final : public base::DeviceMemory {
 public:
  std::shared_ptr<void> allocate_zeroed(std::size_t bytes, Device device) override {
    return device_ops().allocate_zeroed(bytes, device);
  }
  void copy(void* destination, const void* source, std::size_t bytes, Device device) override {
    device_ops().copy_device_to_device(destination, source, bytes, device).throw_if_error();
  }
};

// Registered while the library loads, before any tensor can be made: core calls device_ops(),
// so every program that links Tutti's runtime links this file.
[[maybe_unused]] const bool device_memory_registered = [] {
  static RegisteredDeviceMemory memory;
  base::register_device_memory(&memory);
  return true;
}();

}  // namespace

Result<std::unique_ptr<Backend>> create_host_staged_backend(Backend& host_backend,
                                                            DeviceStream stream) {
  return std::unique_ptr<Backend>(std::make_unique<mpi::HostStagedBackend>(host_backend, stream));
}

Result<std::unique_ptr<Backend>> create_nccl_backend(Backend& host_backend, DeviceStream stream) {
#if TUTTI_HAVE_NCCL
  return make_nccl_backend(host_backend, stream);
#else
  static_cast<void>(host_backend);
  static_cast<void>(stream);
  return invalid_argument("this build has no NCCL");
#endif
}

Result<std::unique_ptr<Backend>> create_device_backend(Backend& host_backend, DeviceStream stream,
                                                       DeviceBackendKind kind) {
  // An installed DeviceOps (a simulated device) is only reachable through DeviceOps.
  if (kind == DeviceBackendKind::HostStaged || installed.load() != nullptr)
    return create_host_staged_backend(host_backend, stream);
#if TUTTI_HAVE_NCCL
  TUTTI_ASSIGN_OR_RETURN(bool own_devices,
                         nccl::NcclComm::one_device_per_rank(host_backend, stream.device.index));
  if (own_devices) return make_nccl_backend(host_backend, stream);
  if (kind == DeviceBackendKind::Nccl) {
    return invalid_argument(
        "NCCL needs a GPU of its own per rank, and members of this process set share one");
  }
#else
  if (kind == DeviceBackendKind::Nccl) return invalid_argument("this build has no NCCL");
#endif
  return create_host_staged_backend(host_backend, stream);
}

}  // namespace tutti::ops

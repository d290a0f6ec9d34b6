// SPDX-License-Identifier: Apache-2.0
#include "ops/registry.h"

#include "ops/device_ops.h"
#include "src/common/strings.h"
#include "tutti_config.h"

namespace tutti::ops {
namespace {

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

}  // namespace

bool built_with_cuda() { return TUTTI_HAVE_CUDA; }
bool built_with_nccl() { return TUTTI_HAVE_NCCL; }

DeviceOps& device_ops() {
  static NoDeviceOps none;
  return none;
}

}  // namespace tutti::ops

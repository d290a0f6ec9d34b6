// SPDX-License-Identifier: Apache-2.0
// LibTorch state as bytes: an optimizer's state and hyper-parameters, for
// broadcast_optimizer_state() and stateful(optimizer), in LibTorch's own archive, whose load()
// restores the state but not the groups' options, so each group's options travel in an
// archive of their own. (state_bytes.cc also defines stateful(), tutti/libtorch.h: one
// translation unit less of LibTorch's slow headers.)
#pragma once

#include <torch/torch.h>

#include <string>
#include <string_view>

namespace tutti::libtorch::internal {

// `optimizer`'s state, and each parameter group's options, as bytes.
std::string save_optimizer(torch::optim::Optimizer& optimizer);

// Replaces `optimizer`'s state (entries the bytes lack too) and its groups' options with
// those in `bytes` (save_optimizer()'s). Throws Error(InvalidArgument) for bytes that hold
// another number of parameter groups, changing nothing; LibTorch's load throws c10::Error for
// a group of another size or unreadable bytes, and then the state may be half replaced.
void load_optimizer(torch::optim::Optimizer& optimizer, std::string_view bytes);

}  // namespace tutti::libtorch::internal

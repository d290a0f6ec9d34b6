// SPDX-License-Identifier: Apache-2.0
// fashion_mnist's checkpoint file (--checkpoint): the model's parameters and BatchNorm
// statistics, the optimizer's state and the epochs done, checksummed, written atomically.
#pragma once

#include <tutti/nn.h>
#include <tutti/optim.h>

#include <cstdint>
#include <string>

namespace fashion_mnist {

// Writes aside, flushes to disk, then renames: a crash leaves the old checkpoint or the new one.
// Throws std::runtime_error naming the file if it cannot be written.
void save_checkpoint(const std::string& path, std::int64_t epochs, const tutti::nn::Module& model,
                     const tutti::optim::Optimizer& optimizer);

// Loads `path` into the model and the optimizer and returns the epochs done, at most
// `max_epochs`. Throws std::runtime_error naming the file if it is damaged (checksum), of the
// old format, out of range or holds another model; the model is then untouched.
std::int64_t load_checkpoint(const std::string& path, tutti::nn::Module& model,
                             tutti::optim::Optimizer& optimizer, std::int64_t max_epochs);

}  // namespace fashion_mnist

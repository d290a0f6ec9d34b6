// SPDX-License-Identifier: Apache-2.0
// One registered piece of an elastic::State: a key and a reference to the loop's own object.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/data/distributed_sampler.h"
#include "tutti/elastic.h"
#include "tutti/nn/module.h"
#include "tutti/optim/optimizer.h"

namespace tutti::elastic::internal {

// The kinds State::add() accepts; the value is stored in commit files, so enumerators keep
// their numbers.
enum class EntryKind : std::uint8_t {
  Parameters = 0,
  Optimizer = 1,
  Sampler = 2,
  Int64 = 3,
  Bytes = 4,
  Stateful = 5
};
inline constexpr int kEntryKindCount = 6;

std::string_view to_string(EntryKind kind);

// Exactly the member of `kind` is set. The referenced objects belong to the training loop.
struct Entry {
  std::string key;
  EntryKind kind = EntryKind::Int64;
  nn::NamedParameters parameters;
  optim::Optimizer* optimizer = nullptr;
  data::DistributedSampler* sampler = nullptr;
  std::int64_t* value = nullptr;
  std::vector<std::uint8_t>* bytes = nullptr;
  Stateful object;
};

}  // namespace tutti::elastic::internal

// SPDX-License-Identifier: Apache-2.0
// Collectives Tutti runs for its own API calls (start_timeline, init_rpc), under names reserved
// for it ("tutti.", which user ops may not use; see collectives.h), so that they never match a
// user's op.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tutti/process_set.h"

namespace tutti::core {

// Every rank of `set` gets root_rank's `bytes` (others' are ignored). Collective and
// blocking, like broadcast_object; `name` must start with "tutti.". Throws as a broadcast does.
std::string broadcast_own(std::string_view bytes, int root_rank, const std::string& name,
                          ProcessSet set = ProcessSet::global());

// Every rank of the global set gets every rank's `bytes`, by rank. Collective and blocking,
// like allgather_object; `name` must start with "tutti.". Throws as an allgather does.
std::vector<std::string> allgather_own(std::string_view bytes, const std::string& name);

}  // namespace tutti::core

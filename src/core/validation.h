// SPDX-License-Identifier: Apache-2.0
// The coordinator's check that every rank submitted the same op, turning the requests of all
// ranks into one Response (an error Response naming both conflicting values if they differ).
#pragma once

#include <memory>
#include <vector>

#include "src/core/request.h"

namespace tutti::core {

// `requests[i]` is the request of the set member with global rank `global_ranks[i]`; none is
// null. Pure function.
Response negotiate_response(const std::vector<int>& global_ranks,
                            const std::vector<std::shared_ptr<const Request>>& requests);

}  // namespace tutti::core

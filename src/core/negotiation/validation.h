// SPDX-License-Identifier: Apache-2.0
// The coordinator's check that every rank submitted the same op, turning the requests of all
// ranks into one Response (an error Response naming both conflicting values if they differ).
#pragma once

#include <memory>
#include <vector>

#include "src/core/request.h"

namespace tutti::core {

// `requests[i]` is the request of the set member with global rank `global_ranks[i]`, or null
// for a member that joined without submitting it (at least one is not null). `joined` are the
// global ranks that have joined the set so far (see Note [Join] in controller.h): ops that
// cannot do without a member's data fail with InvalidArgument then. Pure function.
Response negotiate_response(const std::vector<int>& global_ranks,
                            const std::vector<std::shared_ptr<const Request>>& requests,
                            const std::vector<int>& joined = {});

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// The names of ops submitted without one: made, recognised, and their number taken off.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "src/base/inline_string.h"
#include "src/core/request.h"

namespace tutti::core {

// Note [Automatic names]
// An op submitted without a name gets "<op>.noname.<n>", n counting unnamed ops per process
// set from 0 in each session. Ranks agree on the name only if they submit unnamed ops in the
// same order, as API.md tells users. Such a name never comes back in its session (the count
// only grows; a rank that joined moves it past the names it executed, TensorQueue::
// skip_automatic_name()), so the coordinator never caches its response: it could never hit,
// and each insert would evict a name that can (Note [Automatic names are not cached] in
// negotiation/coordinator.cc). A name the user gives in that form is taken as automatic too.

// "<op, lower case>.noname.<n>".
base::InlineString automatic_name(Collective op, std::uint64_t n);
// n, if `name` ends in ".noname.<n>" (decimal digits, within uint64); nullopt otherwise.
std::optional<std::uint64_t> automatic_number(std::string_view name);
// `name` without the number of an automatic name ("allreduce.noname.17" -> "allreduce.noname");
// any other name as it is.
std::string_view without_automatic_number(std::string_view name);

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// API.md's process sets.
#include "src/common/strings.h"
#include "src/core/runtime.h"
#include "tutti/process_set.h"

namespace tutti {
namespace {

core::SetInfo lookup(int id) {
  return core::Runtime::get().session().value_or_throw()->process_set(id).value_or_throw();
}

}  // namespace

const std::vector<int>& ProcessSet::ranks() const {
  ranks_ = lookup(id_).ranks;
  return *ranks_;
}

bool ProcessSet::included() const { return lookup(id_).set_rank >= 0; }

int ProcessSet::rank() const {
  const core::SetInfo set = lookup(id_);
  if (set.set_rank < 0) {
    throw Error(ErrorCode::InvalidArgument, detail::str_cat("this rank is not in process set ", id_));
  }
  return set.set_rank;
}

int ProcessSet::size() const { return static_cast<int>(lookup(id_).ranks->size()); }

ProcessSet add_process_set(std::vector<int>) {
  throw Error(ErrorCode::InvalidArgument, "add_process_set is not implemented yet");
}

void remove_process_set(const ProcessSet&) {
  throw Error(ErrorCode::InvalidArgument, "remove_process_set is not implemented yet");
}

}  // namespace tutti

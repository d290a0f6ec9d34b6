// SPDX-License-Identifier: Apache-2.0
// API.md's process sets.
#include "tutti/process_set.h"

#include <algorithm>
#include <chrono>

#include "src/base/strings.h"
#include "src/core/op_state.h"
#include "src/core/runtime.h"

namespace tutti {
namespace {

core::SetInfo lookup(int id) {
  return core::Runtime::get().session().value_or_throw()->process_set(id).value_or_throw();
}

}  // namespace

// The list is interned for the life of the process (see core::SetInfo::ranks), so the
// reference stays valid after the set or the session is gone, and two threads may call this
// at once.
const std::vector<int>& ProcessSet::ranks() const { return *lookup(id_).ranks; }

bool ProcessSet::included() const { return lookup(id_).includes_me(); }

int ProcessSet::rank() const {
  const core::SetInfo set = lookup(id_);
  if (set.set_rank < 0) {
    throw Error(ErrorCode::InvalidArgument,
                detail::str_cat("this rank is not in process set ", id_));
  }
  return set.set_rank;
}

int ProcessSet::size() const { return lookup(id_).size(); }

// Process-set changes are ops on the global set, so the coordinator orders them with every
// other op and numbers new sets; each rank creates or frees the communicator when it executes
// the response (see ResponseExecutor::add_process_set). Blocking: the set is usable on return.
namespace {

// Submits a set change under this rank's next change number and waits for its outcome.
std::shared_ptr<detail::OpState> change_sets(core::Session& session, core::Request request) {
  auto entry = std::make_shared<core::Entry>();
  request.process_set_id = 0;
  request.name = detail::str_cat("tutti.process_set.", session.next_set_change());
  entry->request = std::move(request);
  entry->state = std::make_shared<detail::OpState>();
  entry->submitted = std::chrono::steady_clock::now();
  std::shared_ptr<detail::OpState> state = entry->state;
  session.submit(std::move(entry)).throw_if_error();
  state->wait().throw_if_error();
  return state;
}

}  // namespace

ProcessSet add_process_set(std::vector<int> ranks) {
  std::shared_ptr<core::Session> session = core::Runtime::get().session_for_op().value_or_throw();
  const int size = session->topology().size;
  auto invalid = [&](const std::string& why) {
    throw Error(ErrorCode::InvalidArgument, detail::str_cat("ADD_PROCESS_SET of ranks [",
                                                            detail::join_list(ranks), "]: ", why));
  };
  if (ranks.empty()) invalid("a process set needs at least one rank");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= size) {
      invalid(detail::str_cat("rank ", sorted[i], " is outside the job's ranks 0..", size - 1));
    }
    if (i > 0 && sorted[i] == sorted[i - 1])
      invalid(detail::str_cat("rank ", sorted[i], " is repeated"));
  }
  core::Request request;
  request.op = core::Collective::AddProcessSet;
  request.set_ranks = std::move(ranks);
  return ProcessSet(change_sets(*session, std::move(request))->results().created_set_id);
}

void remove_process_set(const ProcessSet& set) {
  std::shared_ptr<core::Session> session = core::Runtime::get().session_for_op().value_or_throw();
  if (set.id() == 0) {
    throw Error(ErrorCode::InvalidArgument,
                "REMOVE_PROCESS_SET: the global process set (0) cannot be removed");
  }
  if (!session->process_set(set.id()).ok()) {
    throw Error(ErrorCode::InvalidArgument,
                detail::str_cat("REMOVE_PROCESS_SET: process set ", set.id(), " does not exist"));
  }
  core::Request request;
  request.op = core::Collective::RemoveProcessSet;
  request.target_set_id = set.id();
  change_sets(*session, std::move(request));
}

}  // namespace tutti

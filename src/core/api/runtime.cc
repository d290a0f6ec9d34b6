// SPDX-License-Identifier: Apache-2.0
// API.md's runtime functions.
#include "src/core/runtime.h"

#include "ops/registry.h"
#include "src/core/own_ops.h"
#include "tutti/runtime.h"

namespace tutti {
namespace {

ops::Topology topology() { return core::Runtime::get().topology().value_or_throw(); }

}  // namespace

void init() { core::Runtime::get().init(nullptr).throw_if_error(); }
void shutdown() { core::Runtime::get().shutdown(); }
bool is_initialized() { return core::Runtime::get().initialized(); }
int rank() { return topology().rank; }
int size() { return topology().size; }
int local_rank() { return topology().local_rank; }
int local_size() { return topology().local_size; }
int cross_rank() { return topology().cross_rank; }
int cross_size() { return topology().cross_size; }
bool is_homogeneous() { return topology().homogeneous; }
bool mpi_threads_supported() { return topology().threads_multiple; }
bool cores_shared() { return topology().cores_shared; }

int default_gradient_groups() {
  Result<std::shared_ptr<core::Session>> session = core::Runtime::get().session();
  if (!session.ok()) return 0;
  switch (session.value()->config().gradient_grouping) {
    case core::Config::GradientGrouping::Each: return 0;
    case core::Config::GradientGrouping::One: return 1;
    case core::Config::GradientGrouping::Auto: break;
  }
  return session.value()->topology().cores_shared ? 1 : 0;
}
bool cuda_built() { return ops::built_with_cuda(); }
bool nccl_built() { return ops::built_with_nccl(); }

void start_timeline(const std::string& path, bool mark_cycles) {
  // Only rank 0 writes the file, but the call is collective: every rank gets rank 0's outcome,
  // so a path rank 0 cannot open fails the call everywhere, with the same message.
  std::shared_ptr<core::Session> session = core::Runtime::get().session().value_or_throw();
  std::string failure;
  if (session->topology().rank == 0) {
    const Status started = session->start_timeline(path, mark_cycles);
    if (!started.ok()) failure = started.message();
  }
  failure = core::broadcast_own(failure, 0, "tutti.start_timeline");
  if (!failure.empty()) throw Error(ErrorCode::InvalidArgument, failure);
}

void stop_timeline() { core::Runtime::get().session().value_or_throw()->stop_timeline(); }

}  // namespace tutti

// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/mpi_hierarchy.h"

#include <vector>

#include "ops/hierarchical/calibration.h"
#include "ops/hierarchical/hierarchical_backend.h"
#include "ops/hierarchical/host_layout.h"
#include "ops/mpi/mpi_backend.h"
#include "ops/mpi/mpi_error.h"
#include "ops/shm/shm_backend.h"
#include "src/base/strings.h"
#include "src/common/logging.h"

namespace tutti::ops::mpi {
namespace {

// Collective: an identifier of this rank's host, equal on its members and unique among hosts
// (the lowest rank of `comm` on the host).
Result<int> host_id(const MpiComm& comm) {
  MPI_Comm shared = MPI_COMM_NULL;
  TUTTI_MPI_RETURN_IF_ERROR(
      MPI_Comm_split_type(comm.get(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &shared));
  int lowest = comm.rank();
  const int code = MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, shared);
  MPI_Comm_free(&shared);
  TUTTI_MPI_RETURN_IF_ERROR(code);
  return lowest;
}

std::string members_per_host(const hierarchical::HostLayout& layout) {
  std::vector<std::size_t> sizes;
  for (const std::vector<int>& host : layout.members) sizes.push_back(host.size());
  return detail::join_list(sizes, "+");
}

std::string threshold_text(std::size_t bytes) {
  if (bytes == hierarchical::HierarchicalBackend::kNever) return "never";
  return bytes == 0 ? "at every size" : detail::str_cat("from ", bytes >> 10, " KiB");
}

}  // namespace

Result<std::unique_ptr<Backend>> make_set_backend(MpiComm comm, const BackendOptions& options) {
  const HierarchyOptions& hierarchy = options.hierarchy;
  if (!hierarchy.any()) return shm::create_host_backend(std::move(comm), options);
  TUTTI_ASSIGN_OR_RETURN(int id, host_id(comm));
  std::vector<int> ids(static_cast<std::size_t>(comm.size()));
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Allgather(&id, 1, MPI_INT, ids.data(), 1, MPI_INT, comm.get()));
  hierarchical::HostLayout layout = hierarchical::layout_from_host_ids(ids);
  if (!layout.hierarchical()) {
    // Asked for outright, the user learns why it does not apply; auto stays quiet.
    if (hierarchy.allreduce == HierarchyMode::On || hierarchy.allgather == HierarchyMode::On) {
      TUTTI_LOG_INFO("a process set of ", comm.size(), " ranks on ", layout.hosts(),
                     " host(s) with ", members_per_host(layout),
                     " members runs flat collectives: hierarchical ones need at least 2 hosts "
                     "with the same number (at least 2) of members each");
    }
    return shm::create_host_backend(std::move(comm), options);
  }
  const int me = comm.rank();
  const auto r = static_cast<std::size_t>(me);
  TUTTI_ASSIGN_OR_RETURN(MpiComm local, MpiComm::split(comm.get(), layout.host_of[r], me));
  TUTTI_ASSIGN_OR_RETURN(MpiComm cross,
                         MpiComm::split(comm.get(), layout.local_index_of[r], layout.host_of[r]));
  // Within a host, shared memory where TUTTI_HOST_TRANSPORT allows (the local communicator is
  // all on one host).
  TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<Backend> intra,
                         shm::create_host_backend(std::move(local), options));
  hierarchical::HierarchicalBackend::Parts parts{
      .flat = std::make_unique<MpiBackend>(std::move(comm)),
      .local = std::move(intra),
      .cross = std::make_unique<MpiBackend>(std::move(cross))};
  auto backend = std::make_unique<hierarchical::HierarchicalBackend>(
      std::move(parts), std::move(layout), hierarchical::HierarchicalBackend::Thresholds{});
  std::string report;
  TUTTI_RETURN_IF_ERROR(hierarchical::settle_thresholds(*backend, hierarchy, &report));
  TUTTI_LOG_INFO("a process set of ", backend->size(), " ranks on ", backend->layout().hosts(),
                 " hosts x ", backend->layout().members.front().size(),
                 " (within a host: ", backend->local_name(),
                 "): ", report.empty() ? "" : "measured ", report, "hierarchical allreduce ",
                 threshold_text(backend->thresholds().allreduce_bytes), ", allgather ",
                 threshold_text(backend->thresholds().allgather_bytes));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace tutti::ops::mpi

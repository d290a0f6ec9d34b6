// SPDX-License-Identifier: Apache-2.0
#include "src/core/process_set_table.h"

#include <algorithm>
#include <set>

#include "ops/device_ops.h"
#include "ops/registry.h"
#include "src/base/strings.h"
#include "src/common/check.h"
#include "src/common/logging.h"

namespace tutti::core {
namespace {

// The one copy of each distinct rank list ever used, never freed: sets are few, and
// ProcessSet::ranks() returns references that must stay valid (see SetInfo::ranks).
const std::vector<int>* intern(const std::vector<int>& ranks) {
  static detail::Mutex mutex;
  static std::set<std::vector<int>>* lists = new std::set<std::vector<int>>();
  detail::MutexLock lock(mutex);
  return &*lists->insert(ranks).first;
}

}  // namespace

int SetInfo::set_rank_of(int global_rank) const {
  // Most sets (the global one first) list the ranks from 0 up without gaps.
  const std::size_t at = static_cast<std::size_t>(global_rank);
  if (global_rank >= 0 && at < ranks->size() && (*ranks)[at] == global_rank) return global_rank;
  const auto it = std::lower_bound(ranks->begin(), ranks->end(), global_rank);
  return it != ranks->end() && *it == global_rank ? static_cast<int>(it - ranks->begin()) : -1;
}

Result<SetInfo> ProcessSetTable::find(int id) const {
  detail::MutexLock lock(mutex_);
  auto it = infos_.find(id);
  if (it == infos_.end()) return invalid_argument(detail::str_cat("unknown process set ", id));
  return it->second;
}

std::vector<SetInfo> ProcessSetTable::all() const {
  detail::MutexLock lock(mutex_);
  std::vector<SetInfo> result;
  for (const auto& [id, info] : infos_) result.push_back(info);
  return result;
}

bool ProcessSetTable::every_set_includes(int global_rank) const {
  detail::MutexLock lock(mutex_);
  return std::all_of(infos_.begin(), infos_.end(), [global_rank](const auto& id_and_info) {
    return id_and_info.second.set_rank_of(global_rank) >= 0;
  });
}

std::map<int, std::vector<int>> ProcessSetTable::membership() const {
  detail::MutexLock lock(mutex_);
  std::map<int, std::vector<int>> sets;
  for (const auto& [id, info] : infos_) sets.emplace(id, *info.ranks);
  return sets;
}

Status ProcessSetTable::add(int id, const std::vector<int>& sorted_global_ranks) {
  TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<ops::Backend> host,
                         transport_.create_backend(sorted_global_ranks, options_));
  SetInfo info{.id = id, .ranks = intern(sorted_global_ranks), .set_rank = -1};
  info.set_rank = info.set_rank_of(transport_.topology().rank);
  if (host != nullptr) {
    if (host_routes_) host->route_host(*host_routes_);
    backends_[id].host = std::move(host);
  }
  detail::MutexLock lock(mutex_);
  infos_[id] = info;
  return Status();
}

void ProcessSetTable::remove(int id) {
  {
    detail::MutexLock lock(mutex_);
    infos_.erase(id);
  }
  auto it = backends_.find(id);
  if (it == backends_.end()) return;
  // Device backends first: they run over the host backend and their streams may still work.
  for (auto& [index, lane] : it->second.device) {
    static_cast<void>(ops::device_ops().synchronize(lane.first));  // Best effort.
  }
  backends_.erase(it);
}

void ProcessSetTable::clear(bool after_error) {
  {
    detail::MutexLock lock(mutex_);
    infos_.clear();
  }
  if (after_error) {
    for (auto& [id, backends] : backends_) {
      if (backends.host != nullptr) backends.host->abandon();
    }
  }
  for (auto& [id, backends] : backends_) backends.device.clear();
  backends_.clear();
}

ops::Backend& ProcessSetTable::host_backend(int id) {
  auto it = backends_.find(id);
  TUTTI_CHECK(it != backends_.end() && it->second.host != nullptr, "no backend for process set ",
              id, " on this rank");
  return *it->second.host;
}

void ProcessSetTable::route_host(ops::HostRoutes over_mpi) {
  host_routes_ = over_mpi;
  for (auto& [id, backends] : backends_) {
    if (backends.host != nullptr) backends.host->route_host(over_mpi);
  }
}

bool ProcessSetTable::routes_host(int id) const {
  auto it = backends_.find(id);
  return it != backends_.end() && it->second.host != nullptr && it->second.host->routes_host();
}

Result<ProcessSetTable::DeviceLane> ProcessSetTable::next_device_lane(int id, Device device) {
  Backends& backends = backends_.at(id);
  const int index = backends.device_batches++ % num_device_streams_;
  auto lane = backends.device.find(index);
  if (lane == backends.device.end()) {
    const ops::DeviceStream stream{.device = device, .index = index};
    TUTTI_CHECK(backends.host != nullptr, "a device lane of process set ", id,
                " on a rank outside it");
    TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<ops::Backend> backend,
                           ops::create_device_backend(*backends.host, stream));
    TUTTI_LOG_DEBUG("process set ", id, " stream ", index, ": ", backend->name());
    lane = backends.device.emplace(index, std::make_pair(stream, std::move(backend))).first;
  }
  return DeviceLane{.backend = lane->second.second.get(), .stream = lane->second.first};
}

Status ProcessSetTable::device_async_error() {
  for (auto& [id, backends] : backends_) {
    for (auto& [index, lane] : backends.device) {
      TUTTI_RETURN_IF_ERROR(lane.second->async_error());
    }
  }
  return Status();
}

}  // namespace tutti::core

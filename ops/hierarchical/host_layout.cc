// SPDX-License-Identifier: Apache-2.0
#include "ops/hierarchical/host_layout.h"

#include <map>

namespace tutti::ops::hierarchical {

bool HostLayout::uniform() const {
  for (const std::vector<int>& host : members) {
    if (host.size() != members.front().size()) return false;
  }
  return true;
}

bool HostLayout::contiguous() const {
  int expected = 0;
  for (const std::vector<int>& host : members) {
    for (int set_rank : host) {
      if (set_rank != expected++) return false;
    }
  }
  return true;
}

bool HostLayout::hierarchical() const {
  return hosts() >= 2 && uniform() && members.front().size() >= 2;
}

HostLayout layout_from_host_ids(std::span<const int> host_id_of) {
  HostLayout layout;
  std::map<int, int> host_of_id;  // Host identifier -> host index, by first appearance.
  for (std::size_t r = 0; r < host_id_of.size(); ++r) {
    // Set ranks are visited in order, so hosts are numbered by their lowest set rank and each
    // host's member list comes out sorted.
    auto [it, added] = host_of_id.emplace(host_id_of[r], layout.hosts());
    if (added) layout.members.emplace_back();
    std::vector<int>& members = layout.members[static_cast<std::size_t>(it->second)];
    layout.host_of.push_back(it->second);
    layout.local_index_of.push_back(static_cast<int>(members.size()));
    members.push_back(static_cast<int>(r));
  }
  return layout;
}

std::vector<std::size_t> split_evenly(std::size_t count, int parts) {
  const auto n = static_cast<std::size_t>(parts);
  std::vector<std::size_t> slices(n, count / n);
  for (std::size_t i = 0; i < count % n; ++i) ++slices[i];
  return slices;
}

}  // namespace tutti::ops::hierarchical

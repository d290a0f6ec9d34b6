// SPDX-License-Identifier: Apache-2.0
// Where the members of a process set live: which host each set rank is on, and its index
// among that host's members. The hierarchical backend's schedule is computed from it, on every
// member alike.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace tutti::ops::hierarchical {

struct HostLayout {
  // Per set rank: its host (0 ... hosts-1, hosts numbered in the order of their lowest set
  // rank) and its local index (its place among its host's members, in set-rank order).
  std::vector<int> host_of;
  std::vector<int> local_index_of;
  // Per host: its members' set ranks, ascending.
  std::vector<std::vector<int>> members;

  int hosts() const { return static_cast<int>(members.size()); }
  int size() const { return static_cast<int>(host_of.size()); }
  // Whether every host has the same number of members.
  bool uniform() const;
  // Whether hosts hold consecutive set ranks in host order (set rank = host·L + local index),
  // so that host blocks laid end to end are already in set-rank order.
  bool contiguous() const;
  // Whether a hierarchical schedule applies: at least two hosts, each with the same number
  // (at least two) of members. Otherwise the flat algorithms are all there is to run.
  bool hierarchical() const;
};

// The layout from, per set rank, an identifier of its host that every member of that host
// shares and no other host uses (the MPI transport uses the set rank of the host's first
// member). Pure: the same input gives the same layout on every rank.
HostLayout layout_from_host_ids(std::span<const int> host_id_of);

// The split of `count` elements into `parts` consecutive slices, the first count % parts one
// element longer: the slice each local index reduces in a hierarchical allreduce.
std::vector<std::size_t> split_evenly(std::size_t count, int parts);

}  // namespace tutti::ops::hierarchical

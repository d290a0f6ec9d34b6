// SPDX-License-Identifier: Apache-2.0
// Which collectives of a process set that spans several hosts run hierarchically (intra-host,
// then cross-host, then intra-host again) instead of over all members at once: the Job knobs
// TUTTI_HIERARCHICAL_ALLREDUCE and TUTTI_HIERARCHICAL_ALLGATHER, agreed at init (Note [Agreed
// settings] in src/core/start_handshake.h), so every member builds the same backend.
#pragma once

namespace tutti::ops {

struct HierarchyOptions {
  bool allreduce = false;
  bool allgather = false;

  bool any() const { return allreduce || allgather; }
};

}  // namespace tutti::ops

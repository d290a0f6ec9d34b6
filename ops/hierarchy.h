// SPDX-License-Identifier: Apache-2.0
// Which collectives of a process set that spans several hosts run hierarchically (intra-host,
// then cross-host, then intra-host again) instead of over all members at once: the Job knobs
// TUTTI_HIERARCHICAL_ALLREDUCE and TUTTI_HIERARCHICAL_ALLGATHER, agreed at init (Note [Agreed
// settings] in src/core/start_handshake.h), so every member builds the same backend.
#pragma once

#include <cstdint>

namespace tutti::ops {

enum class HierarchyMode : std::uint8_t {
  Off,   // Flat at every size.
  On,    // Hierarchical at every size.
  Auto,  // Hierarchical from the sizes at which it measured faster: see Note [Automatic
         // hierarchy] in ops/hierarchical/calibration.h.
};

struct HierarchyOptions {
  HierarchyMode allreduce = HierarchyMode::Off;
  HierarchyMode allgather = HierarchyMode::Off;

  bool any() const { return allreduce != HierarchyMode::Off || allgather != HierarchyMode::Off; }
};

}  // namespace tutti::ops

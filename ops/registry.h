// SPDX-License-Identifier: Apache-2.0
// What this build contains. The only place that tests TUTTI_HAVE_* (STYLE.md 0.4).
#pragma once

namespace tutti::ops {

bool built_with_cuda();
bool built_with_nccl();

}  // namespace tutti::ops

// SPDX-License-Identifier: Apache-2.0
// The whole core API: runtime, tensors, process sets, collectives, CUDA stream ordering,
// errors, the flight recorder.
#pragma once

#include "tutti/collectives.h"  // IWYU pragma: export
#include "tutti/cuda.h"         // IWYU pragma: export
#include "tutti/debug.h"        // IWYU pragma: export
#include "tutti/error.h"        // IWYU pragma: export
#include "tutti/half.h"         // IWYU pragma: export
#include "tutti/p2p.h"          // IWYU pragma: export
#include "tutti/process_set.h"  // IWYU pragma: export
#include "tutti/runtime.h"      // IWYU pragma: export
#include "tutti/tensor.h"       // IWYU pragma: export

// SPDX-License-Identifier: Apache-2.0
// Optimizers and the distributed optimizer (API.md, "tutti/optim.h"): SGD, Adam, AdamW, the
// Optimizer base for user-defined rules, DistributedOptimizer (gradient allreduce overlapped
// with backward()), ZeroRedundancyOptimizer (optimizer state sharded across ranks) and the
// broadcast helpers that start every rank from the same state.
#pragma once

#include "tutti/optim/adam.h"                   // IWYU pragma: export
#include "tutti/optim/broadcast.h"              // IWYU pragma: export
#include "tutti/optim/distributed_optimizer.h"  // IWYU pragma: export
#include "tutti/optim/distributed_options.h"    // IWYU pragma: export
#include "tutti/optim/optimizer.h"              // IWYU pragma: export
#include "tutti/optim/sgd.h"                    // IWYU pragma: export
#include "tutti/optim/zero.h"                   // IWYU pragma: export

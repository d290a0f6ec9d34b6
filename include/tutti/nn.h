// SPDX-License-Identifier: Apache-2.0
// The neural-network layer (API.md, "tutti/nn.h"): Variable with reverse-mode autograd, modules,
// layers, losses, the differentiable functions they are built from, and the data-parallel
// wrappers (DistributedDataParallel with its communication hooks, SyncBatchNorm, DataParallel)
// and model averaging for local SGD.
#pragma once

#include "tutti/nn/activations.h"      // IWYU pragma: export
#include "tutti/nn/batch_norm.h"       // IWYU pragma: export
#include "tutti/nn/comm_hooks.h"       // IWYU pragma: export
#include "tutti/nn/conv2d.h"           // IWYU pragma: export
#include "tutti/nn/flatten.h"          // IWYU pragma: export
#include "tutti/nn/functional.h"       // IWYU pragma: export
#include "tutti/nn/linear.h"           // IWYU pragma: export
#include "tutti/nn/losses.h"           // IWYU pragma: export
#include "tutti/nn/model_averaging.h"  // IWYU pragma: export
#include "tutti/nn/module.h"           // IWYU pragma: export
#include "tutti/nn/parallel.h"         // IWYU pragma: export
#include "tutti/nn/pooling.h"          // IWYU pragma: export
#include "tutti/nn/random.h"           // IWYU pragma: export
#include "tutti/nn/sequential.h"       // IWYU pragma: export
#include "tutti/nn/variable.h"         // IWYU pragma: export

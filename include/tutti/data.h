// SPDX-License-Identifier: Apache-2.0
// Data sets and sampling for data-parallel training (API.md, "tutti/data.h"): a sampler that
// gives each rank its disjoint share of a data set, and an MNIST / Fashion-MNIST idx loader.
#pragma once

#include "tutti/data/distributed_sampler.h"  // IWYU pragma: export
#include "tutti/data/mnist_idx.h"            // IWYU pragma: export

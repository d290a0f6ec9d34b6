// SPDX-License-Identifier: Apache-2.0
// Broadcast helpers that give every rank the root's model and optimizer state, as training
// must start from (Horovod's broadcast_parameters and broadcast_optimizer_state).
#pragma once

#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/optim/optimizer.h"
#include "tutti/process_set.h"

namespace tutti::optim {

// Overwrites, on every member of `process_set`, each variable's value() with the root's, in
// place. Use it after building the model and before training; model.named_buffers() can be
// passed the same way (BatchNorm statistics). Each variable is broadcast under the name
// "broadcast_parameters.<name>"; all broadcasts are started, then all are waited for.
//
// Collective over the set: every member passes the same names with the same shapes (in any
// order) and the same `root_rank` (a global rank in the set). Blocking.
// Throws Error(InvalidArgument) for a repeated name or an empty Variable (before anything is
// sent); the runtime's errors (Mismatch for different shapes, ...) propagate after every
// broadcast has been waited for.
TUTTI_API void broadcast_parameters(const nn::NamedParameters& params, int root_rank,
                                    ProcessSet process_set = ProcessSet::global());

// Makes every member's optimizer.state_dict() equal to the root's, tensors and scalars, also
// before the first step (when some ranks may have created state the root has not, or the
// reverse): state the root lacks is dropped, state only the root has is created.
// Protocol: the root's tensor keys, dtypes and shapes and its scalar names travel with
// broadcast_object ("broadcast_optimizer_state.keys"); each tensor is then broadcast under
// "broadcast_optimizer_state.<key>" and the scalars packed in one Float64 tensor
// ("broadcast_optimizer_state.scalars"); finally optimizer.load_state_dict() takes the result.
// For a DistributedOptimizer this is its inner optimizer's state.
//
// Only the root's state_dict() is needed: another rank starts from its own where it can get it
// (its tensors of the root's key, dtype and shape are reused) and from an empty one where its
// state_dict() throws, as a ZeroRedundancyOptimizer's does on every rank but the one it
// consolidated to. So `zero.consolidate_state_dict(root); broadcast_optimizer_state(zero,
// root);` gives every member the consolidated state. If the root's state_dict() throws (a
// ZeroRedundancyOptimizer not consolidated to the root), every member throws InvalidArgument
// naming it, before any tensor is sent.
//
// Collective over the set; blocking; the optimizers must be of the same type over the same
// parameter shapes (load_state_dict()'s InvalidArgument otherwise).
TUTTI_API void broadcast_optimizer_state(Optimizer& optimizer, int root_rank,
                                         ProcessSet process_set = ProcessSet::global());

}  // namespace tutti::optim

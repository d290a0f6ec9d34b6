// SPDX-License-Identifier: Apache-2.0
// The owner's side of rpc::DistributedOptimizer: the registry of optimizer factories and the
// local optimizers that owners build and step on a trainer's request.
#pragma once

#include <string>

#include "src/common/status.h"
#include "tutti/rpc.h"

namespace tutti::rpc::detail {

class Agent;

// The factory registered as `name` ("sgd", "adam" and "adamw" are built in), or InvalidArgument.
Result<OptimizerFactory> find_optimizer_factory(const std::string& name);
// "tutti.optim.create", "tutti.optim.step" and "tutti.optim.destroy".
void register_optimizer_handlers(Agent& agent);

}  // namespace tutti::rpc::detail

// SPDX-License-Identifier: Apache-2.0
// Between rpc::Message and its wire form (Agent::to_wire / Agent::from_wire live in
// serialize.cc): tensors by value, RRefs through the fork protocol, distributed autograd's recv
// ends for tensors that carry gradients back.
#pragma once

#include "src/common/status.h"
#include "tutti/rpc.h"

namespace tutti::rpc::detail {

class Agent;

// OK if `message` can be sent by `agent`: no empty Variable, no empty RRef, no RRef of another
// agent (an earlier init_rpc(), or another rank of a unit test); else InvalidArgument.
Status check_message(const Message& message, const Agent& agent);

}  // namespace tutti::rpc::detail

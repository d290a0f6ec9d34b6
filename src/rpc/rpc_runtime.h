// SPDX-License-Identifier: Apache-2.0
// The process's RPC state behind the public free functions of tutti/rpc.h: the registered
// functions and the running agent (api_rpc.cc).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "src/common/status.h"
#include "src/rpc/agent.h"

namespace tutti::rpc::detail {

// The agent the calling thread works with: the pool thread's own (or a test's AgentScope),
// else the process's. NotInitialized before init_rpc(), ShutDown after shutdown().
Result<std::shared_ptr<Agent>> current_agent();

// Throws InvalidArgument unless `timeout_seconds` is 0 (the agent's default) or positive.
Clock::duration call_timeout(const Agent& agent, double timeout_seconds);

// The functions register_function() holds now (a copy).
std::map<std::string, Function> registered_functions();

// Test-only knobs and probes.
// Pieces of frames sent by agents started from now on (default kDefaultMaxPieceBytes).
void set_max_piece_bytes_for_testing(std::size_t bytes);
std::size_t max_piece_bytes();
// RRef values alive on the current agent (its owner side), and its distributed autograd contexts.
int owned_rref_count_for_testing();
std::size_t context_count_for_testing();

}  // namespace tutti::rpc::detail

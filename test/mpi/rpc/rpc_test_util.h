// SPDX-License-Identifier: Apache-2.0
// Helpers of the RPC MPI tests: one RPC group per TEST_CASE over a fresh Tutti session. See
// Note [Collective assertions] in test/support/mpi_test_util.h: checks after collective steps
// are CHECK(all_ranks(...)).
#pragma once

#include <string>
#include <vector>

#include "src/common/strings.h"
#include "test/support/mpi_test_util.h"
#include "test/support/rpc_functions.h"
#include "tutti/rpc.h"
#include "tutti/tutti.h"

namespace tutti::test {

inline std::string worker(int rank) { return "w" + std::to_string(rank); }
// The worker `offset` places after this one.
inline std::string peer(int offset) { return worker((world_rank() + offset) % world_size()); }

// tutti::init() and init_rpc("w<rank>") for the scope of a TEST_CASE; graceful shutdown after.
class RpcGroup {
 public:
  explicit RpcGroup(rpc::RpcOptions options = {}, bool graceful = true) : graceful_(graceful) {
    tutti::init();
    register_test_functions();
    rpc::init_rpc(worker(tutti::rank()), options);
  }
  ~RpcGroup() {
    rpc::shutdown(graceful_);
    tutti::shutdown();
  }
  RpcGroup(const RpcGroup&) = delete;
  RpcGroup& operator=(const RpcGroup&) = delete;

 private:
  bool graceful_;
};

// Collects what went wrong on this rank; ok() is the local verdict for all_ranks().
struct Problems {
  std::vector<std::string> list;
  void expect(bool ok, const std::string& what) {
    if (!ok) list.push_back(what);
  }
  bool ok() const { return list.empty(); }
  std::string text() const { return ::tutti::detail::join_list(list, "; "); }
};

}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// The one exception type of the public API and its error codes (API.md, "Errors").
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "tutti/export.h"

namespace tutti {

// Why an operation failed.
//   InvalidArgument  the call itself is wrong; thrown by the call, nothing was sent.
//   Mismatch         ranks disagree about an op (shape, dtype, op, root, scale, device);
//                    thrown by Handle::wait() on every rank; the runtime stays usable.
//   NotInitialized   a query or op before the first init(); a query (rank(), a set's size)
//                    after shutdown() too, where ops fail with ShutDown instead.
//   ShutDown         the runtime stopped (shutdown(), a fault or a stall) before the op ran.
//   Stalled          some ranks never submitted the op; the message names them.
//   Communication    the transport (MPI, NCCL, CUDA) reported an error.
//   Internal         a bug in Tutti; please report it.
//   Timeout          an RPC or an RRef fetch ran past its timeout (tutti/rpc.h).
enum class ErrorCode {
  InvalidArgument,
  Mismatch,
  NotInitialized,
  ShutDown,
  Stalled,
  Communication,
  Internal,
  Timeout,
};

// "InvalidArgument", "Mismatch", ...
TUTTI_API std::string_view to_string(ErrorCode code);

// Thrown by every public function of Tutti. what() is the full message.
class TUTTI_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace tutti

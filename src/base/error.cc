// SPDX-License-Identifier: Apache-2.0
#include "tutti/error.h"

namespace tutti {

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument: return "InvalidArgument";
    case ErrorCode::Mismatch: return "Mismatch";
    case ErrorCode::NotInitialized: return "NotInitialized";
    case ErrorCode::ShutDown: return "ShutDown";
    case ErrorCode::Stalled: return "Stalled";
    case ErrorCode::Communication: return "Communication";
    case ErrorCode::Internal: return "Internal";
    case ErrorCode::Timeout: return "Timeout";
  }
  return "Unknown";
}

}  // namespace tutti

// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/mpi_error.h"

#include "src/base/strings.h"

namespace tutti::ops::mpi {

Status mpi_status(int code, const char* call) {
  if (code == MPI_SUCCESS) return Status();
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  // Only the function name: the argument list says nothing to a user.
  std::string name(call);
  name = name.substr(0, name.find('('));
  return Status(ErrorCode::Communication,
                detail::str_cat(name, " failed: ", std::string(text, length)));
}

}  // namespace tutti::ops::mpi

// SPDX-License-Identifier: Apache-2.0
// A TUTTI_ELASTIC_DIR for the elastic tests at any rank count.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include <mpi.h>

#include "test/support/mpi_test_util.h"

namespace tutti::test {

// A fresh directory made by rank 0 and named to every rank, as TUTTI_ELASTIC_DIR (or unset
// with `use` false) while the object lives. Collective.
class ElasticDir {
 public:
  explicit ElasticDir(bool use = true) {
    char name[64] = "/tmp/tutti_elastic_mpi.XXXXXX";
    if (world_rank() == 0 && ::mkdtemp(name) == nullptr) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name;
    if (use) {
      ::setenv("TUTTI_ELASTIC_DIR", name, 1);
    } else {
      ::unsetenv("TUTTI_ELASTIC_DIR");
    }
  }
  ~ElasticDir() {
    ::unsetenv("TUTTI_ELASTIC_DIR");
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tutti::test

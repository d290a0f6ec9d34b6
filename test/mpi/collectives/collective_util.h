// SPDX-License-Identifier: Apache-2.0
// Helpers of the collectives tests: a session per test case, error capture, reading outputs
// of any dtype, plain-MPI oracles over any communicator, and a per-rank failure log asserted
// collectively (see Note [Collective assertions] in test/support/mpi_test_util.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <mpi.h>

#include "test/mpi/core/oracle.h"
#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {

// The elements of a tensor (any dtype) as doubles.
inline std::vector<double> values_of(const TensorView& t) {
  std::vector<double> out(static_cast<std::size_t>(t.num_elements()));
  const auto* p = static_cast<const std::byte*>(t.data());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = load(p + i * element_size(t.dtype()), t.dtype());
  return out;
}

// Empty if `got` equals `expected` within the dtype's precision, else the first difference.
inline std::string compare_values(const std::vector<double>& got,
                                  const std::vector<double>& expected, DataType dtype) {
  if (got.size() != expected.size()) {
    return "size " + std::to_string(got.size()) + ", expected " + std::to_string(expected.size());
  }
  const double tolerance = dtype == DataType::Float16 || dtype == DataType::BFloat16 ? 1e-2
                           : dtype == DataType::Float32                              ? 1e-5
                           : dtype == DataType::Float64                              ? 1e-11
                                                                                     : 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - expected[i]) > tolerance * std::max(1.0, std::abs(expected[i]))) {
      return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", expected " +
             std::to_string(expected[i]);
    }
  }
  return "";
}

// Every rank's `mine` concatenated in rank order of `comm`. Plain MPI.
inline std::vector<double> mpi_allgatherv(const std::vector<double>& mine, MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(size));
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm);
  std::vector<int> displacements(counts.size(), 0);
  int total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    displacements[r] = total;
    total += counts[r];
  }
  std::vector<double> all(static_cast<std::size_t>(total));
  MPI_Allgatherv(mine.data(), count, MPI_DOUBLE, all.data(), counts.data(), displacements.data(),
                 MPI_DOUBLE, comm);
  return all;
}

// The element-wise sum over `comm` of prescale·`mine`, then ·postscale [/ size], truncated for
// integer dtypes that are scaled or averaged (API.md's formula). Plain MPI.
inline std::vector<double> mpi_sum(std::vector<double> mine, DataType dtype, bool average,
                                   double prescale, double postscale, MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  for (double& x : mine) x *= prescale;
  MPI_Allreduce(MPI_IN_PLACE, mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM,
                comm);
  const bool scaled = average || prescale != 1.0 || postscale != 1.0;
  for (double& x : mine) {
    x = x * postscale / (average ? size : 1);
    if (!is_floating(dtype) && scaled) x = std::trunc(x);
  }
  return mine;
}

// A communicator of the world ranks with the same `color`, ordered by world rank.
struct SubComm {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit SubComm(int color) { MPI_Comm_split(MPI_COMM_WORLD, color, world_rank(), &comm); }
  ~SubComm() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  SubComm(const SubComm&) = delete;
  SubComm& operator=(const SubComm&) = delete;
};

// Collects this rank's failures; ok() is asserted with all_ranks() once per test case.
class Failures {
 public:
  void check(bool ok, const std::string& what) {
    if (!ok && first_.empty()) first_ = what;
    ok_ = ok_ && ok;
  }
  // `difference` is compare_values()'s result.
  void expect_equal(const std::string& difference, const std::string& what) {
    check(difference.empty(), what + ": " + difference);
  }
  bool ok() const { return ok_; }
  const std::string& first() const { return first_; }

 private:
  bool ok_ = true;
  std::string first_;
};

}  // namespace tutti::test

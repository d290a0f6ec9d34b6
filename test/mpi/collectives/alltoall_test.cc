// SPDX-License-Identifier: Apache-2.0
// alltoall against plain MPI_Alltoallv: explicit and equal splits, every dtype, empty tensors,
// zero splits, a rank that sends nothing, rows left unsent, received_splits(), and the
// argument errors thrown by the call.
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

struct Expected {
  std::vector<double> values;
  std::vector<std::int64_t> received;
};

// The oracle: the row counts every rank sends come to their receivers by MPI_Alltoall, then
// the data (as doubles) by MPI_Alltoallv.
Expected mpi_alltoall(const HostTensor& t, const std::vector<std::int64_t>& splits,
                      std::int64_t row) {
  const int size = world_size();
  std::vector<std::int64_t> received(static_cast<std::size_t>(size));
  MPI_Alltoall(splits.data(), 1, MPI_INT64_T, received.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  std::vector<int> send_counts, send_displacements, receive_counts, receive_displacements;
  int send_offset = 0;
  int receive_offset = 0;
  for (int r = 0; r < size; ++r) {
    send_counts.push_back(static_cast<int>(splits[static_cast<std::size_t>(r)] * row));
    send_displacements.push_back(send_offset);
    send_offset += send_counts.back();
    receive_counts.push_back(static_cast<int>(received[static_cast<std::size_t>(r)] * row));
    receive_displacements.push_back(receive_offset);
    receive_offset += receive_counts.back();
  }
  const std::vector<double> mine = t.values();
  Expected expected{.values = std::vector<double>(static_cast<std::size_t>(receive_offset)),
                    .received = received};
  MPI_Alltoallv(mine.data(), send_counts.data(), send_displacements.data(), MPI_DOUBLE,
                expected.values.data(), receive_counts.data(), receive_displacements.data(),
                MPI_DOUBLE, MPI_COMM_WORLD);
  return expected;
}

// Splits of each kind this rank uses; `rows` is then dim 0 of its input.
std::vector<std::int64_t> splits_for(int kind, int rank, int size, std::int64_t* rows) {
  std::vector<std::int64_t> splits(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) {
    switch (kind) {
      case 0: splits[static_cast<std::size_t>(i)] = (rank + i) % 3; break;  // Uneven, some 0.
      case 1: splits[static_cast<std::size_t>(i)] = 0; break;               // Nothing at all.
      case 2:
        splits[static_cast<std::size_t>(i)] = rank == 0 ? 0 : i + 1;
        break;                                                  // Rank 0 sends nothing.
      default: splits[static_cast<std::size_t>(i)] = 2; break;  // Equal (passed empty).
    }
  }
  const std::int64_t sum = std::accumulate(splits.begin(), splits.end(), std::int64_t{0});
  // Kind 0 keeps a spare row that is not sent; rank 0 of kind 2 has an empty tensor.
  *rows = kind == 0 ? sum + 1 : sum;
  return splits;
}

TEST_CASE("alltoall matches plain MPI for every dtype, split kind and row shape", "[alltoall]") {
  Session session;
  Failures failures;
  const int size = world_size();
  for (DataType dtype : kAllDtypes) {
    for (int kind = 0; kind < 4; ++kind) {
      for (const Shape& rest : std::vector<Shape>{{}, {3}, {2, 2}}) {
        std::int64_t rows = 0;
        std::vector<std::int64_t> splits = splits_for(kind, world_rank(), size, &rows);
        Shape shape = {rows};
        shape.insert(shape.end(), rest.begin(), rest.end());
        std::int64_t row = 1;
        for (std::int64_t d : rest) row *= d;
        HostTensor t(dtype, shape, world_rank(), false);
        const Expected expected = mpi_alltoall(t, splits, row);
        Handle h =
            alltoall_async(t.view(), kind == 3 ? std::vector<std::int64_t>{} : splits, "a2a");
        const Tensor& out = h.output();
        const std::string what = std::string(to_string(dtype)) + " kind " + std::to_string(kind) +
                                 " rest " + std::to_string(rest.size()) + "-d";
        failures.expect_equal(compare_values(values_of(out), expected.values, dtype), what);
        failures.check(h.received_splits() == expected.received, what + ": received_splits");
        const std::int64_t received_rows =
            std::accumulate(expected.received.begin(), expected.received.end(), std::int64_t{0});
        Shape out_shape = {received_rows};
        out_shape.insert(out_shape.end(), rest.begin(), rest.end());
        failures.check(out.shape() == out_shape && out.dtype() == dtype, what + ": output shape");
      }
    }
  }
  INFO(failures.first());
  CHECK(all_ranks(failures.ok()));
}

TEST_CASE("the blocking alltoall returns the output and received splits", "[alltoall]") {
  Session session;
  const int size = world_size();
  std::vector<std::int32_t> values(static_cast<std::size_t>(size));
  std::iota(values.begin(), values.end(), world_rank() * 100);  // Row i goes to rank i.
  const AlltoallResult result = alltoall(TensorView(values.data(), {size}), {}, "blocking");
  bool ok = result.received_splits == std::vector<std::int64_t>(static_cast<std::size_t>(size), 1);
  const auto got = result.output.span<std::int32_t>();
  for (int r = 0; r < size; ++r)
    ok = ok && got[static_cast<std::size_t>(r)] == r * 100 + world_rank();
  CHECK(all_ranks(ok));
}

TEST_CASE("alltoall argument errors are thrown by the call", "[alltoall][errors]") {
  Session session;
  const int size = world_size();
  std::vector<float> v(static_cast<std::size_t>(4 * size + 1));
  const TensorView t(v.data(), {4 * size + 1});
  float scalar = 0;
  std::string message;
  CHECK(error_of([&] { alltoall_async(TensorView(&scalar, {}), {}, "scalar"); }) ==
        ErrorCode::InvalidArgument);
  std::vector<std::int64_t> too_many(static_cast<std::size_t>(size + 1), 1);
  CHECK(error_of([&] { alltoall_async(t, too_many, "count"); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("ALLTOALL 'count'") != std::string::npos);
  std::vector<std::int64_t> negative(static_cast<std::size_t>(size), 1);
  negative[0] = -1;
  CHECK(error_of([&] { alltoall_async(t, negative, "negative"); }) == ErrorCode::InvalidArgument);
  std::vector<std::int64_t> too_big(static_cast<std::size_t>(size), 0);
  too_big[0] = 4 * size + 2;
  CHECK(error_of([&] { alltoall_async(t, too_big, "sum"); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("more than dim 0") != std::string::npos);
  if (size > 1) {
    // Splits whose sum passes int64: it wrapped negative and passed the check, and the op
    // then stopped the runtime with its handle never completed (a wait() hung).
    std::vector<std::int64_t> huge(static_cast<std::size_t>(size),
                                   std::numeric_limits<std::int64_t>::max());
    CHECK(error_of([&] { alltoall_async(t, huge, "overflow"); }, &message) ==
          ErrorCode::InvalidArgument);
    CHECK(message.find("more than an int64 of rows") != std::string::npos);
    CHECK(error_of([&] { alltoall_async(t, {}, "equal"); }) ==
          ErrorCode::InvalidArgument);  // 4·size+1 rows.
  }
  // Nothing was queued: the same names work now.
  std::vector<std::int64_t> ones(static_cast<std::size_t>(size), 1);
  const AlltoallResult result = alltoall(t, ones, "count");
  CHECK(all_ranks(result.output.num_elements() == size));
}

TEST_CASE("alltoall splits that add up past int64 at a receiver fail on every rank",
          "[alltoall][errors]") {
  if (world_size() < 2) return;
  Session session;
  // Every rank sends all its rows, of zero width, to the last rank: each rank's splits are
  // valid, the rows the last rank would receive are not a dim 0. Before, that rank's
  // communication thread stopped the runtime and the others waited in the exchange until
  // MPI_Abort.
  const int size = world_size();
  const std::int64_t rows = std::numeric_limits<std::int64_t>::max() / 2 + 1;
  std::vector<std::int64_t> splits(static_cast<std::size_t>(size), 0);
  splits.back() = rows;
  std::string message;
  const auto code = error_of(
      [&] {
        alltoall(TensorView(nullptr, DataType::Float32, {rows, 0}), splits, "splits.sum");
      },
      &message);
  CHECK(all_ranks(code == ErrorCode::InvalidArgument &&
                  message.find("ALLTOALL 'splits.sum': rank " + std::to_string(size - 1) +
                               "'s output would have") != std::string::npos));
  std::vector<float> v(static_cast<std::size_t>(size), 1.0f);
  CHECK(all_ranks(
      alltoall(TensorView(v.data(), {size}), {}, "splits.after").output.num_elements() == size));
}

TEST_CASE("alltoall rows that differ after dim 0 are a Mismatch on every rank",
          "[alltoall][errors]") {
  if (world_size() < 2) return;
  Session session;
  const int size = world_size();
  const bool odd = world_rank() == size - 1;
  std::vector<float> v(static_cast<std::size_t>(size * 6));
  std::vector<std::int32_t> ints(static_cast<std::size_t>(size * 6));
  std::string message;
  auto shape = error_of(
      [&] {
        alltoall(TensorView(v.data(), {size, odd ? 6 : 3}), {}, "rows");
      },
      &message);
  CHECK(all_ranks(shape == ErrorCode::Mismatch && message.find("ALLTOALL") != std::string::npos));
  auto dtype = error_of(
      [&] {
        if (odd)
          alltoall(TensorView(ints.data(), {size}), {}, "dtype");
        else
          alltoall(TensorView(v.data(), {size}), {}, "dtype");
      },
      &message);
  CHECK(all_ranks(dtype == ErrorCode::Mismatch && message.find("data types") != std::string::npos));
}

}  // namespace
}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// Conformance checks shared by the device backends (NCCL, host-staged MPI): every op over
// device buffers against closed forms of each rank's pattern, at any world size. Each check
// enqueues through the backend, records an event on the backend's stream and polls it as core
// does, then compares on the host. Results are asserted collectively (Note [Collective
// assertions] in test/support/mpi_test_util.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/backend.h"
#include "ops/device_ops.h"
#include "test/gpu/gpu_test_util.h"
#include "test/support/mpi_test_util.h"

namespace tutti::test {

// This rank's device stream (gpu_mpi_main.cc made local_rank % count current).
inline ops::DeviceStream my_stream() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  return ops::DeviceStream{Device::cuda(device), 0};
}

// Waits for everything the backend enqueued, checking its asynchronous errors meanwhile.
inline Status finish(ops::Backend& backend) {
  Result<std::unique_ptr<ops::DeviceEvent>> event = ops::device_ops().record_event(my_stream());
  if (!event.ok()) return event.status();
  TUTTI_RETURN_IF_ERROR(poll_until_done(*event.value()));
  return backend.async_error();
}

// Rank r's element i for an op, small enough that every dtype holds every partial result
// exactly (sums <= 12, products <= 16 at 4 ranks).
inline double pattern(ops::WireOp op, DataType dtype, int rank, std::size_t i) {
  const auto r = static_cast<std::size_t>(rank);
  if (dtype == DataType::Bool) return static_cast<double>((i + r) % 2);
  switch (op) {
    case ops::WireOp::Sum: return static_cast<double>((i + r) % 4);
    case ops::WireOp::Min:
    case ops::WireOp::Max: return static_cast<double>((i * 3 + r) % 5);
    case ops::WireOp::Product: return static_cast<double>(1 + (i + r) % 2);
  }
  return 0;
}

inline double reduce(ops::WireOp op, DataType dtype, int size, std::size_t i) {
  double result = pattern(op, dtype, 0, i);
  for (int r = 1; r < size; ++r) {
    const double x = pattern(op, dtype, r, i);
    switch (op) {
      case ops::WireOp::Sum: result += x; break;
      case ops::WireOp::Min: result = std::min(result, x); break;
      case ops::WireOp::Max: result = std::max(result, x); break;
      case ops::WireOp::Product: result *= x; break;
    }
  }
  return result;
}

inline std::vector<double> rank_values(ops::WireOp op, DataType dtype, int rank, std::size_t first,
                                       std::size_t count) {
  std::vector<double> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = pattern(op, dtype, rank, first + i);
  return values;
}

// Collects this rank's failures; asserted with all_ranks() once per check.
struct Outcome {
  bool ok = true;
  std::string first;
  void check(bool good, const std::string& what) {
    if (!good && ok) first = what;
    ok = ok && good;
  }
};

inline std::string what(const char* op, DataType dtype, std::size_t count) {
  return std::string(op) + " " + std::string(to_string(dtype)) + " count " + std::to_string(count);
}

inline void check_allreduce(ops::Backend& backend, const std::vector<DataType>& dtypes) {
  Outcome outcome;
  const ops::WireOp ops_all[] = {ops::WireOp::Sum, ops::WireOp::Min, ops::WireOp::Max,
                                 ops::WireOp::Product};
  for (DataType dtype : dtypes) {
    for (ops::WireOp op : ops_all) {
      if (dtype == DataType::Bool && (op == ops::WireOp::Sum || op == ops::WireOp::Product)) {
        continue;
      }
      for (std::size_t count :
           {std::size_t{0}, std::size_t{1}, std::size_t{1023}, std::size_t{65537}}) {
        const std::vector<std::byte> mine =
            encode(rank_values(op, dtype, backend.rank(), 0, count), dtype);
        DeviceBuffer data(mine.size());
        upload(data.get(), mine, my_stream());
        Status status = backend.allreduce(data.get(), count, dtype, op);
        if (status.ok()) status = finish(backend);
        const std::vector<double> got = decode(download(data.get(), mine.size()), dtype);
        bool equal = status.ok();
        for (std::size_t i = 0; equal && i < count; ++i) {
          equal = got[i] == reduce(op, dtype, backend.size(), i);
        }
        outcome.check(equal, what("allreduce", dtype, count) + " op " +
                                 std::to_string(static_cast<int>(op)) + ": " +
                                 std::string(status.message()));
      }
    }
  }
  INFO(outcome.first);
  CHECK(all_ranks(outcome.ok));
}

// Rank r contributes `counts[r]` elements: uneven (one rank none) and even layouts.
inline void check_allgatherv(ops::Backend& backend, const std::vector<DataType>& dtypes) {
  Outcome outcome;
  const int size = backend.size();
  std::vector<std::vector<std::size_t>> layouts;
  std::vector<std::size_t> uneven;
  for (int r = 0; r < size; ++r) uneven.push_back(r == 1 ? 0 : static_cast<std::size_t>(3 * r + 5));
  layouts.push_back(uneven);
  layouts.emplace_back(static_cast<std::size_t>(size), 4097);
  for (DataType dtype : dtypes) {
    for (const std::vector<std::size_t>& counts : layouts) {
      std::vector<double> expected;
      for (int r = 0; r < size; ++r) {
        const std::vector<double> part =
            rank_values(ops::WireOp::Sum, dtype, r, 0, counts[static_cast<std::size_t>(r)]);
        expected.insert(expected.end(), part.begin(), part.end());
      }
      const std::size_t mine = counts[static_cast<std::size_t>(backend.rank())];
      DeviceBuffer input(mine * element_size(dtype));
      DeviceBuffer output(expected.size() * element_size(dtype));
      upload(input.get(),
             encode(rank_values(ops::WireOp::Sum, dtype, backend.rank(), 0, mine), dtype),
             my_stream());
      Status status = backend.allgatherv(input.get(), output.get(), counts, dtype);
      if (status.ok()) status = finish(backend);
      const std::vector<double> got =
          decode(download(output.get(), expected.size() * element_size(dtype)), dtype);
      outcome.check(status.ok() && got == expected, what("allgatherv", dtype, expected.size()) +
                                                        ": " + std::string(status.message()));
    }
  }
  INFO(outcome.first);
  CHECK(all_ranks(outcome.ok));
}

inline void check_broadcast(ops::Backend& backend, const std::vector<DataType>& dtypes) {
  Outcome outcome;
  for (DataType dtype : dtypes) {
    for (int root = 0; root < backend.size(); ++root) {
      const std::size_t count = 1001;
      const std::vector<double> expected = rank_values(ops::WireOp::Sum, dtype, root, 0, count);
      const std::vector<std::byte> mine =
          encode(rank_values(ops::WireOp::Sum, dtype, backend.rank(), 0, count), dtype);
      DeviceBuffer data(mine.size());
      upload(data.get(), mine, my_stream());
      Status status = backend.broadcast(data.get(), count, dtype, root);
      if (status.ok()) status = finish(backend);
      outcome.check(status.ok() && decode(download(data.get(), mine.size()), dtype) == expected,
                    what("broadcast", dtype, count) + " root " + std::to_string(root));
    }
  }
  INFO(outcome.first);
  CHECK(all_ranks(outcome.ok));
}

// Rank s sends (s + d) % 3 elements to rank d (zero counts included), values tagged by sender.
inline void check_alltoallv(ops::Backend& backend, const std::vector<DataType>& dtypes) {
  Outcome outcome;
  const int size = backend.size();
  const int me = backend.rank();
  auto sent = [](int from, int to) { return static_cast<std::size_t>((from + to) % 3); };
  for (DataType dtype : dtypes) {
    std::vector<std::size_t> send_counts;
    std::vector<std::size_t> recv_counts;
    std::vector<double> input;
    std::vector<double> expected;
    for (int peer = 0; peer < size; ++peer) {
      send_counts.push_back(sent(me, peer));
      recv_counts.push_back(sent(peer, me));
      for (std::size_t i = 0; i < sent(me, peer); ++i) input.push_back((me * 3 + peer + i) % 7);
      for (std::size_t i = 0; i < sent(peer, me); ++i) expected.push_back((peer * 3 + me + i) % 7);
    }
    if (dtype == DataType::Bool) {
      for (double& x : input) x = x > 3 ? 1 : 0;
      for (double& x : expected) x = x > 3 ? 1 : 0;
    }
    DeviceBuffer in(input.size() * element_size(dtype));
    DeviceBuffer out(expected.size() * element_size(dtype));
    upload(in.get(), encode(input, dtype), my_stream());
    Status status = backend.alltoallv(in.get(), send_counts, out.get(), recv_counts, dtype);
    if (status.ok()) status = finish(backend);
    const std::vector<double> got =
        decode(download(out.get(), expected.size() * element_size(dtype)), dtype);
    outcome.check(status.ok() && got == expected, what("alltoallv", dtype, expected.size()));
  }
  INFO(outcome.first);
  CHECK(all_ranks(outcome.ok));
}

// Rank r keeps recv_counts[r] consecutive elements of the sum: even and uneven splits.
inline void check_reducescatter(ops::Backend& backend, const std::vector<DataType>& dtypes) {
  Outcome outcome;
  const int size = backend.size();
  const auto me = static_cast<std::size_t>(backend.rank());
  std::vector<std::vector<std::size_t>> layouts;
  layouts.emplace_back(static_cast<std::size_t>(size), 513);
  std::vector<std::size_t> uneven;
  for (int r = 0; r < size; ++r) uneven.push_back(r == 0 ? 0 : static_cast<std::size_t>(2 * r + 1));
  layouts.push_back(uneven);
  for (DataType dtype : dtypes) {
    for (const std::vector<std::size_t>& counts : layouts) {
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      std::size_t first = 0;
      for (std::size_t r = 0; r < me; ++r) first += counts[r];
      DeviceBuffer input(total * element_size(dtype));
      DeviceBuffer output(counts[me] * element_size(dtype));
      upload(input.get(),
             encode(rank_values(ops::WireOp::Sum, dtype, backend.rank(), 0, total), dtype),
             my_stream());
      Status status =
          backend.reducescatter(input.get(), output.get(), counts, dtype, ops::WireOp::Sum);
      if (status.ok()) status = finish(backend);
      const std::vector<double> got =
          decode(download(output.get(), counts[me] * element_size(dtype)), dtype);
      bool equal = status.ok() && got.size() == counts[me];
      for (std::size_t i = 0; equal && i < counts[me]; ++i) {
        equal = got[i] == reduce(ops::WireOp::Sum, dtype, size, first + i);
      }
      outcome.check(equal,
                    what("reducescatter", dtype, total) + ": " + std::string(status.message()));
    }
  }
  INFO(outcome.first);
  CHECK(all_ranks(outcome.ok));
}

// The rooted ops at every root: reduce (Sum and Max; only the root's output is written),
// gatherv of uneven blocks (one rank none) and scatterv of them back.
inline void check_rooted(ops::Backend& backend, const std::vector<DataType>& dtypes) {
  Outcome outcome;
  const int size = backend.size();
  const int me = backend.rank();
  std::vector<std::size_t> counts;
  for (int r = 0; r < size; ++r) counts.push_back(r == 1 ? 0 : static_cast<std::size_t>(3 * r + 5));
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  for (DataType dtype : dtypes) {
    const std::size_t bytes = element_size(dtype);
    for (int root = 0; root < size; ++root) {
      const std::string at = " root " + std::to_string(root);
      for (ops::WireOp op : {ops::WireOp::Sum, ops::WireOp::Max}) {
        if (dtype == DataType::Bool && op == ops::WireOp::Sum) continue;
        const std::size_t count = 1027;
        const std::vector<std::byte> mine = encode(rank_values(op, dtype, me, 0, count), dtype);
        DeviceBuffer input(mine.size());
        DeviceBuffer output(mine.size());
        upload(input.get(), mine, my_stream());
        upload(output.get(), mine, my_stream());  // Left as it is off the root.
        Status status = backend.reduce(input.get(), output.get(), count, dtype, op, root);
        if (status.ok()) status = finish(backend);
        const std::vector<double> got = decode(download(output.get(), mine.size()), dtype);
        const std::vector<double> sent = decode(download(input.get(), mine.size()), dtype);
        bool equal = status.ok() && sent == decode(mine, dtype);
        for (std::size_t i = 0; equal && i < count; ++i) {
          equal = got[i] == (me == root ? reduce(op, dtype, size, i) : pattern(op, dtype, me, i));
        }
        outcome.check(equal,
                      what("reduce", dtype, count) + at + ": " + std::string(status.message()));
      }
      std::vector<double> all;
      for (int r = 0; r < size; ++r) {
        const std::vector<double> part =
            rank_values(ops::WireOp::Sum, dtype, r, 0, counts[static_cast<std::size_t>(r)]);
        all.insert(all.end(), part.begin(), part.end());
      }
      const std::size_t mine = counts[static_cast<std::size_t>(me)];
      const std::vector<double> own = rank_values(ops::WireOp::Sum, dtype, me, 0, mine);
      DeviceBuffer block(mine * bytes);
      DeviceBuffer gathered(total * bytes);
      upload(block.get(), encode(own, dtype), my_stream());
      Status status = backend.gatherv(block.get(), gathered.get(), counts, dtype, root);
      if (status.ok()) status = finish(backend);
      outcome.check(status.ok() && (me != root ||
                                    decode(download(gathered.get(), total * bytes), dtype) == all),
                    what("gatherv", dtype, total) + at + ": " + std::string(status.message()));
      // scatterv: the root's `all` back to the ranks' blocks.
      DeviceBuffer source(total * bytes);
      DeviceBuffer part(mine * bytes);
      if (me == root) upload(source.get(), encode(all, dtype), my_stream());
      status = backend.scatterv(source.get(), counts, part.get(), dtype, root);
      if (status.ok()) status = finish(backend);
      outcome.check(status.ok() && decode(download(part.get(), mine * bytes), dtype) == own,
                    what("scatterv", dtype, mine) + at + ": " + std::string(status.message()));
    }
  }
  INFO(outcome.first);
  CHECK(all_ranks(outcome.ok));
}

// Core's device path for a fused allreduce: pack with prescale (widening float16 to float32),
// reduce, unpack with postscale / size (narrowing back), then poll the event.
inline void check_fused_average(ops::Backend& backend) {
  ops::DeviceOps& device = ops::device_ops();
  const std::vector<std::size_t> counts = {7, 4096, 1, 33};
  std::vector<std::unique_ptr<DeviceBuffer>> tensors;
  std::size_t total = 0;
  std::vector<std::size_t> offsets;
  for (std::size_t n : counts) {
    offsets.push_back(total);
    total += (n + 3) / 4 * 4;  // 16-byte aligned float offsets.
    tensors.push_back(std::make_unique<DeviceBuffer>(n * 2));
  }
  for (std::size_t t = 0; t < counts.size(); ++t) {
    upload(tensors[t]->get(),
           encode(rank_values(ops::WireOp::Sum, DataType::Float16, backend.rank(), t, counts[t]),
                  DataType::Float16),
           my_stream());
  }
  Result<std::shared_ptr<void>> fused = device.allocate(total * sizeof(float), my_stream().device);
  REQUIRE(fused.ok());
  auto* buffer = static_cast<float*>(fused.value().get());
  const double prescale = 2.0;
  const double postscale = 0.5 / backend.size();
  std::vector<ops::CopySpec> pack;
  std::vector<ops::CopySpec> unpack;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    pack.push_back({.destination = buffer + offsets[t],
                    .destination_type = DataType::Float32,
                    .source = tensors[t]->get(),
                    .source_type = DataType::Float16,
                    .count = counts[t],
                    .factor = prescale});
    unpack.push_back({.destination = tensors[t]->get(),
                      .destination_type = DataType::Float16,
                      .source = buffer + offsets[t],
                      .source_type = DataType::Float32,
                      .count = counts[t],
                      .factor = postscale});
  }
  Status status = device.fill_zero(buffer, total * sizeof(float), my_stream());
  if (status.ok()) status = device.batched_copy(pack, my_stream());
  if (status.ok()) status = backend.allreduce(buffer, total, DataType::Float32, ops::WireOp::Sum);
  if (status.ok()) status = device.batched_copy(unpack, my_stream());
  if (status.ok()) status = finish(backend);
  Outcome outcome;
  outcome.check(status.ok(), std::string(status.message()));
  for (std::size_t t = 0; status.ok() && t < counts.size(); ++t) {
    const std::vector<double> got =
        decode(download(tensors[t]->get(), counts[t] * 2), DataType::Float16);
    for (std::size_t i = 0; i < counts[t]; ++i) {
      const double expected =
          reduce(ops::WireOp::Sum, DataType::Float16, backend.size(), t + i) * prescale * postscale;
      outcome.check(std::abs(got[i] - expected) <= 1e-3 * std::max(1.0, expected),
                    "fused average tensor " + std::to_string(t) + " element " + std::to_string(i));
    }
  }
  INFO(outcome.first);
  CHECK(all_ranks(outcome.ok));
}

}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// DistributedSampler: splits the indices of a data set among the replicas of a data-parallel
// job exactly as torch.utils.data.distributed.DistributedSampler does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tutti/export.h"

namespace tutti::data {

// Which indices of a data set of `dataset_size` samples replica `rank` of `num_replicas`
// visits in the current epoch. Purely local: no communication, no runtime needed, so it can be
// built before init(). Every replica constructed with the same arguments (and given the same
// epoch) computes the same global order, so the shares are disjoint and together cover the data
// set (up to padding or dropping, below).
//
// The layout, as in torch:
//   1. The list 0 .. dataset_size-1, or, with `shuffle`, a permutation of it drawn from a
//      generator seeded with `seed + epoch`. The generator is Tutti's own (std::mt19937_64 and
//      an unbiased bounded draw implemented here, not std::uniform_int_distribution), so the
//      permutation is the same for every rank, compiler and platform. It is NOT the permutation
//      torch.randperm draws for the same seed.
//   2. Without `drop_last`, the list is padded by repeating entries from its start (cycling if
//      needed) up to total_size() = num_replicas · ceil(dataset_size / num_replicas); with
//      `drop_last`, it is truncated to num_replicas · floor(dataset_size / num_replicas).
//   3. Replica `rank` takes the entries at positions rank, rank + num_replicas, ...
// Every replica gets num_samples() indices.
//
// Not thread-safe for concurrent set_epoch(); const members may be called from any thread.
class TUTTI_API DistributedSampler {
 public:
  // Typically num_replicas = tutti::size() and rank = tutti::rank() (or a process set's).
  // Throws Error(InvalidArgument) if num_replicas < 1 or rank is outside [0, num_replicas).
  // A data set of 0 samples is legal and gives every replica an empty share.
  DistributedSampler(std::size_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     std::uint64_t seed = 0, bool drop_last = false);

  // Selects the epoch whose shuffle indices() returns (as torch: call it at the start of every
  // epoch, with the same value on every rank, or every epoch sees the same order). Has no
  // effect without shuffle. The initial epoch is 0.
  void set_epoch(std::uint64_t epoch);
  std::uint64_t epoch() const { return epoch_; }

  // This replica's indices for the current epoch, in visiting order; num_samples() of them.
  std::vector<std::size_t> indices() const;

  // Indices per replica: ceil(dataset_size / num_replicas), or floor(...) with drop_last.
  std::size_t num_samples() const { return num_samples_; }
  // num_samples() · num_replicas: the padded or truncated length of the global list.
  std::size_t total_size() const { return num_samples_ * static_cast<std::size_t>(num_replicas_); }

 private:
  std::size_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::uint64_t epoch_ = 0;
  std::size_t num_samples_ = 0;
};

}  // namespace tutti::data

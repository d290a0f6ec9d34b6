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
// Resuming an epoch (Horovod's ElasticSampler; see elastic::State, which saves and restores
// epoch() and position()): the replicas advance() through their indices() in lock step, and
// position() counts the entries of the epoch's list (1.) they have consumed together. A sampler
// built anew, at any num_replicas, and given the same epoch and set_position() lays out the
// rest of the list, from that position on, by steps 2. and 3. above: so over the launches every
// sample of the epoch is seen exactly once, except for the padding (step 2) that the tail of
// the epoch gets, as it does without a restart.
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
  // effect on the order without shuffle. The initial epoch is 0.
  //
  // Another epoch than the current one starts at its beginning (position() 0). The current
  // epoch keeps its position, so a loop that calls set_epoch(epoch) at its top continues a
  // resumed epoch where it stopped.
  void set_epoch(std::uint64_t epoch);
  std::uint64_t epoch() const { return epoch_; }

  // This replica's indices for the current epoch from the position of the last set_epoch() or
  // set_position() on (the whole epoch unless resumed), in visiting order; num_samples() of
  // them. advance() does not change it.
  std::vector<std::size_t> indices() const;

  // Indices per replica from that position on: ceil(rest / num_replicas), or floor(...) with
  // drop_last, where rest = dataset_size - that position (the data set's size unless resumed).
  std::size_t num_samples() const { return num_samples_; }
  // num_samples() · num_replicas: the padded or truncated length of the global list.
  std::size_t total_size() const { return num_samples_ * static_cast<std::size_t>(num_replicas_); }

  // Marks the next `count` of this replica's indices() as processed: call it after each batch,
  // with the batch's size, on every replica alike (data-parallel steps are in lock step).
  // Throws Error(InvalidArgument) past the end of indices().
  void advance(std::size_t count);
  // Entries of the current epoch's list consumed by all the replicas together: the position
  // of the last set_epoch()/set_position() plus num_replicas per index advance()d, at most
  // dataset_size. The same on every replica; dataset_size once the epoch is done (every index
  // advance()d: with drop_last, the dropped tail counts as consumed).
  std::size_t position() const;
  // Continues the current epoch at `position` (as position() returned it, possibly at another
  // num_replicas): indices() then covers the entries from there on. Throws
  // Error(InvalidArgument) if position > dataset_size.
  void set_position(std::size_t position);

  // The constructor's arguments.
  std::size_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }
  bool shuffle() const { return shuffle_; }
  std::uint64_t seed() const { return seed_; }
  bool drop_last() const { return drop_last_; }

 private:
  // Recomputes num_samples_ for the entries from start_ on.
  void lay_out(std::size_t start);

  std::size_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::uint64_t epoch_ = 0;
  std::size_t start_ = 0;      // Position in the epoch's list where indices() begins.
  std::size_t processed_ = 0;  // Of indices(), by advance().
  std::size_t num_samples_ = 0;
};

}  // namespace tutti::data

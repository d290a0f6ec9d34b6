// SPDX-License-Identifier: Apache-2.0
// DistributedSampler: torch's padded, strided split of a (shuffled) index list.
#include "tutti/data/distributed_sampler.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tutti/error.h"

namespace tutti::data {
namespace {

// A uniform draw from [0, bound) without modulo bias. std::uniform_int_distribution is not
// used because its algorithm differs between standard libraries, and every rank must draw the
// same permutation. Values below 2^64 mod bound are rejected so the rest split evenly.
std::uint64_t draw_below(std::mt19937_64& engine, std::uint64_t bound) {
  const std::uint64_t threshold = (0 - bound) % bound;
  std::uint64_t value = engine();
  while (value < threshold) value = engine();
  return value % bound;
}

}  // namespace

DistributedSampler::DistributedSampler(std::size_t dataset_size, int num_replicas, int rank,
                                       bool shuffle, std::uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (num_replicas < 1) {
    throw Error(
        ErrorCode::InvalidArgument,
        "DistributedSampler: num_replicas must be at least 1, got " + std::to_string(num_replicas));
  }
  if (rank < 0 || rank >= num_replicas) {
    throw Error(ErrorCode::InvalidArgument, "DistributedSampler: rank " + std::to_string(rank) +
                                                " is outside [0, " + std::to_string(num_replicas) +
                                                ")");
  }
  lay_out(0);
}

void DistributedSampler::lay_out(std::size_t start) {
  start_ = start;
  processed_ = 0;
  const std::size_t rest = dataset_size_ - start;
  const auto replicas = static_cast<std::size_t>(num_replicas_);
  // torch: ceil(len / replicas), or with drop_last ceil((len - replicas) / replicas), which is
  // floor(len / replicas) (and 0 when len < replicas); here len is what is left of the epoch.
  num_samples_ = drop_last_ ? rest / replicas : (rest + replicas - 1) / replicas;
}

void DistributedSampler::set_epoch(std::uint64_t epoch) {
  if (epoch == epoch_) return;  // Keeps a resumed epoch's position (see the header).
  epoch_ = epoch;
  lay_out(0);
}

void DistributedSampler::advance(std::size_t count) {
  if (count > num_samples_ - processed_) {
    throw Error(ErrorCode::InvalidArgument,
                "DistributedSampler: advance(" + std::to_string(count) +
                    ") past the end: " + std::to_string(num_samples_ - processed_) +
                    " of this replica's " + std::to_string(num_samples_) +
                    " indices are left in epoch " + std::to_string(epoch_));
  }
  processed_ += count;
}

std::size_t DistributedSampler::position() const {
  // Replica r has visited positions r, r + R, ... of the laid-out list, so together the
  // replicas have consumed its first processed_ · R positions; beyond the data set's end
  // they are padding. A finished epoch is at the end whatever it left: with drop_last, the
  // last rest % R entries are dropped, not still to come (resumed at fewer replicas, they were
  // laid out as one more step of the finished epoch).
  if (processed_ == num_samples_) return dataset_size_;
  const std::size_t rest = dataset_size_ - start_;
  const auto replicas = static_cast<std::size_t>(num_replicas_);
  return start_ + std::min(processed_ * replicas, rest);
}

void DistributedSampler::set_position(std::size_t position) {
  if (position > dataset_size_) {
    throw Error(ErrorCode::InvalidArgument, "DistributedSampler: position " +
                                                std::to_string(position) + " is past the " +
                                                std::to_string(dataset_size_) + " samples");
  }
  lay_out(position);
}

std::vector<std::size_t> DistributedSampler::indices() const {
  std::vector<std::size_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (shuffle_ && dataset_size_ > 1) {
    std::mt19937_64 engine(seed_ + epoch_);  // Wraps on overflow, identically everywhere.
    for (std::size_t i = dataset_size_ - 1; i > 0; --i) {  // Fisher-Yates.
      std::swap(order[i], order[draw_below(engine, static_cast<std::uint64_t>(i) + 1)]);
    }
  }
  const std::size_t total = total_size();
  const std::size_t rest = dataset_size_ - start_;
  const auto stride = static_cast<std::size_t>(num_replicas_);
  std::vector<std::size_t> mine;
  mine.reserve(num_samples_);
  // Position p of the padded list is order[start + p % rest]: padding repeats the list from its
  // start, cycling when it must add more than one copy (torch's `indices * ceil(...)`).
  for (std::size_t p = static_cast<std::size_t>(rank_); p < total; p += stride) {
    mine.push_back(order[start_ + p % rest]);
  }
  return mine;
}

}  // namespace tutti::data

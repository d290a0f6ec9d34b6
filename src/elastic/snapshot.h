// SPDX-License-Identifier: Apache-2.0
// The bytes of one elastic commit: what State::commit() writes, restore() reads and sync()
// broadcasts. Local: no communication.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/elastic/entry.h"
#include "tutti/tensor.h"

namespace tutti::elastic::internal {

// Note [Commit format]
// "TUTTIEL1", then a ByteWriter body (tutti/serialize.h: native byte order, as every rank of
// a job runs one build), then the CRC-32 (zlib's) of every byte before it as a uint32:
//   string name, int64 commit, int32 world size, uint64 entry count, then per entry
//   uint8 EntryKind, string key and
//     Parameters: uint64 count, per tensor: string name, uint8 DataType, vector<int64> shape,
//                 string data
//     Optimizer:  the state dict's tensors as Parameters', uint64 count, per scalar: string
//                 name, float64
//     Sampler:    uint64 epoch, position, data set size, seed; uint8 shuffle, drop_last
//     Int64:      int64;  Bytes: vector<uint8>
//     Stateful:   string (what its save() returned)
// A change of layout takes a new magic, so that old files are refused, not misread. A new kind
// (Stateful was one) changes no layout: older files still read.
inline constexpr char kCommitMagic[] = "TUTTIEL1";  // 8 bytes without the terminator.

struct SavedTensor {
  std::string name;
  DataType dtype = DataType::Float32;
  Shape shape;
  std::string data;
};

// One entry of a commit; the members of its kind are set (see Note [Commit format]).
struct SavedEntry {
  std::string key;
  EntryKind kind = EntryKind::Int64;
  std::vector<SavedTensor> tensors;       // Parameters, Optimizer
  std::map<std::string, double> scalars;  // Optimizer
  std::uint64_t epoch = 0;                // Sampler ...
  std::uint64_t position = 0;
  std::uint64_t dataset_size = 0;
  std::uint64_t seed = 0;
  bool shuffle = false;
  bool drop_last = false;           // ... Sampler
  std::int64_t value = 0;           // Int64
  std::vector<std::uint8_t> bytes;  // Bytes
  std::string object;               // Stateful
};

struct Snapshot {
  std::string name;
  std::int64_t commit = 0;
  std::int32_t world_size = 0;
  std::vector<SavedEntry> entries;
};

// The commit file of `entries`' current values. Throws Error(InvalidArgument) for a tensor
// that is not on the CPU.
std::string encode(const std::string& name, std::int64_t commit, int world_size,
                   const std::vector<Entry>& entries);

// Parses a commit file. Throws Error(InvalidArgument) saying what is wrong: not a commit,
// damaged (checksum), truncated, malformed.
Snapshot decode(std::string_view bytes);

// Throws Error(InvalidArgument) naming the first way `snapshot` does not fit `entries` (keys,
// kinds, tensor names, shapes and dtypes, the sampler's data set). Changes nothing.
void check_matches(const Snapshot& snapshot, const std::vector<Entry>& entries);

// The optimizers' states as load_optimizers() found them (a ZeroRedundancyOptimizer's: its
// shard's local optimizer's), to be put back when the load is abandoned.
struct OptimizerStates {
  std::vector<std::pair<optim::Optimizer*, optim::StateDict>> before;
  void put_back();  // Loads each saved state back, then forgets them.
};

// Loads `snapshot`'s optimizer states into `entries`' optimizers. Requires check_matches() to
// have passed. An optimizer's load_state_dict() may still refuse its state: then the ones
// loaded already get their state back, so nothing changes, and Error(InvalidArgument) says
// why. A ZeroRedundancyOptimizer refuses only on the member that owns the refused tensor, so a
// collective caller agrees on the outcome before it goes on (Note [Elastic agreement] in
// src/elastic/state.cc) and puts the states back if another rank failed.
OptimizerStates load_optimizers(const Snapshot& snapshot, const std::vector<Entry>& entries);
// The Stateful entries' loads, prepared (their bytes checked) and not yet run, in entry order.
using ObjectLoads = std::vector<std::function<void()>>;
// Calls each Stateful entry's prepare_load() on its bytes in `snapshot`, which changes nothing.
// Requires check_matches() to have passed. Throws Error(InvalidArgument) naming the entry and
// its refusal (any exception of prepare_load(), or an empty function returned).
ObjectLoads prepare_objects(const Snapshot& snapshot, const std::vector<Entry>& entries);
// Copies the rest of `snapshot` (tensors, samplers, integers, bytes) into `entries`' objects,
// then runs `objects` (prepare_objects()' of the same snapshot). Cannot fail once
// check_matches() has passed.
void load_values(const Snapshot& snapshot, const std::vector<Entry>& entries,
                 const ObjectLoads& objects);
// prepare_objects(), load_optimizers(), then load_values(): on a refusal nothing changes.
void load_into(const Snapshot& snapshot, const std::vector<Entry>& entries);

// CRC-32 of `bytes` (zlib's).
std::uint32_t crc32_of(std::string_view bytes);

}  // namespace tutti::elastic::internal

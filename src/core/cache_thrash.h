// SPDX-License-Identifier: Apache-2.0
// Telling a response cache too small for the job's recurring op names from one that is merely
// full (Note [Cache thrash]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>

#include "src/core/op_key.h"

namespace tutti::core {

// Note [Cache thrash]
// The response cache evicts the least recently used entry when it is full. When a step submits
// more ops under recurring names than the cache holds, each name is evicted before it comes
// back: every op is then negotiated in full *and* inserted into and evicted from every rank's
// cache, and hits filed just before an eviction come back as resends. That costs more than no
// cache at all: a step of P3's 10,000 names at the default 1,024 entries took 15.1-18.8 ms
// against 9.9-14.5 ms with the cache off and 2.2-3.3 ms with room for all (a P3 driver, 2 ranks
// on a 2-core AMD EPYC VM, the three in turns). Nothing else tells the user: the job is only
// slower.
//
// The cache cannot see a step, but it can see a name come back after it was evicted for room.
// CacheThrashWatch remembers the keys (as 64-bit hashes) of the latest evictions for room and
// the cache's insert count at each. A name inserted again while remembered has recurred, at a
// distance of the inserts since its eviction plus the capacity: about the number of names it
// recurs among, which is the capacity the cache would need for it to hit. Once as many
// recurrences as the capacity have been seen (the cache's whole content churned by names that
// came back), the watch reports once, with the largest distance seen, and the coordinator logs a
// warning naming TUTTI_CACHE_CAPACITY. Names that never recur (automatic ones, a name per step)
// fill the memory and are forgotten; they report nothing. So is a name that comes back after
// more evictions than the watch remembers (eight times the capacity, within kMinRemembered and
// kMaxRemembered): with the default 1,024 entries, names recurring among up to about 17,000.
//
// Cost: nothing while the cache has room (no evictions, no inserts of known names); once it is
// full, a hash-map insert per eviction and a lookup per insert, beside the full negotiation
// those ops take anyway. Memory: at most kMaxRemembered keys, about 70 bytes each.
class CacheThrashWatch {
 public:
  // What the watch found, once: the cache's capacity, the recurrences seen, and the largest
  // distance among them.
  struct Report {
    std::int64_t capacity = 0;
    std::int64_t recurrences = 0;
    std::int64_t distance = 0;
  };

  // The fewest and most evictions remembered; between them, eight times the capacity.
  static constexpr std::size_t kMinRemembered = 16384;
  static constexpr std::size_t kMaxRemembered = 65536;

  // `capacity`: the cache's entries (> 0).
  explicit CacheThrashWatch(std::int64_t capacity);

  // The cache evicted `key`'s entry to make room for an insert.
  void evicted_for_room(OpKeyView key);
  // The cache inserted an entry for `key`, after the evictions that made room for it. Returns
  // the report when this insert makes it due; at most once in the watch's life.
  std::optional<Report> inserted(OpKeyView key);

  std::size_t remembered() const { return by_hash_.size(); }

 private:
  std::size_t limit_;                                        // Evictions remembered at most.
  std::int64_t inserts_ = 0;                                 // Inserts so far.
  std::unordered_map<std::uint64_t, std::int64_t> by_hash_;  // Name -> inserts_ at eviction.
  struct Evicted {
    std::uint64_t hash = 0;
    std::int64_t at = 0;
  };
  std::deque<Evicted> order_;  // Oldest first; records of names since re-evicted are skipped.
  Report seen_;                // Its capacity is the cache's, set at construction.
  bool reported_ = false;
};

// The warning the coordinator logs for `report`: what happened, what it costs, what to set.
std::string describe(const CacheThrashWatch::Report& report);

}  // namespace tutti::core

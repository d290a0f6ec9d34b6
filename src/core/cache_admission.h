// SPDX-License-Identifier: Apache-2.0
// Which op names a full response cache lets in, and telling the user when it is too small for
// the names that recur (Notes [Cache thrash] and [Cache admission]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tutti::core {

// Note [Cache thrash]
// The response cache evicts the least recently used entry when it is full. When a step submits
// more ops under recurring names than the cache holds, plain least-recently-used evicts each name
// before it comes back: every op is then negotiated in full *and* inserted into and evicted from
// every rank's cache, and hits filed just before an eviction come back as resends. That cost
// more than no cache at all: a step of P3's 10,000 names at the default 1,024 entries took
// 15.1-18.8 ms against 9.9-14.5 ms with the cache off and 2.2-3.3 ms with room for all (a P3
// driver, 2 ranks on a 2-core AMD EPYC VM, the three in turns). Note [Cache admission] is what
// the cache does about it; the user is told too, since only a larger capacity makes every name
// hit.
//
// The cache cannot see a step, but it can see a name come back after it left: CacheAdmission
// remembers the names (as their 64-bit name_hash()) of the latest entries evicted for room and of
// the latest names it kept out, with the cache's count of misses (names negotiated in full) when
// each left. A name that misses while remembered has recurred, at a distance of the misses since it
// left plus the capacity: about the number of names it recurs among, which is the capacity the
// cache would need for it to hit. Once as many recurrences as the capacity have been seen, the
// report is due, once, with the largest distance seen: a cache that may grow grows (Note [Cache
// growth] in response_cache.h); one that may not (TUTTI_CACHE_CAPACITY set, or grown to its
// limit) keeps its capacity, and the coordinator logs a warning naming TUTTI_CACHE_CAPACITY. Names
// that never recur (automatic ones, a name per step) fill the memory and are forgotten; they report
// nothing. So is a name that comes back after more departures than the memory holds (eight times
// the capacity, within kMinRemembered and kMaxRemembered): with the default 1,024 entries, names
// recurring among up to about 17,000.
//
// Note [Cache admission]
// A full cache lets a missed name in only if that name came back sooner than the least recently
// used entry has gone unused: if the name is remembered (it left the cache, or was kept out,
// earlier) and its last use is older than the least recently used entry's, it is kept out, and
// its response goes to the ranks uncached, as responses that cannot be cached do. Otherwise the
// least recently used entry is evicted for it, as plain least-recently-used would. (The rule is
// the one LIRS admits by: a block's reuse distance against the oldest resident's recency.)
//
// Names recurring in a cycle longer than the capacity: plain least-recently-used hits none of them.
// With the rule, the first round fills the cache; from the second round on every name that was
// evicted is older than every cached entry (each is used once a round) and is kept out, so the same
// `capacity` names hit every round and nothing churns: a hit rate of capacity / names in place of
// zero. A P3 driver (one-float ops, 2 ranks on the 2-core AMD EPYC VM, median step, three rounds in
// turns) at the default 1,024 entries: 1,100 names 0.42-0.71 ms against 0.92-1.28 before (plain
// least-recently-used), 0.94-2.49 with the cache off, 0.27-0.29 with room for all; 2,000 names
// 1.55-2.32 ms against 3.87-5.92 before and 3.09-5.24 off; 10,000 names 18.7-21.0 ms against
// 27.8-36.3 before, but 13.2-23.2 off (slower in two rounds of three): at a hit rate of a tenth,
// what a miss costs with the cache on (the lookups by name, this class's probes) outweighs the
// hits. A new name (not remembered) always gets in, so a job whose names change (a new phase, an
// evaluation loop) takes its new names as before; names of an old phase that come back are kept out
// for a round (the entries of the phase in between are the more recent), get in the next, and hit
// from the round after.
//
// Cost: nothing while the cache has room (no lookup while nothing has left); once it is full, a
// probe of a flat table per miss and per departure, beside the full negotiation those ops take
// anyway. A name kept out builds no entry (CoordinatorCache::insert_made()): no copy of its
// response, and its requests' slots stay with the coordinator's record for reuse (Note [Pending
// ops by name] in negotiation/pending_ops.h). A first version kept the departures in
// std::unordered_map and std::deque: on P3's names at 1,024 entries that was 5 % of rank 0's
// samples (the nodes' allocations and cache misses). Memory, once the cache has evicted: 56 bytes a
// remembered departure (0.9 MB at the default capacity, 3.5 MB at most), allocated at the first
// one.
class CacheAdmission {
 public:
  // What the watch found, once: the cache's capacity, the recurrences seen, and the largest
  // distance among them.
  struct Report {
    std::int64_t capacity = 0;
    std::int64_t recurrences = 0;
    std::int64_t distance = 0;
    // Set by the cache: `capacity` is the most it grew to by itself, TUTTI_CACHE_CAPACITY unset
    // (Note [Cache growth] in response_cache.h).
    bool grown = false;
  };

  // The fewest and most departures remembered; between them, eight times the capacity.
  static constexpr std::size_t kMinRemembered = 16384;
  static constexpr std::size_t kMaxRemembered = 65536;

  // `capacity`: the cache's entries (> 0).
  explicit CacheAdmission(std::int64_t capacity);

  // A name the cache does not hold, whose name_hash() of (set, name) is `hash`, was negotiated in
  // full. `lru_used`: when the cache is full, the stamp of its least recently used entry's latest
  // use; nullopt while it has room. `now`: this miss's stamp, of the same clock and later than
  // every stamp given before. Whether the cache stores it (evicting that entry when full). A
  // name kept out is remembered as used at `now`.
  bool admits(std::uint64_t hash, std::optional<std::uint64_t> lru_used, std::uint64_t now);
  // The cache evicted the entry of the name whose hash is `hash`, last used at stamp `used`, to
  // make room for the name it admitted last.
  void evicted_for_room(std::uint64_t hash, std::uint64_t used) { remember(hash, used); }
  // The report, once in the cache's life, when the recurrences made it due (Note [Cache
  // thrash]); nullopt before and after.
  std::optional<Report> take_report() { return std::exchange(due_, std::nullopt); }

  std::size_t remembered() const { return remembered_; }

 private:
  void remember(std::uint64_t hash, std::uint64_t used);
  void recurred(std::int64_t left_at);
  // The slot of `index_` holding `hash`, or the empty one where it would go.
  std::size_t slot_of(std::uint64_t hash) const;
  void erase_slot(std::size_t at);  // erase_probed_slot() in name_index.h.

  std::size_t limit_;        // Departures remembered at most.
  std::int64_t misses_ = 0;  // Calls to admits() so far.
  // The latest `limit_` departures, oldest overwritten first; a record whose name left again
  // since (or got in) is stale: index_ no longer points to it.
  struct Departure {
    std::uint64_t hash = 0;  // 0: never written (name_hash() is never 0).
    std::uint64_t used = 0;  // Stamp of its last use (or of its miss, if kept out).
    std::int64_t at = 0;     // misses_ when it left.
  };
  std::vector<Departure> ring_;  // limit_ records once the first name left; empty before.
  std::size_t next_ = 0;         // The record the next departure overwrites.
  // From a remembered name's hash to its latest record: linear probing over a power-of-two
  // array at least twice limit_.
  struct Slot {
    std::uint64_t hash = 0;  // 0: empty.
    std::uint32_t record = 0;
  };
  std::vector<Slot> index_;
  std::size_t remembered_ = 0;  // Occupied slots of index_.
  Report seen_;                 // Its capacity is the cache's, set at construction.
  bool reported_ = false;
  std::optional<Report> due_;
};

// The warning the coordinator logs for `report`: what happened, what it costs, what to set.
std::string describe(const CacheAdmission::Report& report);

}  // namespace tutti::core

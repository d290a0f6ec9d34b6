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

#include "src/base/prefetch.h"

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
// remembers the names (by their 64-bit name_hash()) of the entries evicted for room and of the
// names it kept out, with the cache's count of misses (names negotiated in full) when each left,
// for as many misses as its memory holds. A name that misses while remembered has recurred, at a
// distance of the misses since it left plus the capacity: about the number of names it recurs
// among, which is the capacity the cache would need for it to hit. Once as many recurrences as the
// capacity have been seen, the report is due, once, with the largest distance seen: a cache that
// may grow grows (Note [Cache growth] in response_cache.h); one that may not (TUTTI_CACHE_CAPACITY
// set, or grown to its limit) keeps its capacity and settles (Note [Settled cache] there), and the
// coordinator logs a warning naming TUTTI_CACHE_CAPACITY. Names that never recur (a name per step)
// fill the memory and are forgotten; they report nothing. So is a name that comes back after more
// misses than the memory holds (eight times the capacity, within kMinRemembered and kMaxRemembered;
// Note [Admission memory]): with the default 1,024 entries, names recurring among up to about
// 17,000.
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
// from the round after. (A settled cache, which no longer asks, takes both later: Note [Settled
// cache] in response_cache.h.)
//
// Cost: nothing while the cache has room (no lookup while nothing has left); once it is full, one
// bucket of its memory per miss and per departure (Note [Admission memory]), beside the full
// negotiation those ops take anyway; nothing once the cache has settled. A name kept out builds no
// entry (CoordinatorCache::insert_made()): no copy of its response, and its requests' slots stay
// with the coordinator's record for reuse (Note [Pending ops by name] in
// negotiation/pending_ops.h).
//
// Note [Admission memory]
// The memory is a table of buckets of eight 16-byte records, two cache lines a bucket (which CPUs
// load as a pair): a name's bucket is its hash's low bits, and its record holds the hash's high
// 32 bits (to tell the bucket's names apart; two names of a bucket alike in those too, one pair
// in 2^31, share a record, which costs at most a wrong admission), its last use and the miss count
// when it left (modulo 2^32). A record lives for `limit_` misses after it left (eight times the
// capacity, within kMinRemembered and kMaxRemembered); an older one is free space, whatever it
// still holds. So a miss reads one bucket and writes it in place (a name kept out again updates its
// own record), and the coordinator prefetches it an op ahead (Note [Admission prefetch]).
//
// A first version kept the departures in std::unordered_map and std::deque (5 % of rank 0's
// samples on P3's names at 1,024 entries: the nodes' allocations and cache misses); the next, a
// ring of the latest departures with a linear-probing index over it, exact but three cache misses
// per name kept out, one after the other (its slot, its ring record, and the slot of the oldest
// record it overwrote), and the fixed capacity of 1,024 still slower than the cache off on P3's
// 10,000 names. A perf profile of rank 0 there (2 ranks on the 2-core AMD EPYC VM) had the ring at
// 254-517 samples of 4K-7K; the buckets, prefetched, at 36-44 of 4K (examples/BENCHMARK_LOG.md,
// fiftieth round).
//
// What the buckets give up: a bucket holds eight live names; a ninth pushes out the one that left
// first, before its time (counted by forgotten_early()). That must stay rare, and not only for
// the name: a name forgotten comes back as a new one and gets in, evicting the least recently
// used entry, and the few names that get in so scatter the cache's ids among ops that miss. In a
// first version of four-record buckets with twice as many records as names remembered, P3's
// 10,000 names at 1,024 entries lost 59 names so in their first step; the cache settled with 59
// ids apart from the rest, and the ops around them paid a lookup by name each
// (Coordinator::receive() looks a request's name up while counted hits wait): slower than the
// ring. With eight records a bucket and four times as many records as names remembered (two a
// bucket on average with the memory full of live names), losing one needs a ninth in a bucket:
// about one bucket in 4,000 then (Poisson odds), and one in 400,000 at P3's load (1.1 a bucket).
// Misses counted modulo 2^32 cannot alias: each miss also frees the dead records of one bucket in
// turn, so no record outlives `limit_` plus the buckets' count in misses. Memory, once the cache
// has evicted: 64 bytes per name remembered (1 MB at the default capacity, 4 MB at most), allocated
// at the first departure.
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

  // The fewest and most misses a departed name is remembered for; between them, eight times the
  // capacity (Note [Admission memory]).
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
  // Starts loading what admits(hash, ...) and a departure of `hash` read: its bucket, if the
  // memory exists (Note [Admission prefetch] in negotiation/coordinator.cc). Always inlined:
  // Note [Prefetches kept] in src/base/prefetch.h.
  [[gnu::always_inline]] void prefetch(std::uint64_t hash) const {
    if (!buckets_.empty())
      base::prefetch_lines(&buckets_[hash & (buckets_.size() - 1)], sizeof(Bucket));
  }
  // The report, once in the cache's life, when the recurrences made it due (Note [Cache
  // thrash]); nullopt before and after.
  std::optional<Report> take_report() { return std::exchange(due_, std::nullopt); }

  // The names remembered now (a pass over the memory: for tests).
  std::size_t remembered() const;
  // Live names pushed out of a full bucket before their time, so far.
  std::int64_t forgotten_early() const { return forgotten_early_; }
  // The memory's buckets (0 before the first departure); a name's is its hash's low bits.
  std::size_t buckets() const { return buckets_.size(); }
  static constexpr int kWays = 8;
  // Records in the memory per name it remembers at most (Note [Admission memory]).
  static constexpr std::size_t kRecordsPerName = 4;

 private:
  struct Record {
    std::uint64_t used = 0;  // Stamp of its last use (or of its miss, if kept out).
    std::uint32_t tag = 0;   // tag_of() its hash; 0: empty.
    std::uint32_t left = 0;  // misses_ when it left, modulo 2^32.
  };
  struct alignas(2 * base::kCacheLine) Bucket {  // Two cache lines, which CPUs load in pairs.
    Record way[kWays];
  };
  static std::uint32_t tag_of(std::uint64_t hash) {
    return static_cast<std::uint32_t>(hash >> 32) | 1U;  // Never 0.
  }
  bool live(const Record& record) const {
    return record.tag != 0 && static_cast<std::uint32_t>(misses_) - record.left < limit_;
  }
  Bucket& bucket_of(std::uint64_t hash) { return buckets_[hash & (buckets_.size() - 1)]; }
  // `hash`'s live record in `bucket`, or nullptr.
  Record* find(Bucket& bucket, std::uint32_t tag);
  void remember(std::uint64_t hash, std::uint64_t used);
  void recurred(std::uint32_t left);
  void sweep();  // Frees the dead records of the next bucket in turn.

  std::uint32_t limit_;          // Misses a departed name is remembered for.
  std::uint64_t misses_ = 0;     // Calls to admits() so far.
  std::vector<Bucket> buckets_;  // Empty until the first departure; then a power of two.
  std::size_t sweep_ = 0;        // The bucket sweep() frees next.
  std::int64_t forgotten_early_ = 0;
  Report seen_;  // Its capacity is the cache's, set at construction.
  bool reported_ = false;
  std::optional<Report> due_;
};

// The warning the coordinator logs for `report`: what happened, what it costs, what to set.
std::string describe(const CacheAdmission::Report& report);

}  // namespace tutti::core

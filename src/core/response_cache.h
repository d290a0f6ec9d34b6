// SPDX-License-Identifier: Apache-2.0
// The response cache: a compression of negotiation messages in steady state.
//
// Once the coordinator has negotiated an op, it stores every rank's request and the response
// under a cache id (ids are never reused) and tells every rank the id. Next time a rank
// submits the same request under that name it sends the 4-byte id instead; when every rank of
// the set did so, the coordinator answers with the id alone and each rank replays its cached
// response. The coordinator decides insertions and evictions (least recently used beyond the
// capacity, for the names a full cache lets in: Note [Cache admission]; the capacity grows
// unless the user set it: Note [Cache growth]) and announces them in its response lists, which
// every rank applies in the same order (a list's evictions after its inserts), so every rank's
// cache holds the same ids. A hit on an id the coordinator evicted meanwhile is answered with
// "resend", and the rank sends the full request; ops whose hits were filed before their id was
// evicted are negotiated afresh.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/core/cache_admission.h"
#include "src/core/id_index.h"
#include "src/core/name_index.h"
#include "src/core/op_key.h"
#include "src/core/request.h"

namespace tutti::core {

// Coordinator side. Communication thread only.
class CoordinatorCache {
 public:
  struct Entry {
    int process_set_id = 0;
    std::string name;
    std::vector<std::shared_ptr<const Request>> requests;  // By set rank.
    Response response;
  };

  // Note [Cache growth]
  // The default capacity, 1,024 entries, is Horovod's; a model with more parameter tensors than
  // that (a transformer of 96 layers has about 1,200) recurs among more names than it holds, and
  // then at most 1,024 of its ops hit (Note [Cache admission]). So, while TUTTI_CACHE_CAPACITY is
  // unset, the cache grows: when CacheAdmission reports that names recur among about D (Note
  // [Cache thrash]), the capacity becomes the larger of twice itself and D + D / 4, up to
  // `growth_limit`, and the admission memory starts afresh (every name is new to it, and gets in
  // while there is room). It grows again if the names need more still; at `growth_limit` it
  // reports and settles, as a cache of fixed capacity does (Note [Settled cache]), and the
  // coordinator warns. Only rank 0's cache has a capacity: the ranks' caches hold the ids it
  // announces, and erase the ids it evicts. The limit (cache_growth_limit()) bounds what the
  // entries cost: rank 0 keeps every member's request with each entry, so an entry costs it about
  // 0.5 KB and 0.25 KB a member (Entry is 320 bytes and Request 168, with their allocations): at
  // the limit, at most about 64 MB. P3's 10,000 names at 4 ranks (2 cores): rank 0's peak
  // resident memory 54.0 MB grown (to 12,501 entries) against 47.6 MB at a fixed 1,024; the other
  // ranks' 37.7-38.3 MB either way. A capacity the user set is never changed.
  //
  // A P3 driver (one-float ops, 2 ranks on the 2-core AMD EPYC VM, median of 40 steps, three
  // rounds in turns; the growth's first steps among them): 10,000 names 2.8-4.0 ms a step
  // against 12.3-16.3 ms at a fixed 1,024 entries and 9.2-14.1 ms with the cache off; 2,000
  // names 0.47-0.68 against 1.65-2.25 ms; 1,100 names 0.29-0.42 against 0.53-0.56 ms. With
  // 10,000 names the cache grows in the second step (to 12,501 entries), takes the last names in
  // the third, and every op hits from the fourth.
  //
  // `capacity`: entries, 0 for none (every op negotiated in full). `growth_limit`: the most it
  // grows to (Note [Cache growth]); at most `capacity` for a cache that never grows.
  CoordinatorCache(std::int64_t capacity, std::int64_t growth_limit)
      : capacity_(capacity),
        growth_limit_(growth_limit),
        grows_(growth_limit > capacity),
        admission_(capacity) {}
  explicit CoordinatorCache(std::int64_t capacity) : CoordinatorCache(capacity, capacity) {}

  bool enabled() const { return capacity_ > 0; }
  // Entries it holds at most now: the capacity it was made with, or what it grew to.
  std::int64_t capacity() const { return capacity_; }
  // The entry for `id`, marked as recently used; null if unknown (evicted).
  const Entry* find(std::int32_t id);
  // The process set of `id`'s op, marked as recently used as find() marks it; nullopt if
  // unknown. Reads the id's slot only: a pass over a stretch of hits needs no more (Note [Hit
  // fast path] in negotiation/coordinator.h), and the entries of a step of thousands of ops
  // are far from the core's cache, while their slots lie side by side.
  std::optional<int> use_set(std::int32_t id);
  // The entry for `id`, not marked as used; null if unknown.
  const Entry* get(std::int32_t id) const;
  // As find(), as a pointer that keeps the entry alive after an eviction (the coordinator's
  // record of hits still pending on it needs its requests); null if unknown.
  std::shared_ptr<const Entry> use(std::int32_t id);
  // Whether `id` is cached. Not marked as used.
  bool contains(std::int32_t id) const { return entries_.contains(id); }
  // As use(), not marked as used.
  std::shared_ptr<const Entry> peek(std::int32_t id) const;
  // The id cached for (set, name), if any.
  std::optional<std::int32_t> id_of(OpKeyView key) const;
  // Stores a negotiated op and returns its new id, or -1 when a full cache keeps the name out
  // (Note [Cache admission] in cache_admission.h, and Note [Settled cache]). Ids of the same
  // name and of the least recently used entry, when it makes room, are appended to `evicted`.
  std::int32_t insert(Entry entry, std::vector<std::int32_t>* evicted) {
    const OpKeyView key{entry.process_set_id, entry.name};
    return insert_made(
        key, [&] { return std::move(entry); }, evicted);
  }
  // insert() of the Entry that `make()` returns, whose (set, name) is `key` (viewing a string
  // that outlives the call): make() is called only if the name gets in, so that a name kept out
  // costs no Entry (a copy of the response; the requests, which the caller keeps).
  template <class Make>
  std::int32_t insert_made(OpKeyView key, Make&& make, std::vector<std::int32_t>* evicted) {
    return insert_made(key, name_hash(key), std::forward<Make>(make), evicted);
  }
  // The same, given `hash`, name_hash() of `key` (which the caller kept).
  template <class Make>
  std::int32_t insert_made(OpKeyView key, std::uint64_t hash, Make&& make,
                           std::vector<std::int32_t>* evicted) {
    const std::optional<std::uint64_t> used = admit(key, hash, evicted);
    return used ? store(hash, *used, make()) : -1;
  }
  // Starts loading what an insert of the name whose name_hash() is `hash` reads first: its slot
  // in the index by name and its record in the admission's memory (Note [Admission prefetch] in
  // negotiation/coordinator.cc).
  [[gnu::always_inline]] void prefetch_insert(std::uint64_t hash) const {
    by_key_.prefetch(hash);
    if (!settled_) admission_.prefetch(hash);  // A settled cache does not read it.
  }
  void erase_set(int process_set_id, std::vector<std::int32_t>* evicted);
  // The entries of the ids appended to `evicted` since the last call, in the same order: the
  // coordinator's pending hits on an evicted id still need its requests.
  std::vector<std::shared_ptr<const Entry>> take_evicted();
  // Once in the cache's life, after the insert that found it: the cache is too small for the
  // names that recur (Note [Cache thrash] in cache_admission.h), and cannot grow (Note [Cache
  // growth]); nullopt otherwise.
  std::optional<CacheAdmission::Report> take_thrash_report() { return std::exchange(thrash_, {}); }
  // What the cache grew by, once after each insert that made it grow (Note [Cache growth]).
  struct Growth {
    std::int64_t from = 0;
    std::int64_t to = 0;
    std::int64_t distance = 0;  // The names the recurring ones recur among, about.
  };
  std::optional<Growth> take_growth() { return std::exchange(growth_, {}); }
  // Whether a full cache keeps every missed name out without asking its admission now (Note
  // [Settled cache]).
  bool settled() const { return settled_; }
  std::size_t size() const { return entries_.size(); }
  // Records in its least-recently-used heap, live or not (Note [Least recently used by
  // stamps]): for tests of their bound.
  std::size_t age_records() const { return by_age_.size(); }

 private:
  // Once `by_age_` holds more than twice as many records as there are live ids, plus this many,
  // erase() rebuilds it from the live ids: records of erased ids wait there otherwise, and where
  // names are renegotiated again and again with nothing evicted for capacity, none reaches the
  // top to be dropped.
  static constexpr std::size_t kAgeSlack = 1024;

  void erase(std::int32_t id, std::vector<std::int32_t>* evicted);
  // insert()'s first half: erases the name's old entry, asks admission_ (settling its report),
  // and evicts to make room if the name gets in. The new entry's stamp, or nullopt if kept out.
  std::optional<std::uint64_t> admit(OpKeyView key, std::uint64_t hash,
                                     std::vector<std::int32_t>* evicted);
  // insert()'s second half: stores `entry`, whose name_hash() is `hash`, stamped `used`; its id.
  std::int32_t store(std::uint64_t hash, std::uint64_t used, Entry entry);
  // The stamp of the least recently used entry's latest use, its record brought to the top of
  // `by_age_`; nullopt if there is none.
  std::optional<std::uint64_t> oldest_use();
  // Erases the least recently used entry; false if there is none.
  bool evict_least_recent(std::vector<std::int32_t>* evicted);
  void push_age(std::int32_t id, std::uint64_t used);
  struct Slot;
  Slot* touch(std::int32_t id);  // Marks `id` as recently used; null if unknown.

  // What a report of CacheAdmission's leads to: growth, or a report for the user and a settled
  // cache (Note [Settled cache]).
  void settle(const CacheAdmission::Report& report);
  // Whether the least recently used entry, last used at stamp `lru_used`, was used within
  // `stale_after_` stamps of `now`: the names cached still recur.
  bool fresh(std::uint64_t lru_used, std::uint64_t now) const {
    return now - lru_used <= stale_after_;
  }
  // Note [Settled cache]
  // A full cache asks its admission about every name it misses (Note [Cache admission]): one
  // bucket of a memory of a megabyte or more, at a random place, per miss. Where a cache that
  // cannot grow is too small for the names that recur, that is nearly every op, and once its
  // names have settled the answer is always the same: kept out. On P3's 10,000 names at a fixed
  // 1,024 entries (2 ranks, the 2-core AMD EPYC VM of family 26) the step took 10.6-10.9 ms
  // against 8.7-10.7 with the cache off; with the memory left unasked it took the cache off's
  // time (examples/BENCHMARK_LOG.md, fifty-third round). So once the admission has reported and
  // the cache cannot grow, the cache settles: a full settled cache keeps each missed name out
  // without asking, remembering nothing, as long as its least recently used entry was used
  // within the last `stale_after_` stamps (twice the names the report says the recurring ones
  // recur among: in a steady cycle every cached entry is used once a cycle). An entry older than
  // that means the names cached no longer recur (a new phase of the job): the cache unsettles and
  // asks the admission again, whose memory, left as it was when the cache settled, still knows
  // the names of before (their last uses are older than any entry's: kept out) and takes the new
  // ones (not remembered: in). Once the admission has kept `capacity_` names out again with the
  // least recently used entry within `stale_after_` (the names have settled anew), the cache
  // settles again, with the same `stale_after_`. What it gives up: where a cycle is a step, a
  // new phase's names hit from its fourth step instead of its second, and an old phase's names
  // that come back (remembered as used before the cache settled) from the fourth instead of the
  // third (test/unit/core/response_cache_test.cc walks through both). Settled, P3's steps above
  // took 9.15-9.58 ms against 10.60-11.49 unsettled and 8.68-11.96 with the cache off (six
  // rounds in turns, fifty-fourth round); a switch to 10,000 other names had its one slow step
  // (31-38 ms: every name negotiated, inserted and evicted) two steps after the switch instead of
  // at it.
  std::uint64_t stale_after_ = 0;  // 0 until the cache has reported: it never settles before.
  bool settled_ = false;
  std::int64_t kept_out_ = 0;  // Names the admission kept out since the cache last unsettled.

  std::int64_t capacity_;
  const std::int64_t growth_limit_;
  const bool grows_;  // Whether it was made to grow: then a report says it grew to its limit.
  std::int32_t next_id_ = 0;
  // Note [Least recently used by stamps]
  // Every hit marks its entry as used, and a step of 10,000 tiny ops hits 10,000 entries. A
  // list in order of use moved the entry's node to the front on each: three nodes of a cold
  // list written per hit, about 3 % of such a step (P3, 2 ranks on the 2-core AMD EPYC VM). Now
  // a hit writes the next stamp into the entry's own slot, which find() has just read, and the
  // order is worked out only when the cache is full. `by_age_`, a min-heap of (stamp, id), holds
  // one record for each live id, with the stamp the id had when the record was made, and the
  // records of ids erased since. The top record is the least recently used entry if its stamp is
  // still the entry's; if the entry was used since, the record goes back with the newer stamp,
  // and if the id was erased, it is dropped. A record whose stamp is current is the oldest of
  // all: every record's stamp is at most its entry's, so no live entry was used before it. A
  // record goes back at most once per use, so eviction costs O(log n) per use at most, and
  // nothing while the cache has room. The evictions are those of the list, in the same order.
  std::uint64_t clock_ = 0;  // The last stamp handed out; stamps are never reused.
  struct Age {
    std::uint64_t stamp = 0;
    std::int32_t id = -1;
    // Ordered for std::push_heap's max-heap: the largest is the oldest.
    friend bool operator<(const Age& a, const Age& b) { return a.stamp > b.stamp; }
  };
  std::vector<Age> by_age_;
  struct Slot {
    std::shared_ptr<const Entry> entry;  // Never null.
    std::uint64_t used = 0;              // Stamp of its insert or latest use.
    int process_set_id = 0;              // The entry's, for use_set(). In what was padding.
  };
  IdIndex<Slot> entries_;
  // The id of each cached (set, name), with its entry for the key: one probe of a flat array
  // (Note [Name index]), which every miss takes (id_of() in the coordinator, insert()).
  struct Keyed {
    std::int32_t id = -1;
    const Entry* entry = nullptr;  // The slot's, alive while the id is cached.
  };
  struct KeyedKey {
    OpKeyView operator()(const Keyed& keyed) const {
      return OpKeyView{keyed.entry->process_set_id, keyed.entry->name};
    }
  };
  NameIndex<Keyed, KeyedKey> by_key_;
  std::vector<std::shared_ptr<const Entry>> evicted_;  // See take_evicted().
  CacheAdmission admission_;
  std::optional<CacheAdmission::Report> thrash_;  // See take_thrash_report().
  std::optional<Growth> growth_;                  // See take_growth().
};

// The most entries a cache of `capacity` grows to by itself in a job of `world_size` ranks
// (Note [Cache growth]): `capacity` when the user set it (`capacity_set`) or it is 0; otherwise
// kGrownRequests requests' worth (an entry keeps one per member of its set: world_size at most),
// within `capacity` and kMaxGrownCapacity.
inline constexpr std::int64_t kGrownRequests = 131072;
inline constexpr std::int64_t kMaxGrownCapacity = 65536;
std::int64_t cache_growth_limit(std::int64_t capacity, bool capacity_set, int world_size);

// What the executor derives from a response (its fusion key and bytes), kept with the cached
// response so that a hit does not derive it again: a few hundred instructions per op in P3.
// The default, key 0 and SIZE_MAX bytes, fuses with nothing (Note [Fusion rules]).
struct ResponseFacts {
  std::uint64_t fusion_key = 0;
  std::size_t fusion_bytes = SIZE_MAX;
};

// Rank side. Communication thread only.
class RankCache {
 public:
  // The id to send for `request`, if it equals the request cached under its name.
  // `name_hash`: name_hash() of its (set, name), which the queue's entry keeps.
  std::optional<std::int32_t> lookup(const Request& request, std::uint64_t name_hash) const;
  std::optional<std::int32_t> lookup(const Request& request) const;
  // Starts loading what lookup(request, name_hash) reads first (NameIndex::prefetch()).
  [[gnu::always_inline]] void prefetch(std::uint64_t name_hash) const {
    by_key_.prefetch(name_hash);
  }
  // Starts loading the cached request that lookup(request, name_hash) compares `request` with,
  // once prefetch(name_hash) has loaded its index slot. See Note [Lookup pipeline].
  void prefetch_request(std::uint64_t name_hash) const;
  // Whether `id` is cached for `request`: its (set, name) and the rest of it equal, as lookup()
  // would find it. Reads only id's slot, never the index by name: for the id a rank expects
  // its next op to hit (Note [Lookup by the next id] in negotiation/request_sender.cc).
  bool matches(std::int32_t id, const Request& request, std::uint64_t name_hash) const;
  // Starts loading what matches(id, ...) reads, if `id` is cached.
  void prefetch_id(std::int32_t id) const;
  // The response stored under `id`; null if unknown (a protocol error). `name_hash`, if not
  // null, receives NameIndex's hash of its (set, name); `facts`, if not null, what insert()
  // was given.
  const Response* response(std::int32_t id, std::uint64_t* name_hash = nullptr,
                           ResponseFacts* facts = nullptr) const;
  // Starts loading what response(id, ...) and the executor read of id's cached response, if
  // any: for loops over a run of hits (Note [Lookup pipeline] in negotiation/request_sender.cc).
  void prefetch_response(std::int32_t id) const;
  void insert(std::int32_t id, const Request& request, const Response& response,
              ResponseFacts facts = {});
  void erase(std::int32_t id);

 private:
  // What the executor reads of a hit (response(): hash, facts, the response's first lines)
  // first, the request that only lookup() compares last.
  struct Slot {
    std::uint64_t name_hash = 0;
    ResponseFacts facts;
    Response response;
    Request request;
  };
  // The newest id of each (set, name). Slots never move (each is an allocation of its own), so a
  // lookup goes straight from the name to the cached request: one probe per op, with the hash
  // the queue computed (Note [Name index]).
  struct Newest {
    std::int32_t id = -1;
    const Slot* slot = nullptr;
  };
  struct NewestKey {
    OpKeyView operator()(const Newest& newest) const {
      return OpKeyView{newest.slot->request.process_set_id, newest.slot->request.name};
    }
  };
  using ByKey = NameIndex<Newest, NewestKey>;
  IdIndex<std::unique_ptr<Slot>> entries_;  // Never null. Slots stay put: Newest points to them.
  ByKey by_key_;
};

// "<set>:<name>", the key both caches file entries under.
std::string cache_key(int process_set_id, const std::string& name);

}  // namespace tutti::core

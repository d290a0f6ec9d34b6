// SPDX-License-Identifier: Apache-2.0
#include "ops/shm/shm_backend.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "ops/convert.h"
#include "ops/fault_injection.h"
#include "ops/mpi/mpi_backend.h"
#include "ops/mpi/mpi_error.h"
#include "ops/shm/reduce.h"
#include "src/base/dtype.h"

namespace tutti::ops::shm {
namespace {

using Counter = ShmRing::Counter;

// Bytes per slot: a rank's chunk, its share of it and the peers' shares it reads stay in a
// core's L2 cache (1-2 MB on the machines measured) between packing, reducing and unpacking.
constexpr std::size_t kSlotBytes = 256 * 1024;
// Slots per rank: enough that a rank may run a few chunks ahead of the slowest reader.
constexpr int kSlots = 4;
// Up to this size an allreduce is reduced whole by every rank (see allreduce_tensors): the
// redundant work costs less than a second round of synchronization.
constexpr std::size_t kWholeChunkBytes = 4096;

std::byte* at(void* base, std::size_t bytes) { return static_cast<std::byte*>(base) + bytes; }
const std::byte* at(const void* base, std::size_t bytes) {
  return static_cast<const std::byte*>(base) + bytes;
}

// `bytes` from `from` + `offset` to `to` + `to_offset`. Nothing at all when there are none: a
// rank with no data of its own (joined, or 0 rows) may pass null, where even the address
// arithmetic is undefined.
void copy(void* to, std::size_t to_offset, const void* from, std::size_t offset,
          std::size_t bytes) {
  if (bytes > 0) std::memcpy(at(to, to_offset), at(from, offset), bytes);
}

// copy() into a ring slot, with the stores the collective's StagingRun chose.
void stage(void* slot, std::size_t slot_offset, const void* from, std::size_t offset,
           std::size_t bytes, bool streaming) {
  if (streaming && bytes > 0) {
    stream_copy(at(slot, slot_offset), at(from, offset), bytes);
  } else {
    copy(slot, slot_offset, from, offset, bytes);
  }
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a);
  const auto b_begin = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

// Bytes of a `total`-byte block in the round that starts at `done`, rounds being `round` long.
std::size_t in_round(std::size_t total, std::size_t done, std::size_t round) {
  return total > done ? std::min(round, total - done) : 0;
}

// The bytes of `counts` elements of `dtype` in all: what a collective over blocks moves, the
// same on every rank (the size class route_host() routes by).
std::size_t total_bytes(std::span<const std::size_t> counts, DataType dtype) {
  std::size_t elements = 0;
  for (std::size_t count : counts) elements += count;
  return elements * tutti::detail::element_bytes(dtype);
}

// Where each rank's block of a collective over blocks lies, back to back in rank order, in
// bytes; `largest` leaves out the root's block (root -1: none), which never crosses the ring.
struct BlockLayout {
  std::vector<std::size_t> starts;  // One per rank, then the end of the last block.
  std::size_t total = 0;
  std::size_t largest = 0;

  std::size_t offset(int rank) const { return starts[static_cast<std::size_t>(rank)]; }
  std::size_t bytes(int rank) const {
    return starts[static_cast<std::size_t>(rank) + 1] - starts[static_cast<std::size_t>(rank)];
  }
};

BlockLayout block_layout(std::span<const std::size_t> counts, DataType dtype, int root) {
  const std::size_t element = tutti::detail::element_bytes(dtype);
  BlockLayout layout;
  layout.starts.reserve(counts.size() + 1);
  for (std::size_t r = 0; r < counts.size(); ++r) {
    layout.starts.push_back(layout.total);
    layout.total += counts[r] * element;
    if (static_cast<int>(r) != root) layout.largest = std::max(layout.largest, counts[r] * element);
  }
  layout.starts.push_back(layout.total);
  return layout;
}

// Where `rank`'s share of a chunk of `length` elements starts (rank == size: its end).
std::size_t share_start(std::size_t length, int rank, int size, std::size_t align) {
  if (rank >= size) return length;
  const std::size_t even = length * static_cast<std::size_t>(rank) / static_cast<std::size_t>(size);
  return std::min(length, even / align * align);
}

// The fused tensors as one stream of wire elements, cut into arbitrary ranges.
class Stream {
 public:
  explicit Stream(std::span<const FusedTensor> tensors) : tensors_(tensors) {
    starts_.reserve(tensors.size() + 1);
    std::size_t offset = 0;
    for (const FusedTensor& t : tensors) {
      starts_.push_back(offset);
      offset += t.count;
    }
    starts_.push_back(offset);
  }
  std::size_t total() const { return starts_.back(); }

  // Calls f(tensor, first element in the tensor, first element in the range, count) for each
  // tensor overlapping [begin, end).
  template <class F>
  void for_each(std::size_t begin, std::size_t end, F f) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, begin);
    for (std::size_t t = static_cast<std::size_t>(it - starts_.begin()) - 1;
         t < tensors_.size() && starts_[t] < end; ++t) {
      const std::size_t from = std::max(begin, starts_[t]);
      const std::size_t to = std::min(end, starts_[t + 1]);
      if (to > from) f(tensors_[t], from - starts_[t], from - begin, to - from);
    }
  }

 private:
  std::span<const FusedTensor> tensors_;
  std::vector<std::size_t> starts_;
};

// Copies reduced wire elements [begin, end) of `stream` from `reduced` into the outputs,
// converted and scaled.
void unpack(const Stream& stream, std::size_t begin, std::size_t end, const std::byte* reduced,
            DataType wire) {
  const std::size_t element = tutti::detail::element_bytes(wire);
  stream.for_each(
      begin, end, [&](const FusedTensor& t, std::size_t from, std::size_t to, std::size_t count) {
        if (t.output == nullptr) return;
        cpu::convert_scale(at(t.output, from * tutti::detail::element_bytes(t.output_type)),
                           t.output_type, reduced + to * element, wire, count, t.factor);
      });
}

// Note [Own share read in place]
// A rank reduces one share of each chunk, and it used to stage all of its chunk first, its own
// share included: a copy of that share into its slot that only it ever read back. Where the
// inputs are already as the wire has them (its dtype, no prescale: every float32 allreduce
// without a prescale factor), the rank now stages the other shares only and reduces its own
// straight from its inputs, a copy of 1/size of the data less. With streaming stores the
// reduced share goes out with them as well (reduced into a scratch buffer, which the rank's
// own unpack then reads in cache): a peer that reads it then reads memory, not the reducer's
// cache, the transfer that streaming stores exist to avoid (Note [Streaming stores] in
// staging.h; the staged data alone had gone that way). 2 ranks on the AMD EPYC VM of family 25
// model 1, `allreduce_benchmark --stores` (P1, ResNet-50's 102 MB of gradients), in alternated
// runs: with the two vCPUs close (a cache line's round trip 95-115 ns) ordinary stores took
// 12.4-12.6 ms against 13.8-14.6 before; with them apart (400-500 ns) streaming stores took
// 15.6-17.0 ms against 21.9-22.6. Which share a rank reduces and the order it combines the
// sources in are unchanged, so the results keep their bits.

// Whether `t`'s input holds its elements as the wire has them (that dtype, no prescale): they
// can be copied or read as they are.
bool input_as_wire(const FusedTensor& t, DataType wire) {
  return t.input != nullptr && t.input_type == wire && t.prescale == 1.0;
}

// Whether every element of [begin, end) of `stream` is in an input already as the wire has it,
// so that it can be reduced from there (Note [Own share read in place]).
bool readable_as_wire(const Stream& stream, std::size_t begin, std::size_t end, DataType wire) {
  bool readable = true;
  stream.for_each(begin, end, [&](const FusedTensor& t, std::size_t, std::size_t, std::size_t) {
    readable = readable && input_as_wire(t, wire);
  });
  return readable;
}

// Reduces this rank's share [lo, hi) of the chunk that starts at element `begin` of `stream`
// into `into` (where the share's first element goes). Its own elements come from its inputs
// (`from_inputs`, Note [Own share read in place]) or its slot; the peers' from their slots.
// Always its own first, then the peers' in rank order: the order reduce() combines them in
// when the destination is the rank's own slot (reduce.h), so every path gives the same bits.
// `sources` has a place for every rank.
void reduce_share(ShmRing& ring, std::vector<const void*>& sources, const Stream& stream,
                  std::size_t begin, std::size_t lo, std::size_t hi, std::uint64_t chunk,
                  DataType wire, WireOp op, bool from_inputs, std::byte* into) {
  const std::size_t element = tutti::detail::element_bytes(wire);
  const int me = ring.rank();
  // Elements [first, first + count) of the chunk, this rank's own read from `own`.
  const auto reduce_range = [&](std::size_t first, std::size_t count, const void* own) {
    std::size_t s = 0;
    sources[s++] = own;
    for (int r = 0; r < ring.size(); ++r) {
      if (r != me) sources[s++] = ring.slot(r, chunk) + first * element;
    }
    cpu::reduce(into + (first - lo) * element, sources, count, wire, op);
  };
  if (!from_inputs) {
    reduce_range(lo, hi - lo, ring.slot(me, chunk) + lo * element);
    return;
  }
  stream.for_each(begin + lo, begin + hi,
                  [&](const FusedTensor& t, std::size_t from, std::size_t to, std::size_t count) {
                    reduce_range(lo + to, count, at(t.input, from * element));
                  });
}

}  // namespace

Status ShmBackend::allreduce(void* data, std::size_t count, DataType dtype, WireOp op) {
  if (over_mpi(count * tutti::detail::element_bytes(dtype)))
    return mpi_->allreduce(data, count, dtype, op);
  const FusedTensor tensor{
      .input = data, .input_type = dtype, .output = data, .output_type = dtype, .count = count};
  return allreduce_tensors({&tensor, 1}, dtype, op);
}

Status ShmBackend::allreduce_tensors(std::span<const FusedTensor> tensors, DataType wire,
                                     WireOp op) {
  TUTTI_RETURN_IF_ERROR(take_allreduce_fault());
  return reduce_chunks(tensors, wire, op, -1);
}

Status ShmBackend::reduce(const void* input, void* output, std::size_t count, DataType dtype,
                          WireOp op, int root) {
  if (over_mpi(count * tutti::detail::element_bytes(dtype)))
    return mpi_->reduce(input, output, count, dtype, op, root);
  const FusedTensor tensor{.input = input,
                           .input_type = dtype,
                           .output = rank() == root ? output : nullptr,
                           .output_type = dtype,
                           .count = count};
  return reduce_chunks({&tensor, 1}, dtype, op, root);
}

Status ShmBackend::reduce_tensors(std::span<const FusedTensor> tensors, DataType wire, WireOp op,
                                  int root) {
  return reduce_chunks(tensors, wire, op, root);
}

// Per chunk: pack this rank's elements into its slot (converted, prescaled), reduce its share
// of the chunk across every rank's slot into its own, then copy every rank's reduced share
// out into the outputs (converted, scaled): every rank (allreduce, root -1), or the root
// alone (reduce), the others moving on as soon as their share is reduced. A collective that
// fits one small chunk skips the shares: every rank that keeps the result (all, or the root)
// reduces the whole chunk from every slot into a scratch buffer of its own, the same sources
// in the same order everywhere, so every rank gets the same bits with one synchronization
// less. See Note [Shared-memory ring] and Note [Own share read in place].
Status ShmBackend::reduce_chunks(std::span<const FusedTensor> tensors, DataType wire, WireOp op,
                                 int root) {
  const Stream stream(tensors);
  const std::size_t element = tutti::detail::element_bytes(wire);
  const std::size_t chunk_elements = ring_->slot_bytes() / element;
  const std::size_t align = std::max<std::size_t>(1, kCacheLine / element);
  const bool whole = stream.total() * element <= kWholeChunkBytes;
  const int n = size();
  const int me = rank();
  const bool keeps = root < 0 || root == me;  // This rank receives the result.
  sources_.resize(static_cast<std::size_t>(n));
  const StagingRun run(staging_[kReduce], stream.total() * element);
  for (std::size_t begin = 0; begin < stream.total(); begin += chunk_elements) {
    const std::size_t length = std::min(chunk_elements, stream.total() - begin);
    const std::uint64_t chunk = ring_->take_chunk();
    ring_->wait_slot_free(chunk);
    std::byte* mine = ring_->slot(me, chunk);
    // This rank's share, and whether it reduces that share from its inputs as they are.
    const std::size_t lo = whole ? 0 : share_start(length, me, n, align);
    const std::size_t hi = whole ? 0 : share_start(length, me + 1, n, align);
    const bool in_place = hi > lo && readable_as_wire(stream, begin + lo, begin + hi, wire);
    // Stages elements [first, last) of the chunk into this rank's slot.
    const auto stage_range = [&](std::size_t first, std::size_t last) {
      stream.for_each(
          begin + first, begin + last,
          [&](const FusedTensor& t, std::size_t from, std::size_t to, std::size_t count) {
            std::byte* into = mine + (first + to) * element;
            if (t.input == nullptr) {
              std::memset(into, 0, count * element);
            } else if (run.streaming() && input_as_wire(t, wire)) {
              stream_copy(into, at(t.input, from * element), count * element);
            } else {
              cpu::convert_scale(into, wire,
                                 at(t.input, from * tutti::detail::element_bytes(t.input_type)),
                                 t.input_type, count, t.prescale);
            }
          });
    };
    if (in_place) {
      stage_range(0, lo);
      stage_range(hi, length);
    } else {
      stage_range(0, length);
    }
    ring_->publish(Counter::Staged, chunk);
    if (whole) {
      if (!keeps) {
        // Nothing to read: the root's Consumed frees this rank's slot for reuse.
        ring_->publish(Counter::Consumed, chunk);
        continue;
      }
      ring_->wait_all(Counter::Staged, chunk);
      scratch_.resize(length * element);
      for (int r = 0; r < n; ++r) sources_[static_cast<std::size_t>(r)] = ring_->slot(r, chunk);
      cpu::reduce(scratch_.data(), sources_, length, wire, op);
      ring_->publish(Counter::Consumed, chunk);
      unpack(stream, begin, begin + length, scratch_.data(), wire);
      continue;
    }
    ring_->wait_all(Counter::Staged, chunk);
    // Streaming stores send the share's result to memory as well (Note [Own share read in
    // place]): reduced in a scratch buffer, in cache for this rank's own unpack.
    const bool streamed = run.streaming();
    std::byte* reduced = mine + lo * element;
    if (streamed) {
      scratch_.resize((hi - lo) * element);
      reduced = scratch_.data();
    }
    reduce_share(*ring_, sources_, stream, begin, lo, hi, chunk, wire, op, in_place, reduced);
    if (streamed && hi > lo) stream_copy(mine + lo * element, reduced, (hi - lo) * element);
    ring_->publish(Counter::Reduced, chunk);
    for (int r = 0; r < n && keeps; ++r) {
      if (r != me) ring_->wait(r, Counter::Reduced, chunk);
      const std::size_t r_lo = share_start(length, r, n, align);
      const std::size_t r_hi = share_start(length, r + 1, n, align);
      unpack(stream, begin + r_lo, begin + r_hi,
             r == me ? reduced : ring_->slot(r, chunk) + r_lo * element, wire);
    }
    ring_->publish(Counter::Consumed, chunk);
  }
  return Status();
}

// Rounds of one slot per rank: each rank stages the next piece of its block, then copies every
// peer's piece out into its place in the output.
Status ShmBackend::allgatherv(const void* input, void* output, std::span<const std::size_t> counts,
                              DataType dtype) {
  if (over_mpi(total_bytes(counts, dtype))) return mpi_->allgatherv(input, output, counts, dtype);
  const int me = rank();
  const BlockLayout blocks = block_layout(counts, dtype, /*root=*/-1);
  const std::size_t my_bytes = blocks.bytes(me);
  // This rank's own block goes straight from the input.
  if (my_bytes > 0 && at(output, blocks.offset(me)) != input) {
    std::memmove(at(output, blocks.offset(me)), input, my_bytes);
  }
  const StagingRun run(staging_[kGather], blocks.total);
  const std::size_t round = ring_->slot_bytes();
  for (std::size_t done = 0; done < blocks.largest; done += round) {
    const std::uint64_t chunk = ring_->take_chunk();
    ring_->wait_slot_free(chunk);
    stage(ring_->slot(me, chunk), 0, input, done, in_round(my_bytes, done, round), run.streaming());
    ring_->publish(Counter::Staged, chunk);
    for (int r = 0; r < size(); ++r) {
      if (r == me) continue;
      ring_->wait(r, Counter::Staged, chunk);
      copy(output, blocks.offset(r) + done, ring_->slot(r, chunk), 0,
           in_round(blocks.bytes(r), done, round));
    }
    ring_->publish(Counter::Consumed, chunk);
  }
  return Status();
}

// As allgatherv, but only the root copies the pieces out: the others stage theirs and move on
// (the root's Consumed frees their slots for reuse).
Status ShmBackend::gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                           DataType dtype, int root) {
  if (over_mpi(total_bytes(counts, dtype)))
    return mpi_->gatherv(input, output, counts, dtype, root);
  const int me = rank();
  const BlockLayout blocks = block_layout(counts, dtype, root);
  const std::size_t my_bytes = blocks.bytes(me);
  if (me == root && my_bytes > 0 && at(output, blocks.offset(me)) != input) {
    std::memmove(at(output, blocks.offset(me)), input, my_bytes);
  }
  const StagingRun run(staging_[kRootedGather], blocks.total);
  const std::size_t round = ring_->slot_bytes();
  for (std::size_t done = 0; done < blocks.largest; done += round) {
    const std::uint64_t chunk = ring_->take_chunk();
    ring_->wait_slot_free(chunk);
    if (me != root) {
      stage(ring_->slot(me, chunk), 0, input, done, in_round(my_bytes, done, round),
            run.streaming());
      ring_->publish(Counter::Staged, chunk);
      ring_->publish(Counter::Consumed, chunk);
      continue;
    }
    ring_->publish(Counter::Staged, chunk);
    for (int r = 0; r < size(); ++r) {
      if (r == me) continue;
      ring_->wait(r, Counter::Staged, chunk);
      copy(output, blocks.offset(r) + done, ring_->slot(r, chunk), 0,
           in_round(blocks.bytes(r), done, round));
    }
    ring_->publish(Counter::Consumed, chunk);
  }
  return Status();
}

// Each round the root fills its slot with one share per other member, the next piece of that
// member's block, and each member copies its share out. The root's own block is a local copy.
Status ShmBackend::scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                            DataType dtype, int root) {
  if (over_mpi(total_bytes(counts, dtype)))
    return mpi_->scatterv(input, counts, output, dtype, root);
  const int n = size();
  const int me = rank();
  const BlockLayout blocks = block_layout(counts, dtype, root);
  if (me == root) copy(output, 0, input, blocks.offset(me), blocks.bytes(me));
  if (n == 1) return Status();
  // Share j of the slot (whole cache lines) belongs to the j-th member other than the root.
  const std::size_t share =
      std::max<std::size_t>(1, ring_->slot_bytes() / static_cast<std::size_t>(n - 1) / kCacheLine) *
      kCacheLine;
  auto share_of = [root](int r) { return static_cast<std::size_t>(r < root ? r : r - 1); };
  const StagingRun run(staging_[kScatter], blocks.total);
  for (std::size_t done = 0; done < blocks.largest; done += share) {
    const std::uint64_t chunk = ring_->take_chunk();
    ring_->wait_slot_free(chunk);
    if (me == root) {
      for (int r = 0; r < n; ++r) {
        if (r == root) continue;
        stage(ring_->slot(me, chunk), share_of(r) * share, input, blocks.offset(r) + done,
              in_round(blocks.bytes(r), done, share), run.streaming());
      }
      ring_->publish(Counter::Staged, chunk);
    } else {
      ring_->wait(root, Counter::Staged, chunk);
      copy(output, done, ring_->slot(root, chunk), share_of(me) * share,
           in_round(blocks.bytes(me), done, share));
    }
    ring_->publish(Counter::Consumed, chunk);
  }
  return Status();
}

// The root stages a slot at a time; the others copy it out.
Status ShmBackend::broadcast(void* data, std::size_t count, DataType dtype, int root) {
  if (over_mpi(count * tutti::detail::element_bytes(dtype)))
    return mpi_->broadcast(data, count, dtype, root);
  const std::size_t bytes = count * tutti::detail::element_bytes(dtype);
  const StagingRun run(staging_[kBroadcast], bytes);
  const std::size_t round = ring_->slot_bytes();
  for (std::size_t done = 0; done < bytes; done += round) {
    const std::uint64_t chunk = ring_->take_chunk();
    const std::size_t piece = in_round(bytes, done, round);
    if (rank() == root) {
      ring_->wait_slot_free(chunk);
      stage(ring_->slot(root, chunk), 0, data, done, piece, run.streaming());
      ring_->publish(Counter::Staged, chunk);
    } else {
      ring_->wait(root, Counter::Staged, chunk);
      copy(data, done, ring_->slot(root, chunk), 0, piece);
    }
    ring_->publish(Counter::Consumed, chunk);
  }
  return Status();
}

// Each slot holds one share per rank: in round k, share j is the k-th piece of the block rank
// j receives. Rank r reduces share r of every rank's slot straight into its output.
Status ShmBackend::reducescatter(const void* input, void* output,
                                 std::span<const std::size_t> recv_counts, DataType dtype,
                                 WireOp op) {
  if (over_mpi(total_bytes(recv_counts, dtype)))
    return mpi_->reducescatter(input, output, recv_counts, dtype, op);
  const std::size_t element = tutti::detail::element_bytes(dtype);
  const int n = size();
  const int me = rank();
  // Elements per share, whole cache lines of them.
  const std::size_t share =
      std::max<std::size_t>(1, ring_->slot_bytes() / static_cast<std::size_t>(n) / kCacheLine) *
      kCacheLine / element;
  std::vector<std::size_t> offsets(static_cast<std::size_t>(n));
  std::size_t offset = 0;
  std::size_t largest = 0;
  for (int r = 0; r < n; ++r) {
    offsets[static_cast<std::size_t>(r)] = offset;
    offset += recv_counts[static_cast<std::size_t>(r)];
    largest = std::max(largest, recv_counts[static_cast<std::size_t>(r)]);
  }
  std::vector<const void*> sources(static_cast<std::size_t>(n));
  const StagingRun run(staging_[kReduceScatter], offset * element);
  const auto j = static_cast<std::size_t>(me);
  // This rank's own block is reduced straight from the input, never staged (Note [Own share
  // read in place]), unless the output overlaps it: reduce() allows no such overlap.
  const bool own_in_place = input != nullptr && recv_counts[j] > 0 &&
                            !overlaps(output, recv_counts[j] * element,
                                      at(input, offsets[j] * element), recv_counts[j] * element);
  for (std::size_t done = 0; done < largest; done += share) {
    const std::uint64_t chunk = ring_->take_chunk();
    ring_->wait_slot_free(chunk);
    std::byte* mine = ring_->slot(me, chunk);
    for (int r = 0; r < n; ++r) {
      const auto k = static_cast<std::size_t>(r);
      if (r == me && own_in_place) continue;
      stage(mine, k * share * element, input, (offsets[k] + done) * element,
            in_round(recv_counts[k], done, share) * element, run.streaming());
    }
    ring_->publish(Counter::Staged, chunk);
    ring_->wait_all(Counter::Staged, chunk);
    for (int r = 0; r < n; ++r) {
      sources[static_cast<std::size_t>(r)] = ring_->slot(r, chunk) + j * share * element;
    }
    const std::size_t mine_now = in_round(recv_counts[j], done, share);
    if (mine_now > 0) {
      // In rank order either way: the same bits.
      if (own_in_place) sources[j] = at(input, (offsets[j] + done) * element);
      cpu::reduce(at(output, done * element), sources, mine_now, dtype, op);
    }
    ring_->publish(Counter::Consumed, chunk);
  }
  return Status();
}

std::uint64_t ShmBackend::streamed() const {
  std::uint64_t total = 0;
  for (const StagingChoice& choice : staging_) total += choice.streamed();
  return total;
}

Result<std::unique_ptr<Backend>> create_host_backend(mpi::MpiComm comm,
                                                     const BackendOptions& options) {
  bool one_host = false;
  if (options.host_transport != HostTransport::Mpi && comm.size() > 1) {
    MPI_Comm local = MPI_COMM_NULL;
    TUTTI_MPI_RETURN_IF_ERROR(
        MPI_Comm_split_type(comm.get(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
    int local_size = 0;
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
    // Every member decides alike: either all of them share one host or none is the whole set.
    one_host = local_size == comm.size();
  }
  if (!one_host)
    return std::unique_ptr<Backend>(std::make_unique<mpi::MpiBackend>(std::move(comm)));
  TUTTI_ASSIGN_OR_RETURN(
      std::unique_ptr<ShmRing> ring,
      ShmRing::create(comm.get(), kSlotBytes, kSlots, options.host_oversubscribed));
  auto backend = std::make_unique<ShmBackend>(std::make_unique<mpi::MpiBackend>(std::move(comm)),
                                              std::move(ring), options.shm_stores);
  backend->route_host(options.host_routes);
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace tutti::ops::shm

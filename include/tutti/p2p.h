// SPDX-License-Identifier: Apache-2.0
// Point-to-point messages (API.md "Point-to-point"; torch.distributed's send/recv).
//
// Not negotiated by the coordinator: the communication thread posts each op on a communicator
// of its own, so a matched send/recv costs about one MPI message (two above 2 KB: a small
// header, then the payload straight from the sender's buffer into the receiver's). Peers are
// global ranks and must be members of the set; a rank may send to itself. Messages from one
// sender to one receiver with the same tag and set are received in the order sent.
//
// The dtype and element count travel with the message: a receive of another dtype or count
// fails with Mismatch naming the sender, the tag and both values; the message is consumed (the
// next receive sees the next message) and the sender's op completes normally. Shapes may
// differ when the counts agree; a 0-d tensor is one element.
//
// A send completes when its buffer may be reused (small messages: once MPI has buffered them,
// possibly before they are received); a receive when the data is in its buffer. So a send's
// success says the message left, not that a receive took it: at shutdown() the peer's runtime
// takes and drops the messages no receive matched, and a send still pending then may complete
// normally rather than with ShutDown.
//
// An unmatched op is watched like a collective: after TUTTI_STALL_CHECK_TIME_SECONDS the
// waiting rank warns naming the peer and tag; after TUTTI_STALL_SHUTDOWN_TIME_SECONDS (if not
// 0) it fails with Stalled and the runtime stops, so the other ranks' pending and new ops fail
// with ShutDown. A peer that shuts down stops the job the same way: the ops waiting on it fail
// with ShutDown.
//
// CPU tensors only in this version (a CUDA tensor is InvalidArgument: copy it to the host).
#pragma once

#include <cstdint>
#include <vector>

#include "tutti/collectives.h"
#include "tutti/export.h"
#include "tutti/process_set.h"
#include "tutti/tensor.h"

namespace tutti {

// irecv's `src` for "from any member of the set"; Handle::source() tells who sent.
inline constexpr int any_source = -1;

// Tags: 0 ... 32767. A negative or larger tag, a peer outside the set, any_source as a
// destination, a set this rank is not in, or a set with an id above 127 (each set's tags are
// carved out of MPI's tag space; ids count up within a session) is InvalidArgument from the
// call; so is a tag beyond the tag space of an MPI whose MPI_TAG_UB is below 2^23 - 1.
TUTTI_API Handle isend(TensorView tensor, int dst, int tag = 0,
                       ProcessSet process_set = ProcessSet::global());
TUTTI_API Handle irecv(TensorView tensor, int src = any_source, int tag = 0,
                       ProcessSet process_set = ProcessSet::global());
// isend(...).wait().
TUTTI_API void send(TensorView tensor, int dst, int tag = 0,
                    ProcessSet process_set = ProcessSet::global());
// irecv(...).source(): returns the sender's global rank.
TUTTI_API int recv(TensorView tensor, int src = any_source, int tag = 0,
                   ProcessSet process_set = ProcessSet::global());

struct P2POp {
  enum class Kind : std::uint8_t { Send, Recv };
  Kind kind;
  TensorView tensor;
  int peer;  // Global rank (any_source not allowed here).
  int tag = 0;
};
// Starts every op together, so symmetric exchanges (every rank sends right and receives from
// the left) cannot deadlock. One handle per op, in order. If any op is invalid the whole call
// throws InvalidArgument and nothing is sent.
TUTTI_API std::vector<Handle> batch_isend_irecv(std::vector<P2POp> ops,
                                                ProcessSet process_set = ProcessSet::global());

}  // namespace tutti

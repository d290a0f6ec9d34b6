// SPDX-License-Identifier: Apache-2.0
// tutti/p2p.h: argument checks on the caller's thread (InvalidArgument before anything is
// queued), then P2POpEntries on the session's P2PQueue (Note [P2P stage] in p2p_engine.h).
#include "tutti/p2p.h"

#include "src/base/coarse_clock.h"
#include "src/base/strings.h"
#include "src/common/throw.h"
#include "src/core/op_state.h"
#include "src/core/runtime.h"

namespace tutti {
namespace {

using detail::str_cat;

core::P2POpEntry make_op(const core::SetInfo& set, bool is_send, const TensorView& tensor, int peer,
                         int tag) {
  const char* what = is_send ? "isend" : "irecv";
  if (tag < 0 || tag > core::P2PEngine::kMaxUserTag) {
    detail::throw_invalid_argument(what, ": tag ", tag, " is outside 0...",
                                   core::P2PEngine::kMaxUserTag);
  }
  if (peer == any_source) {
    if (is_send) detail::throw_invalid_argument("isend: any_source is not a destination");
  } else if (set.set_rank_of(peer) < 0) {
    detail::throw_invalid_argument(what, ": rank ", peer, " is not a member of process set ",
                                   set.id);
  }
  if (tensor.device().kind != Device::Kind::CPU) {
    detail::throw_invalid_argument(
        what,
        ": CUDA tensors are not supported by point-to-point ops yet; copy "
        "the tensor to the host");
  }
  const int channel_tag = core::P2PEngine::channel_tag(set.id, tag);
  if (channel_tag < 0) {
    detail::throw_invalid_argument(what, ": process set ", set.id,
                                   " has too large an id for point-to-point tags (sets up to id ",
                                   core::P2PEngine::kMaxSetId,
                                   " have them; ids count up within a session)");
  }
  core::P2POpEntry op{.send = is_send,
                      .peer = peer,
                      .tag = tag,
                      .set_id = set.id,
                      .channel_tag = channel_tag,
                      .entry = std::make_shared<core::Entry>()};
  op.entry->request.name = str_cat("tutti.p2p.", what, ".", peer, ".", tag);
  op.entry->request.process_set_id = set.id;
  op.entry->inputs.push_back(tensor);
  op.entry->state = std::make_shared<detail::OpState>();
  // Read only for stall checks, in seconds (Note [Coarse clock] in src/base/coarse_clock.h).
  op.entry->submitted = base::coarse_now();
  return op;
}

struct Context {
  std::shared_ptr<core::Session> session;
  core::SetInfo set;
};

Context context(const char* what, const ProcessSet& process_set) {
  Context c;
  c.session = core::Runtime::get().session_for_op().value_or_throw();
  c.set = c.session->process_set(process_set.id()).value_or_throw();
  if (!c.set.includes_me()) {
    detail::throw_invalid_argument(what, " on process set ", process_set.id(),
                                   " which does not include rank ", c.session->topology().rank);
  }
  return c;
}

std::vector<Handle> submit(Context& c, std::vector<core::P2POpEntry> ops,
                           bool caller_waits = false) {
  std::vector<Handle> handles;
  handles.reserve(ops.size());
  for (const core::P2POpEntry& op : ops) {
    handles.push_back(detail::HandleAccess::make(op.entry->state));
  }
  c.session->submit_p2p(std::move(ops), caller_waits).throw_if_error();
  return handles;
}

Handle one(Context& c, bool is_send, TensorView tensor, int peer, int tag,
           bool caller_waits = false) {
  std::vector<core::P2POpEntry> ops;
  ops.push_back(make_op(c.set, is_send, tensor, peer, tag));
  return submit(c, std::move(ops), caller_waits).front();
}

// send() and recv(): the op, waited on at once, so the step that starts it does not wake the
// communication thread for it (Note [Waking the loop for point-to-point] in
// src/core/execution/p2p_engine.h).
int blocking(const char* what, bool is_send, TensorView tensor, int peer, int tag,
             const ProcessSet& process_set) {
  Context c = context(what, process_set);
  Handle handle = one(c, is_send, tensor, peer, tag, /*caller_waits=*/true);
  handle.wait();
  return is_send ? -1 : handle.source();
}

}  // namespace

Handle isend(TensorView tensor, int dst, int tag, ProcessSet process_set) {
  Context c = context("isend", process_set);
  return one(c, true, tensor, dst, tag);
}

Handle irecv(TensorView tensor, int src, int tag, ProcessSet process_set) {
  Context c = context("irecv", process_set);
  return one(c, false, tensor, src, tag);
}

void send(TensorView tensor, int dst, int tag, ProcessSet process_set) {
  blocking("isend", true, tensor, dst, tag, process_set);
}

int recv(TensorView tensor, int src, int tag, ProcessSet process_set) {
  return blocking("irecv", false, tensor, src, tag, process_set);
}

std::vector<Handle> batch_isend_irecv(std::vector<P2POp> ops, ProcessSet process_set) {
  Context c = context("batch_isend_irecv", process_set);
  std::vector<core::P2POpEntry> entries;
  entries.reserve(ops.size());
  for (const P2POp& op : ops) {
    if (op.kind != P2POp::Kind::Send && op.kind != P2POp::Kind::Recv) {
      // Before anything is submitted: an invalid batch sends nothing.
      detail::throw_invalid_argument("batch_isend_irecv: unknown P2POp kind ",
                                     static_cast<int>(op.kind));
    }
    const bool is_send = op.kind == P2POp::Kind::Send;
    if (op.peer == any_source) {
      detail::throw_invalid_argument(
          "batch_isend_irecv: any_source is not allowed (name each op's peer)");
    }
    entries.push_back(make_op(c.set, is_send, op.tensor, op.peer, op.tag));
  }
  return submit(c, std::move(entries));
}

}  // namespace tutti

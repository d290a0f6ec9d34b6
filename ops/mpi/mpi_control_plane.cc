// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/mpi_control_plane.h"

#include <string>
#include <utility>

#include "ops/mpi/mpi_error.h"
#include "ops/mpi/mpi_types.h"
#include "src/common/byte_buffers.h"
#include "src/common/logging.h"

namespace tutti::ops::mpi {
namespace {

// Each control plane of the process gets its own tag. Sessions create them in the same
// collective order on every rank, so the tags agree; a message of an earlier session that is
// still in flight can then never be matched by a later one, even when MPI hands the later
// session's communicator the freed one's context.
int next_tag() {
  static int sessions = 0;
  return 1000 + (sessions++ % 30000);
}

}  // namespace

MpiControlPlane::MpiControlPlane(MpiComm comm) : comm_(std::move(comm)), tag_(next_tag()) {}

MpiControlPlane::~MpiControlPlane() {
  // Sends still in flight at teardown go to ranks that are tearing down too; cancel rather
  // than wait on a peer that may be gone.
  for (PendingSend& send : sends_) {
    int done = 0;
    MPI_Test(&send.request, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(&send.request);
      MPI_Request_free(&send.request);
    }
  }
  // Likewise a receive under way: its sender is tearing down.
  if (receive_ != MPI_REQUEST_NULL) {
    int done = 0;
    MPI_Test(&receive_, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(&receive_);
      MPI_Request_free(&receive_);
    }
  }
}

Status MpiControlPlane::send(int destination, std::string bytes) {
  sends_.push_back(PendingSend{.bytes = std::move(bytes)});
  PendingSend& send = sends_.back();
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Isend(send.bytes.data(), to_mpi_count(send.bytes.size()), MPI_BYTE,
                                      destination, tag_, comm_.get(), &send.request));
  static_cast<void>(sends_done());  // Frees the buffers of completed sends.
  // After the send: Note [Doorbell]. (The coordinator never sends to itself.) Ranks on other
  // hosts ring when their caller asks (ring_net_bell()).
  if (doorbell_ != nullptr && destination == coordinator_) doorbell_->ring();
  return Status();
}

bool MpiControlPlane::wait_for_net_ring() {
  if (!net_rung_here() || !net_bell_->wait_for_ring()) return false;
  net_rung_.store(true);
  return true;
}

void MpiControlPlane::stop_net_ring_waits() {
  if (!net_rung_here()) return;
  net_bell_->stop_ring_waits();
  std::string from;
  for (int rank : net_bell_->ranks_heard())
    from += (from.empty() ? " " : ", ") + std::to_string(rank);
  const std::uint64_t rings = net_bell_->rings_heard();
  const std::uint64_t over_ipv6 = net_bell_->rings_heard_over_ipv6();
  std::string over;
  if (rings > 0) {
    over = over_ipv6 == 0       ? ", over IPv4"
           : over_ipv6 == rings ? ", over IPv6"
                                : ", " + std::to_string(over_ipv6) + " of them over IPv6";
  }
  TUTTI_LOG_INFO("the net bell rang ", rings, " times",
                 from.empty() ? std::string() : ", from ranks" + from, over);
}

bool MpiControlPlane::nap_begins() {
  if (!rung_here()) return false;
  doorbell_->nap_begins();
  // The last look (Note [Doorbell]): a message sent before the sender could see `napping`.
  if (receiving_) return true;
  int arrived = 0;  // Left 0 by a failed probe: the nap goes ahead, and its end finds the message.
  MPI_Iprobe(MPI_ANY_SOURCE, tag_, comm_.get(), &arrived, MPI_STATUS_IGNORE);
  return arrived != 0;
}

bool MpiControlPlane::sends_done() {
  while (!sends_.empty()) {
    int done = 0;
    if (MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) {
      return false;
    }
    ::tutti::detail::give_back_byte_buffer(std::move(sends_.front().bytes));
    sends_.pop_front();
  }
  return true;
}

Result<std::optional<Message>> MpiControlPlane::poll() {
  if (!receiving_) {
    int arrived = 0;
    MPI_Message matched = MPI_MESSAGE_NULL;
    MPI_Status status;
    TUTTI_MPI_RETURN_IF_ERROR(
        MPI_Improbe(MPI_ANY_SOURCE, tag_, comm_.get(), &arrived, &matched, &status));
    if (!arrived) {
      if (rings_afar_) ring_policy_.looked(RingPolicy::Clock::now());
      return std::optional<Message>();
    }
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    receiving_.emplace(
        Message{.source = status.MPI_SOURCE,
                .bytes = ::tutti::detail::take_byte_buffer(static_cast<std::size_t>(count))});
    // A blocking receive here would wait for every byte of a large message, however long its
    // sender takes to push them (issue 30: RPC payloads stalled a loaded rank's agent).
    TUTTI_MPI_RETURN_IF_ERROR(
        MPI_Imrecv(receiving_->bytes.data(), count, MPI_BYTE, &matched, &receive_));
  }
  int done = 0;
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Test(&receive_, &done, MPI_STATUS_IGNORE));
  if (!done) return std::optional<Message>();
  if (rings_afar_ && receiving_->source == coordinator_) ring_policy_.heard();
  std::optional<Message> message = std::move(receiving_);
  receiving_.reset();
  return message;
}

}  // namespace tutti::ops::mpi

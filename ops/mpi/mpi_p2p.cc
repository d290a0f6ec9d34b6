// SPDX-License-Identifier: Apache-2.0
// See Note [P2P protocol] in ops/p2p_channel.h. MPI tags: 2·tag for headers, 2·tag + 1 for
// payload chunks.
#include "ops/mpi/mpi_p2p.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <unordered_map>

#include <mpi.h>

#include "ops/mpi/mpi_error.h"
#include "ops/mpi/mpi_types.h"

namespace tutti::ops::mpi {
namespace {

// Note [Point-to-point communicator]
// A send nobody receives stays queued at its destination, in the communicator it was sent
// on. Were that communicator freed, MPI could give its context to the next session's, and
// the stale message would match a receive there. Draining what has arrived at shutdown
// (discard_arrived) cannot catch a message still on its way, so the channel never frees its
// communicator: each session leaves one behind (a few hundred bytes, and its stale
// messages), and no later communicator can reuse its context.
class MpiP2PChannel final : public P2PChannel {
 public:
  explicit MpiP2PChannel(MpiComm comm) : comm_(std::move(comm)) {
    void* value = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm_.get(), MPI_TAG_UB, &value, &found);
    const int ub = found ? *static_cast<int*>(value) : 32767;
    max_tag_ = (ub - 1) / 2;
  }
  // The communicator is left to MPI_Finalize, never freed (Note [Point-to-point communicator]).
  ~MpiP2PChannel() override {
    abandon();
    comm_.leak();
  }

  int max_tag() const override { return max_tag_; }

  Result<Id> start_send(int destination, int tag, std::string header, const void* data,
                        std::size_t bytes) override {
    const Id id = next_id_++;
    Transfer& transfer = transfers_[id];
    transfer.header = std::move(header);
    MPI_Request request = MPI_REQUEST_NULL;
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Isend(transfer.header.data(),
                                        to_mpi_count(transfer.header.size()), MPI_BYTE, destination,
                                        2 * tag, comm_.get(), &request));
    add(id, request);
    const char* at = static_cast<const char*>(data);
    for (std::size_t done = 0; done < bytes; done += max_mpi_count()) {
      const std::size_t n = std::min(max_mpi_count(), bytes - done);
      TUTTI_MPI_RETURN_IF_ERROR(MPI_Isend(at + done, to_mpi_count(n), MPI_BYTE, destination,
                                          2 * tag + 1, comm_.get(), &request));
      add(id, request);
    }
    return id;
  }

  Result<std::optional<Header>> take_header(int source, int tag) override {
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Improbe(source < 0 ? MPI_ANY_SOURCE : source, 2 * tag,
                                          comm_.get(), &flag, &message, &status));
    if (!flag) return std::optional<Header>();
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    Header header{.source = status.MPI_SOURCE, .bytes = std::string(std::size_t(count), '\0')};
    // Headers are small and already here (eager): the receive ends at once.
    TUTTI_MPI_RETURN_IF_ERROR(
        MPI_Mrecv(header.bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
    return std::optional<Header>(std::move(header));
  }

  Result<Id> start_receive(int source, int tag, void* data, std::size_t bytes) override {
    const Id id = next_id_++;
    transfers_[id];
    char* at = static_cast<char*>(data);
    for (std::size_t done = 0; done < bytes; done += max_mpi_count()) {
      const std::size_t n = std::min(max_mpi_count(), bytes - done);
      MPI_Request request = MPI_REQUEST_NULL;
      TUTTI_MPI_RETURN_IF_ERROR(MPI_Irecv(at + done, to_mpi_count(n), MPI_BYTE, source, 2 * tag + 1,
                                          comm_.get(), &request));
      add(id, request, /*receive=*/true);
    }
    return id;
  }

  Result<std::vector<Id>> completed() override {
    std::vector<Id> done;
    // Transfers without MPI requests (empty receives) complete at once.
    for (auto& [id, transfer] : transfers_) {
      if (transfer.remaining == 0) done.push_back(id);
    }
    if (!requests_.empty()) {
      int count = 0;
      indices_.resize(requests_.size());
      TUTTI_MPI_RETURN_IF_ERROR(MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(),
                                             &count, indices_.data(), MPI_STATUSES_IGNORE));
      if (count != MPI_UNDEFINED) {
        for (int i = 0; i < count; ++i) {
          const Id id = owners_[static_cast<std::size_t>(indices_[static_cast<std::size_t>(i)])];
          if (--transfers_[id].remaining == 0) done.push_back(id);
        }
        // Drop the finished requests (MPI set them to MPI_REQUEST_NULL).
        std::size_t keep = 0;
        for (std::size_t i = 0; i < requests_.size(); ++i) {
          if (requests_[i] == MPI_REQUEST_NULL) continue;
          requests_[keep] = requests_[i];
          owners_[keep] = owners_[i];
          receive_[keep] = receive_[i];
          ++keep;
        }
        requests_.resize(keep);
        owners_.resize(keep);
        receive_.resize(keep);
      }
    }
    for (Id id : done) transfers_.erase(id);
    return done;
  }

  bool active(Id id) const override { return transfers_.count(id) != 0; }

  // Note [Sends finished before their buffers are released]
  // An abandoned send fails its op, and the caller may then free or reuse the buffer (a send
  // completes when its buffer may be reused, tutti/p2p.h). A large payload goes by rendezvous:
  // MPI reads the sender's buffer only once the receiver takes the message, and every rank's
  // session ends at about the same time (after the coordinator's bye), each taking what arrived
  // for it (discard_arrived()). A send request freed at once left MPI reading a buffer the caller
  // had freed, as the peer took the message: a crash in Open MPI's vader (the peer's single copy
  // failing with EFAULT, then the sender's fallback pipeline reading freed memory). So the sends
  // in flight get up to kSendDrainTime to complete as the peers take them, while this rank takes
  // theirs; only a send whose peer is gone or stuck is then freed unfinished.
  void abandon() override {
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      MPI_Request& request = requests_[i];
      if (request == MPI_REQUEST_NULL || !receive_[i]) continue;
      MPI_Cancel(&request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    // Discarding before any send is freed: an unmatched send to this rank itself is among the
    // arrived messages, and MPICH over UCX crashes receiving a self-send whose request was freed.
    const auto deadline = std::chrono::steady_clock::now() + kSendDrainTime;
    for (;;) {
      discard_arrived();
      if (sends_finished() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      MPI_Request& request = requests_[i];
      if (request != MPI_REQUEST_NULL && !receive_[i]) {
        MPI_Request_free(&request);  // A send to a peer that is gone: let MPI drop it.
      }
    }
    requests_.clear();
    owners_.clear();
    receive_.clear();
    transfers_.clear();
  }

 private:
  // How long abandon() waits for its sends to complete (Note [Sends finished before their
  // buffers are released]): a peer taking a large message copies it meanwhile.
  static constexpr std::chrono::seconds kSendDrainTime{2};

  // Whether every send in flight has completed (their requests then MPI_REQUEST_NULL). Tests
  // each; never blocks.
  bool sends_finished() {
    bool finished = true;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      MPI_Request& request = requests_[i];
      if (request == MPI_REQUEST_NULL || receive_[i]) continue;
      int done = 0;
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) finished = false;
    }
    return finished;
  }

  struct Transfer {
    std::string header;  // Kept alive until its send completes.
    int remaining = 0;   // MPI requests not yet complete.
  };
  // Takes every message that has arrived and nobody received (a send never matched), so
  // that none waits in a freed communicator whose context MPI may give the next session's
  // (Note [Shutdown handshake] in src/core/background_loop.h). A matched probe removes it
  // from matching at once; its data is received for at most 100 ms (a large message needs
  // its sender's progress), then the request is released and the buffer left to MPI.
  void discard_arrived() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || !comm_.valid()) return;
    for (;;) {
      int flag = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_.get(), &flag, &message, &status) !=
              MPI_SUCCESS ||
          !flag) {
        return;
      }
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      auto buffer = std::make_unique<char[]>(static_cast<std::size_t>(std::max(count, 1)));
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Imrecv(buffer.get(), count, MPI_BYTE, &message, &request) != MPI_SUCCESS) return;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      int done = 0;
      while (!done && std::chrono::steady_clock::now() < deadline)
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (!done) {
        MPI_Request_free(&request);
        static_cast<void>(buffer.release());  // MPI may still write into it: leaked on purpose.
      }
    }
  }

  void add(Id id, MPI_Request request, bool receive = false) {
    requests_.push_back(request);
    owners_.push_back(id);
    receive_.push_back(receive ? 1 : 0);
    ++transfers_[id].remaining;
  }

  MpiComm comm_;
  int max_tag_ = 0;
  Id next_id_ = 1;
  std::unordered_map<Id, Transfer> transfers_;
  std::vector<MPI_Request> requests_;  // In progress, with owners_[i] their transfer.
  std::vector<Id> owners_;
  std::vector<std::uint8_t> receive_;  // 1 for payload receives (cancellable on abandon()).
  std::vector<int> indices_;
};

}  // namespace

std::unique_ptr<P2PChannel> make_p2p_channel(MpiComm comm) {
  return std::make_unique<MpiP2PChannel>(std::move(comm));
}

}  // namespace tutti::ops::mpi

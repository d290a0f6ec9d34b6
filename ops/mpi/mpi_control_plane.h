// SPDX-License-Identifier: Apache-2.0
// ControlPlane over MPI point-to-point on a communicator of its own: MPI_Isend with the bytes
// kept alive until the send completes, MPI_Improbe + MPI_Imrecv to receive: a large message
// (RPC's payloads) completes over later polls, and poll() never waits for its bytes. Large
// buffers come from, and sent ones go back to, the kept byte buffers (Note [Byte buffers kept
// for reuse] in src/common/byte_buffers.h).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "ops/control_plane.h"
#include "ops/mpi/doorbell.h"
#include "ops/mpi/mpi_comm.h"
#include "ops/mpi/net_bell.h"

namespace tutti::ops::mpi {

class MpiControlPlane final : public ControlPlane {
 public:
  explicit MpiControlPlane(MpiComm comm);
  ~MpiControlPlane() override;

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  Status send(int destination, std::string bytes) override;
  Result<std::optional<Message>> poll() override;
  bool receiving() const override { return receiving_.has_value(); }
  bool sends_done() override;

  // Note [Doorbell] in doorbell.h: `doorbell` (null: none) rings rank `coordinator` of this
  // plane's communicator after each message sent to it, or is rung here if this is that rank.
  // Before the plane is used.
  void set_doorbell(std::unique_ptr<Doorbell> doorbell, int coordinator) {
    doorbell_ = std::move(doorbell);
    coordinator_ = coordinator;
  }
  bool rung_here() const override { return doorbell_ != nullptr && doorbell_->rung_here(); }
  bool all_senders_ring() const override {
    return rank() == coordinator_ &&
           (size() == 1 || (doorbell_ != nullptr && doorbell_->every_rank_rings()));
  }
  bool nap_begins() override;
  void nap_ends() override {
    if (rung_here()) doorbell_->nap_ends();
  }
  bool wait_for_ring() override { return rung_here() && doorbell_->wait_for_ring(); }
  void stop_ring_waits() override {
    if (rung_here()) doorbell_->stop_ring_waits();
  }

  // Note [Net bell] in net_bell.h: `bell` (null: none) rings the coordinator (ring_net_bell()),
  // or is rung here if this is the coordinator. Before the plane is used.
  void set_net_bell(std::unique_ptr<NetBell> bell) {
    net_bell_ = std::move(bell);
    rings_afar_ = net_bell_ != nullptr && !net_bell_->rung_here();
  }
  bool net_rung_here() const override { return net_bell_ != nullptr && net_bell_->rung_here(); }
  bool wait_for_net_ring() override;
  void stop_net_ring_waits() override;
  bool take_net_ring() override {
    return net_rung_.load(std::memory_order_relaxed) && net_rung_.exchange(false);
  }
  bool rings_net_bell() const override { return rings_afar_; }
  void ring_net_bell() override {
    if (rings_afar_ && ring_policy_.due(RingPolicy::Clock::now())) net_bell_->ring();
  }

 private:
  struct PendingSend {
    std::string bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  MpiComm comm_;
  int tag_;
  std::deque<PendingSend> sends_;  // Oldest first; a deque keeps `bytes` in place.
  // The message being received, once matched; one at a time keeps each sender's order.
  std::optional<Message> receiving_;
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::unique_ptr<Doorbell> doorbell_;
  int coordinator_ = 0;
  std::unique_ptr<NetBell> net_bell_;
  bool rings_afar_ = false;            // This rank rings net_bell_.
  RingPolicy ring_policy_;             // When it rings.
  std::atomic<bool> net_rung_{false};  // The coordinator's: a ring not yet taken.
};

}  // namespace tutti::ops::mpi

// SPDX-License-Identifier: Apache-2.0
// The MPI P2PChannel (see Note [P2P protocol] in ops/p2p_channel.h).
#pragma once

#include <memory>

#include "ops/mpi/mpi_comm.h"
#include "ops/p2p_channel.h"

namespace tutti::ops::mpi {

std::unique_ptr<P2PChannel> make_p2p_channel(MpiComm comm);

}  // namespace tutti::ops::mpi

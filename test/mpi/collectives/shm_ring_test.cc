// SPDX-License-Identifier: Apache-2.0
// The shared-memory ring (ops/shm/shm_ring.h) as it is created: every rank's slots are already
// mapped in every process (Note [Faulting the ring in] in shm_ring.cc), so the first collectives
// pay no page faults and the staging choice does not take them for the cost of its stores. The
// count to expect is a closed form: without the faulting-in, a rank touching every page of every
// rank's slots faults once per page, slots * slot_bytes / 4096 pages per rank.
#include "ops/shm/shm_ring.h"

#include <sys/resource.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/mpi_test_util.h"

namespace tutti::test {
namespace {

constexpr std::size_t kSlotBytes = 256 * 1024;
constexpr int kSlots = 4;
constexpr std::size_t kPage = 4096;

// This thread's minor page faults so far (RUSAGE_THREAD: the MPI library's threads do not count).
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// Reads a byte of every page of every rank's slots. Not instrumented by AddressSanitizer, whose
// checks would fault in pages of its own shadow memory and be counted.
[[gnu::no_sanitize_address]] void touch_every_slot(const ops::shm::ShmRing& ring) {
  for (int r = 0; r < ring.size(); ++r) {
    const std::byte* first = ring.slot(r, 0);
    for (std::size_t at = 0; at < kSlotBytes * kSlots; at += kPage) {
      static_cast<void>(*static_cast<const volatile std::byte*>(first + at));
    }
  }
}

TEST_CASE("A new ring's slots are mapped in every process: touching them faults no page", "[shm]") {
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  {
    Result<std::unique_ptr<ops::shm::ShmRing>> ring =
        ops::shm::ShmRing::create(host, kSlotBytes, kSlots, /*oversubscribed=*/true);
    REQUIRE(ring.ok());
    REQUIRE(ring.value()->slot_bytes() == kSlotBytes);
    const long before = minor_faults();
    touch_every_slot(*ring.value());
    const long faults = minor_faults() - before;
    // Unmapped, that is kSlots * kSlotBytes / kPage = 256 faults for each rank's slots; a few
    // are allowed for anything else the thread touches for the first time.
    const long unmapped = static_cast<long>(kSlots * kSlotBytes / kPage) * ring.value()->size();
    INFO("faults " << faults << " of " << unmapped << " pages");
    CHECK(all_ranks(faults < 16));
    MPI_Barrier(host);  // Nobody frees the window while a peer reads it.
  }
  MPI_Comm_free(&host);
}

}  // namespace
}  // namespace tutti::test

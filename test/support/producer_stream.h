// SPDX-License-Identifier: Apache-2.0
// A stream of the application whose writes land late, for tests of Note [Stream ordering]
// (ops/cuda/stream.h): each binary that runs test/mpi/device/stream_ordering_test.cc defines
// producer_streams() for its device, the simulated one (test/mpi/device/sim_main.cc) or a GPU
// (test/gpu/producer_stream_cuda.cc).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace tutti::test {

class ProducerStream {
 public:
  virtual ~ProducerStream() = default;
  // For tutti::cuda::set_current_stream: a cudaStream_t or its simulated stand-in; nullptr is
  // the device's legacy default stream.
  virtual void* handle() = 0;
  virtual std::string name() const = 0;
  // Until release(), the work enqueued on the stream after this call does not run.
  virtual void hold() = 0;
  // Enqueues a write of `bytes` into device memory `destination` of test_device(): like a
  // kernel or a pageable cudaMemcpy, it lands after this call returns (after release() if
  // held). `bytes` may be reused at once.
  virtual void write(void* destination, const std::vector<std::byte>& bytes) = 0;
  // Lets the held work run; nothing if not held.
  virtual void release() = 0;
};

// The legacy default stream and one stream of the application's own, on test_device().
std::vector<std::unique_ptr<ProducerStream>> producer_streams();

}  // namespace tutti::test

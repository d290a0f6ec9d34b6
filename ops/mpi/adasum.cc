// SPDX-License-Identifier: Apache-2.0
// Adasum by recursive vector halving and distance doubling (Horovod's adasum.h), then the
// halves gathered back by distance halving.
//
// At level L (1, 2, 4, ...) rank r pairs with r ^ L. Both hold the same region of the vector
// (they agree on the bits below L): the left one (bit L clear) keeps the first half, the right
// one the second, and each receives its partner's values for the half it keeps. Within the
// group of 2L ranks that share r / 2L, the kept pieces tile the region, so the partial dot
// products and norms summed over the group are those of the whole vectors a (the left
// group's combined vector) and b (the right group's). Each rank then combines its piece. After
// log2(size) levels each rank holds 1/size of the result; undoing the levels in reverse order
// hands every rank the whole of it.
//
// Memory: the partner's values land in the region just handed over, which this rank no longer
// needs until the reverse levels bring it back, so Adasum needs the vector and a bounded
// scratch piece, not the half-sized receive buffer of Horovod's (issue 30: an Adasum past 2^31
// elements could not fit two ranks on a 23 GiB machine).
#include "ops/mpi/adasum.h"

#include <algorithm>
#include <vector>

#include "ops/mpi/mpi_error.h"
#include "ops/mpi/mpi_pieces.h"
#include "ops/mpi/mpi_types.h"
#include "src/common/check.h"

namespace tutti::ops::mpi {
namespace {

constexpr int kTag = 0x5ada;
// Below this squared norm a vector counts as zero (Horovod's threshold): its coefficient is 1.
constexpr double kTinyNormSquared = 1e-8;

// The scratch piece the partner's values pass through on their way into the given region.
constexpr std::size_t kPieceBytes = std::size_t{16} << 20;

struct Region {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
};

// The partner's values for the kept region, element j of it at(j): the first `stored` in the
// region this rank gave away, and, where the kept region is one longer (an odd region split on
// the right), the last in `last`.
template <class T>
struct Received {
  const T* stored = nullptr;
  std::size_t stored_count = 0;
  T last{};
  T at(std::size_t j) const { return j < stored_count ? stored[j] : last; }
};

// Sends `give` to `partner` and receives the partner's values for `keep` (the partner's give)
// into `give`'s place, piece by piece through `scratch`: a piece of `give` has been sent once
// the Sendrecv that carries it returns, so its place is free.
template <class T>
Result<Received<T>> swap_halves(MPI_Comm comm, int partner, T* data, Region give, Region keep,
                                MPI_Datatype type, std::vector<T>& scratch) {
  TUTTI_CHECK(keep.size() <= give.size() + 1, "Adasum's halves differ by more than one element");
  // The same on both partners (their give and keep are swapped), so pieces pair up.
  const std::size_t longer = std::max(give.size(), keep.size());
  const std::size_t piece =
      std::max<std::size_t>(1, std::min({kPieceBytes / sizeof(T), max_mpi_count(), longer}));
  scratch.resize(piece);
  Received<T> received{.stored = data + give.begin,
                       .stored_count = std::min(give.size(), keep.size())};
  T* place = data + give.begin;
  for (std::size_t done = 0; done < longer; done += piece) {
    const std::size_t sends = give.size() > done ? std::min(piece, give.size() - done) : 0;
    const std::size_t receives = keep.size() > done ? std::min(piece, keep.size() - done) : 0;
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Sendrecv(place + done, to_mpi_count(sends), type, partner, kTag,
                                           scratch.data(), to_mpi_count(receives), type, partner,
                                           kTag, comm, MPI_STATUS_IGNORE));
    const std::size_t fits = std::min(receives, give.size() > done ? give.size() - done : 0);
    std::copy_n(scratch.data(), fits, place + done);
    if (fits < receives) received.last = scratch[fits];  // The one element past `give`.
  }
  return received;
}

// Sums `values` over the 2·level ranks that share rank / (2·level), by recursive doubling.
// Every member ends with bitwise the same sums (each step adds two values that are equal on
// both partners, and IEEE addition is commutative), so paired ranks use equal coefficients.
Status group_sum(MPI_Comm comm, int rank, int level, std::vector<double>& values) {
  std::vector<double> theirs(values.size());
  const int count = to_mpi_count(values.size());
  for (int distance = 1; distance <= level; distance <<= 1) {
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Sendrecv(values.data(), count, MPI_DOUBLE, rank ^ distance, kTag,
                                           theirs.data(), count, MPI_DOUBLE, rank ^ distance, kTag,
                                           comm, MPI_STATUS_IGNORE));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += theirs[i];
  }
  return Status();
}

template <class T>
Status run(MPI_Comm comm, T* data, std::span<const std::size_t> tensor_counts, MPI_Datatype type) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  TUTTI_CHECK((size & (size - 1)) == 0, "Adasum needs a power-of-two set size, not ", size);
  std::vector<std::size_t> starts = {0};  // Tensor t spans [starts[t], starts[t + 1]).
  for (std::size_t count : tensor_counts) starts.push_back(starts.back() + count);
  const std::size_t tensors = tensor_counts.size();
  Region mine{.begin = 0, .end = starts.back()};
  std::vector<Region> given;  // The region handed to the partner at each level.
  std::vector<T> scratch;

  for (int level = 1; level < size; level <<= 1) {
    const int partner = rank ^ level;
    const bool left = (rank & level) == 0;
    const std::size_t middle = mine.begin + mine.size() / 2;
    const Region keep = left ? Region{mine.begin, middle} : Region{middle, mine.end};
    const Region give = left ? Region{middle, mine.end} : Region{mine.begin, middle};
    TUTTI_ASSIGN_OR_RETURN(const Received<T> received,
                           swap_halves(comm, partner, data, give, keep, type, scratch));
    // Per tensor: a·b, |a|², |b|² over the kept piece, a being the left group's values.
    std::vector<double> sums(3 * tensors, 0.0);
    for (std::size_t t = 0; t < tensors; ++t) {
      const std::size_t from = std::max(starts[t], keep.begin);
      const std::size_t to = std::min(starts[t + 1], keep.end);
      double dot = 0, a_norm = 0, b_norm = 0;
      for (std::size_t i = from; i < to; ++i) {
        const double own = static_cast<double>(data[i]);
        const double other = static_cast<double>(received.at(i - keep.begin));
        const double a = left ? own : other;
        const double b = left ? other : own;
        dot += a * b;
        a_norm += a * a;
        b_norm += b * b;
      }
      sums[3 * t] = dot;
      sums[3 * t + 1] = a_norm;
      sums[3 * t + 2] = b_norm;
    }
    TUTTI_RETURN_IF_ERROR(group_sum(comm, rank, level, sums));
    for (std::size_t t = 0; t < tensors; ++t) {
      const double dot = sums[3 * t];
      const double a_coefficient =
          sums[3 * t + 1] >= kTinyNormSquared ? 1.0 - dot / (2.0 * sums[3 * t + 1]) : 1.0;
      const double b_coefficient =
          sums[3 * t + 2] >= kTinyNormSquared ? 1.0 - dot / (2.0 * sums[3 * t + 2]) : 1.0;
      const double own_coefficient = left ? a_coefficient : b_coefficient;
      const double other_coefficient = left ? b_coefficient : a_coefficient;
      const std::size_t from = std::max(starts[t], keep.begin);
      const std::size_t to = std::min(starts[t + 1], keep.end);
      for (std::size_t i = from; i < to; ++i) {
        data[i] =
            static_cast<T>(own_coefficient * static_cast<double>(data[i]) +
                           other_coefficient * static_cast<double>(received.at(i - keep.begin)));
      }
    }
    given.push_back(give);
    mine = keep;
  }
  // Distance halving: at each level in reverse, swap pieces with the partner of that level.
  for (int level = size >> 1; level >= 1; level >>= 1) {
    const Region theirs = given.back();
    given.pop_back();
    const int partner = rank ^ level;
    TUTTI_RETURN_IF_ERROR(exchange_in_pieces(data + mine.begin, mine.size(), partner,
                                             data + theirs.begin, theirs.size(), partner, type,
                                             sizeof(T), kTag, comm));
    mine = Region{std::min(mine.begin, theirs.begin), std::max(mine.end, theirs.end)};
  }
  return Status();
}

}  // namespace

Status adasum_allreduce(MPI_Comm comm, void* data, std::span<const std::size_t> tensor_counts,
                        DataType dtype) {
  switch (dtype) {
    case DataType::Float32: return run(comm, static_cast<float*>(data), tensor_counts, MPI_FLOAT);
    case DataType::Float64: return run(comm, static_cast<double*>(data), tensor_counts, MPI_DOUBLE);
    default: break;
  }
  TUTTI_CHECK(false, "Adasum on ", to_string(dtype), " (core widens to float32 or float64)");
}

}  // namespace tutti::ops::mpi

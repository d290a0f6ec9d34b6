// SPDX-License-Identifier: Apache-2.0
// The PowerSGD communication hooks (tutti/nn/comm_hooks.h): hooks::powersgd (per matrix) and
// hooks::batched_powersgd (the whole bucket as one square matrix), after PyTorch's
// powerSGD_hook.py. The arithmetic is in powersgd_math.h; Eigen does the products.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "src/nn/parallel/float_convert.h"
#include "src/nn/parallel/powersgd_math.h"
#include "src/nn/tensor_math.h"
#include "tutti/nn/comm_hooks.h"

namespace tutti::nn::hooks {
namespace {

using nn::detail::as_matrix;
using nn::detail::convert_floats;
using nn::detail::float_data;
using nn::detail::throw_invalid_argument;

// What PowerSGD keeps of a bucket between iterations. A bucket whose gradient shapes differ
// from the ones it was made for (DDP rebuilt its buckets) starts over from zeros and fresh
// random factors, identically on every rank.
//
// Note [PowerSGD after a join]
// Whether a pass compresses, and which random Q's it draws, must be the same on every member,
// and a member that joined early (tutti::join()) has made fewer passes of its own than the
// others. So both come from the set's pass number (GradBucket::pass_index, Note [Set-wide pass
// numbers] in src/nn/parallel/reducer.h), not from counting this hook's calls: before, such a
// member's count fell behind, it sent a plain allreduce while the others compressed, and the
// pass stalled. Its warm-start factors are those of its last pass, not the others' (which it
// never received), so in a pass where a member is back (GradBucket::resumed) every member drops
// its factors and draws fresh ones, alike. Error feedback is each rank's own (Note [Each rank's
// own error]) and stays.
struct Memory {
  std::vector<Shape> layout;
  Tensor error;  // float32: the bucket's compression error (use_error_feedback).
  Tensor p, q;   // float32 factors, kept for warm_start; undefined when none.
  // Random draws in pass draw_pass so far (each draws a fresh Q, see next_draw()).
  std::int64_t draw_pass = -1;
  std::uint64_t draws = 0;
};

// A hook's shared state: the options as they were at creation, the user's counters, and the
// per-bucket memory keyed by the bucket's op name (unique per DDP and bucket).
struct Shared {
  PowerSGDState options;
  std::shared_ptr<PowerSGDState> state;
  std::mutex mutex;  // The map: a hook copied into DDPs that run on several threads.
  std::map<std::string, std::shared_ptr<Memory>> memory;

  std::shared_ptr<Memory> memory_for(const GradBucket& bucket) {
    std::vector<Shape> layout;
    for (const Tensor& g : bucket.gradients) layout.push_back(g.shape());
    layout.push_back({bucket.buffer.num_elements()});
    const std::lock_guard<std::mutex> lock(mutex);
    std::shared_ptr<Memory>& memory_ptr = memory[bucket.op_name];
    if (!memory_ptr || memory_ptr->layout != layout) {
      memory_ptr = std::make_shared<Memory>();
      memory_ptr->layout = std::move(layout);
    }
    if (bucket.resumed) memory_ptr->p = memory_ptr->q = Tensor();  // Note [PowerSGD after a join].
    return memory_ptr;
  }

  // PyTorch's maybe_increase_iter: a pass is complete with its last bucket. The set's count
  // (Note [PowerSGD after a join]).
  void count_pass(const GradBucket& bucket) const {
    if (bucket.is_last) state->iter = bucket.pass_index + 1;
  }
};

// The key of the next random draw for `bucket`: the pass number and the draws within the pass,
// the same on every member (Note [PowerSGD after a join]). A pass draws at most once per
// compressed matrix and once more, far below 2^20 per bucket.
std::uint64_t next_draw(Memory& memory, const GradBucket& bucket) {
  if (memory.draw_pass != bucket.pass_index) {
    memory.draw_pass = bucket.pass_index;
    memory.draws = 0;
  }
  return (static_cast<std::uint64_t>(bucket.pass_index) << 20) ^ memory.draws++;
}

void check_state(const std::shared_ptr<PowerSGDState>& state, const char* who) {
  if (!state) throw_invalid_argument(who, ": the state is null");
  const PowerSGDState& s = *state;
  if (s.matrix_approximation_rank < 1) {
    throw_invalid_argument(who, ": matrix_approximation_rank must be at least 1, got ",
                           s.matrix_approximation_rank);
  }
  if (!(s.min_compression_rate >= 0)) {
    throw_invalid_argument(who, ": min_compression_rate must be >= 0, got ",
                           s.min_compression_rate);
  }
  if (!(s.orthogonalization_epsilon >= 0) || !std::isfinite(s.orthogonalization_epsilon)) {
    throw_invalid_argument(who, ": orthogonalization_epsilon must be a finite number >= 0, got ",
                           s.orthogonalization_epsilon);
  }
  if ((s.use_error_feedback || s.warm_start) && s.start_powerSGD_iter <= 1) {
    throw_invalid_argument(
        who, ": start_powerSGD_iter must be > 1 with use_error_feedback or warm_start (got ",
        s.start_powerSGD_iter,
        "): DDP rebuilds its buckets after the first pass, and both keep memory per bucket");
  }
}

// A float32 working copy of the bucket (the buffer itself when it is float32), `padded` long.
Tensor working_copy(const GradBucket& bucket, std::int64_t padded) {
  const Tensor& buffer = bucket.buffer;
  if (buffer.dtype() == DataType::Float32 && padded == buffer.num_elements()) return buffer;
  Tensor input(DataType::Float32, {padded});
  convert_floats(buffer, input.slice(0, {buffer.num_elements()}), "powersgd");
  return input;
}

// Note [Each rank's own error]
// Error feedback remembers what a rank's pass did not send and adds it to the next pass. PyTorch
// remembers its input minus the averaged result, which includes how its gradient differs from
// the others' average: the ranks' memories then cancel out only in their sum. A rank that has
// joined (tutti::join()) contributes zeros and keeps its memory out of that sum, and every later
// pass was off by it (0.12 at full rank, 3 ranks, one joined). So each rank remembers its own
// compression error, as in the PowerSGD paper (Vogels et al. 2019, Algorithm 2): its input M
// minus its projection P·(Mᵀ·P)ᵀ on the factors all ranks share, computed before Q is
// averaged; gradients sent uncompressed leave none. The results are PyTorch's: a pass depends
// on the ranks' inputs only through their sum, and both memories sum to the same (the sum of
// the inputs minus the ranks times the result). At full rank of a matrix with no more rows than
// columns, P is square and orthogonal and the error zero, so a joined rank loses nothing. A
// taller one (or a vector, one column) is compressed as its transpose at full rank (Note [Tall
// matrices at full rank]), so that holds for every matrix.
//
// Error feedback, step 1: adds the bucket's remembered error to `input`. Whether feedback is on.
bool add_error(const PowerSGDState& options, Memory& memory, const Tensor& input) {
  if (!options.use_error_feedback) return false;
  if (memory.error.num_elements() != input.num_elements()) {
    memory.error = Tensor(DataType::Float32, input.shape());
  }
  nn::detail::as_array(input) += nn::detail::as_array(memory.error);
  return true;
}

// Note [Tall matrices at full rank]
// P = M·Q spans at most the column space of the ranks' summed M, which at full rank (r = cols)
// of an n x m matrix with n > m need not hold one rank's own M: that rank's error is not zero,
// and lost when it joins (a [3] vector at 2 ranks gave 1.19 for 1.0 after the join). Its
// transpose, m x n, has r = m rows: P is then square and orthogonal, and the error zero. At full
// rank the wire sizes ((n + m)·r) and the result (allreduce's, to float rounding) are the same
// either way. Below full rank the orientation changes the result, so PyTorch's is kept there,
// and with it PyTorch's results.

// A compressed gradient: the rows x cols matrix that is compressed is the gradient at `offset`
// in the bucket (its dim 0 x the rest), or with `transposed` its transpose; its factors, of rank
// `rank`, are at p_offset in P (rows x rank) and q_offset in Q (cols x rank).
struct Matrix {
  std::int64_t offset, rows, cols, rank, p_offset, q_offset;
  bool transposed;
};

// Calls `f` with m's matrix in `values` (the bucket's input, or the error memory, laid out alike)
// as a writable rows x cols Eigen expression: a map of the gradient, or the transpose of one.
template <class F>
void with_matrix(const Tensor& values, const Matrix& m, F&& f) {
  const Tensor part = values.slice(m.offset, {m.rows * m.cols});
  if (m.transposed) {
    nn::detail::MatrixMap stored = as_matrix(part, m.cols, m.rows);  // The gradient as it lies.
    f(stored.transpose());
  } else {
    nn::detail::MatrixMap stored = as_matrix(part, m.rows, m.cols);
    f(stored);
  }
}

// Error feedback, step 2: this rank's own error (Note [Each rank's own error]) for `matrices`
// of `input`, P holding the shared orthogonalized factors and Q this rank's Mᵀ·P (before it is
// averaged); zero for the rest of the bucket.
void remember_error(Memory& memory, const Tensor& input, const std::vector<Matrix>& matrices) {
  nn::detail::as_array(memory.error).setZero();
  for (const Matrix& m : matrices) {
    auto p = as_matrix(memory.p.slice(m.p_offset, {m.rows * m.rank}), m.rows, m.rank);
    auto q = as_matrix(memory.q.slice(m.q_offset, {m.cols * m.rank}), m.cols, m.rank);
    with_matrix(memory.error, m, [&](auto&& error) {
      with_matrix(input, m, [&](auto&& mat) { error.noalias() = mat - p * q.transpose(); });
    });
  }
}

// The end of every compressed pass: factors are dropped without warm start; the result goes
// back into the bucket's buffer (converted to its dtype).
Tensor finish_pass(Shared& shared, Memory& memory, const GradBucket& bucket, const Tensor& input) {
  if (!shared.options.warm_start) memory.p = memory.q = Tensor();
  if (input.data() != bucket.buffer.data()) {
    convert_floats(input.slice(0, {bucket.buffer.num_elements()}), bucket.buffer, "powersgd");
  }
  shared.count_pass(bucket);
  return bucket.buffer;
}

// Starts the allreduce of the float32 `values` in `wire` (the bucket's dtype: fp16_compress
// makes the factors travel in float16); the future yields `values` holding the result.
CommFuture reduce_floats(const Tensor& values, DataType wire, const std::string& name, ReduceOp op,
                         const ProcessSet& set) {
  const ReduceOptions options{.op = op, .process_set = set};
  if (wire == DataType::Float32) return CommFuture(allreduce_async(values, name, options), values);
  Tensor sent(wire, values.shape());
  convert_floats(values, sent, "powersgd");
  return CommFuture(allreduce_async(sent, name, options), sent).then([values](const Tensor& r) {
    convert_floats(r, values, "powersgd");
    return values;
  });
}

// Note [Warm factors keep their rank]
// With warm start a pass begins from the last pass's Q, and Q = Mᵀ·P carries a zero column
// wherever P had one: where the gradient was zero (a layer unused in that step) or of lower
// rank than the factors. Orthogonalizing keeps such a column zero, so P = M·Q gets a zero
// column again, pass after pass: the direction was lost for the rest of training (a gradient
// unused once was never sent again, even at full rank). So a column that comes out zero is
// drawn afresh, from the same seeded generator on every rank (their Q's are equal: each is the
// average), and the matrix orthogonalized again; a random direction is independent of the
// others with probability 1.
void refill_zero_columns(const Shared& shared, Memory& memory, const GradBucket& bucket, float* q,
                         std::int64_t rows, std::int64_t cols) {
  std::vector<float> fresh(static_cast<std::size_t>(rows * cols));
  nn::detail::fill_normal(fresh, shared.options.random_seed,
                          static_cast<std::uint64_t>(bucket.index), next_draw(memory, bucket));
  for (std::int64_t c = 0; c < cols; ++c) {
    bool zero = true;
    for (std::int64_t r = 0; r < rows && zero; ++r) zero = q[r * cols + c] == 0.0f;
    if (!zero) continue;
    for (std::int64_t r = 0; r < rows; ++r) {
      q[r * cols + c] = fresh[static_cast<std::size_t>(r * cols + c)];
    }
  }
  nn::detail::orthogonalize(q, rows, cols, shared.options.orthogonalization_epsilon);
}

// Fresh random Q's (when there are no factors to start warm from), then every Q orthogonalized,
// its lost columns drawn afresh (Note [Warm factors keep their rank]).
void prepare_q(const Shared& shared, Memory& memory, const GradBucket& bucket,
               const std::vector<Matrix>& matrices, std::int64_t p_size, std::int64_t q_size) {
  if (memory.p.num_elements() != p_size || memory.q.num_elements() != q_size) {
    memory.p = Tensor(DataType::Float32, {p_size});
    memory.q = Tensor(DataType::Float32, {q_size});
    nn::detail::fill_normal(memory.q.span<float>(), shared.options.random_seed,
                            static_cast<std::uint64_t>(bucket.index), next_draw(memory, bucket));
  }
  for (const Matrix& m : matrices) {
    float* q = float_data(memory.q) + m.q_offset;
    if (nn::detail::orthogonalize(q, m.cols, m.rank, shared.options.orthogonalization_epsilon) > 0)
      refill_zero_columns(shared, memory, bucket, q, m.cols, m.rank);
  }
}

CommFuture per_matrix(const std::shared_ptr<Shared>& shared, GradBucket& bucket) {
  PowerSGDState& counters = *shared->state;
  const PowerSGDState& options = shared->options;
  if (bucket.pass_index < options.start_powerSGD_iter) {  // Note [PowerSGD after a join].
    shared->count_pass(bucket);
    return allreduce()(bucket);
  }
  const std::shared_ptr<Memory> memory = shared->memory_for(bucket);
  const Tensor input = working_copy(bucket, bucket.buffer.num_elements());
  const bool feedback = add_error(options, *memory, input);

  // Step I: which gradients are compressed (PyTorch views each as dim 0 x the rest).
  std::vector<Matrix> matrices;
  std::vector<std::pair<std::int64_t, std::int64_t>> plain;  // (offset, count) sent as they are.
  std::int64_t p_size = 0, q_size = 0, plain_size = 0;
  const auto* base = static_cast<const char*>(bucket.buffer.data());
  for (const Tensor& g : bucket.gradients) {
    const auto offset = static_cast<std::int64_t>(static_cast<const char*>(g.data()) - base) /
                        static_cast<std::int64_t>(element_size(g.dtype()));
    const std::int64_t count = g.num_elements();
    const std::int64_t rows = g.dim() == 0 ? 1 : g.shape()[0];
    const std::int64_t cols = rows == 0 ? 0 : count / rows;
    const std::int64_t rank =
        std::min<std::int64_t>({rows, cols, options.matrix_approximation_rank});
    counters.total_numel_before_compression += count;
    if (count > 0 && nn::detail::should_compress(rows, cols, rank, options.min_compression_rate)) {
      // Note [Tall matrices at full rank].
      const bool transposed = rank == cols && cols < rows;
      const Matrix m = transposed ? Matrix{offset, cols, rows, rank, p_size, q_size, true}
                                  : Matrix{offset, rows, cols, rank, p_size, q_size, false};
      matrices.push_back(m);
      p_size += m.rows * rank;
      q_size += m.cols * rank;
      counters.total_numel_after_compression += (rows + cols) * rank;
    } else {
      plain.emplace_back(offset, count);
      plain_size += count;
      counters.total_numel_after_compression += count;
    }
  }
  const DataType wire = bucket.buffer.dtype();
  const std::string& name = bucket.op_name;

  // Step II: the uncompressed gradients, packed and averaged in one allreduce.
  Tensor uncompressed(DataType::Float32, {plain_size});
  std::int64_t at = 0;
  for (const auto& [offset, count] : plain) {
    std::copy_n(float_data(input) + offset, count, float_data(uncompressed) + at);
    at += count;
  }
  CommFuture plain_future = plain_size > 0 ? reduce_floats(uncompressed, wire, name + ".powersgd.u",
                                                           ReduceOp::Average, bucket.process_set)
                                           : CommFuture::ready(uncompressed);
  const auto unpack_plain = [input, uncompressed, plain]() {
    std::int64_t from = 0;
    for (const auto& [offset, count] : plain) {
      std::copy_n(float_data(uncompressed) + from, count, float_data(input) + offset);
      from += count;
    }
  };
  const auto done = [shared, memory, bucket, input, unpack_plain](const Tensor&) {
    unpack_plain();
    return finish_pass(*shared, *memory, bucket, input);
  };
  if (matrices.empty()) {
    if (feedback) remember_error(*memory, input, matrices);  // Nothing left unsent.
    return plain_future.then(done);
  }

  // Step III: P = M·Q for every compressed gradient, summed across the ranks.
  prepare_q(*shared, *memory, bucket, matrices, p_size, q_size);
  const auto product = [input, memory, matrices](bool left) {
    for (const Matrix& m : matrices) {
      auto p = as_matrix(memory->p.slice(m.p_offset, {m.rows * m.rank}), m.rows, m.rank);
      auto q = as_matrix(memory->q.slice(m.q_offset, {m.cols * m.rank}), m.cols, m.rank);
      with_matrix(input, m, [&](auto&& mat) {
        if (left) {
          p.noalias() = mat * q;
        } else {
          q.noalias() = mat.transpose() * p;
        }
      });
    }
  };
  product(/*left=*/true);
  const ProcessSet set = bucket.process_set;
  CommFuture p_future = reduce_floats(memory->p, wire, name + ".powersgd.p", ReduceOp::Sum, set);
  // Then: orthogonalize the P's, Q = Mᵀ·P, averaged; then M ≈ P·Qᵀ.
  const double epsilon = options.orthogonalization_epsilon;
  return plain_future.then([p_future](const Tensor&) { return p_future; })
      .then([memory, matrices, product, epsilon, wire, name, set, input, feedback](const Tensor&) {
        for (const Matrix& m : matrices) {
          nn::detail::orthogonalize(float_data(memory->p) + m.p_offset, m.rows, m.rank, epsilon);
        }
        product(/*left=*/false);
        if (feedback) remember_error(*memory, input, matrices);
        return reduce_floats(memory->q, wire, name + ".powersgd.q", ReduceOp::Average, set);
      })
      .then([input, memory, matrices, done](const Tensor& q_result) {
        for (const Matrix& m : matrices) {
          auto p = as_matrix(memory->p.slice(m.p_offset, {m.rows * m.rank}), m.rows, m.rank);
          auto q = as_matrix(memory->q.slice(m.q_offset, {m.cols * m.rank}), m.cols, m.rank);
          with_matrix(input, m, [&](auto&& mat) { mat.noalias() = p * q.transpose(); });
        }
        return done(q_result);
      });
}

CommFuture batched(const std::shared_ptr<Shared>& shared, GradBucket& bucket) {
  PowerSGDState& counters = *shared->state;
  const PowerSGDState& options = shared->options;
  if (bucket.pass_index < options.start_powerSGD_iter) {  // Note [PowerSGD after a join].
    shared->count_pass(bucket);
    return allreduce()(bucket);
  }
  const std::shared_ptr<Memory> memory = shared->memory_for(bucket);
  const std::int64_t count = bucket.buffer.num_elements();
  const auto side = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(count))));
  const std::int64_t rank = std::min<std::int64_t>(side, options.matrix_approximation_rank);
  counters.total_numel_before_compression += count;
  counters.total_numel_after_compression += 2 * side * rank;
  const Tensor input = working_copy(bucket, side * side);  // Zero-padded to side².
  const bool feedback = add_error(options, *memory, input);
  if (side == 0) return CommFuture::ready(finish_pass(*shared, *memory, bucket, input));

  const Matrix whole{0, side, side, rank, 0, 0, false};
  prepare_q(*shared, *memory, bucket, {whole}, side * rank, side * rank);
  auto mat = as_matrix(input, side, side);
  as_matrix(memory->p, side, rank).noalias() = mat * as_matrix(memory->q, side, rank);
  const DataType wire = bucket.buffer.dtype();
  const std::string name = bucket.op_name;
  const ProcessSet set = bucket.process_set;
  const double epsilon = options.orthogonalization_epsilon;
  return reduce_floats(memory->p, wire, name + ".powersgd.p", ReduceOp::Sum, set)
      .then([input, memory, side, rank, wire, name, set, epsilon, feedback, whole](const Tensor&) {
        nn::detail::orthogonalize(float_data(memory->p), side, rank, epsilon);
        as_matrix(memory->q, side, rank).noalias() =
            as_matrix(input, side, side).transpose() * as_matrix(memory->p, side, rank);
        if (feedback) remember_error(*memory, input, std::vector<Matrix>{whole});
        return reduce_floats(memory->q, wire, name + ".powersgd.q", ReduceOp::Average, set);
      })
      .then([shared, memory, bucket, input, side, rank](const Tensor&) {
        as_matrix(input, side, side).noalias() =
            as_matrix(memory->p, side, rank) * as_matrix(memory->q, side, rank).transpose();
        return finish_pass(*shared, *memory, bucket, input);
      });
}

CommHook make_hook(std::shared_ptr<PowerSGDState> state, bool is_batched) {
  const char* who = is_batched ? "batched_powersgd" : "powersgd";
  check_state(state, who);
  auto shared = std::make_shared<Shared>();
  shared->options = *state;
  shared->state = std::move(state);
  return CommHook(
      [shared, is_batched](GradBucket& bucket) {
        return is_batched ? batched(shared, bucket) : per_matrix(shared, bucket);
      },
      who);
}

}  // namespace

CommHook powersgd(std::shared_ptr<PowerSGDState> state) {
  return make_hook(std::move(state), /*is_batched=*/false);
}

CommHook batched_powersgd(std::shared_ptr<PowerSGDState> state) {
  return make_hook(std::move(state), /*is_batched=*/true);
}

}  // namespace tutti::nn::hooks

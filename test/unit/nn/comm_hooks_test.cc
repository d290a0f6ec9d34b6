// SPDX-License-Identifier: Apache-2.0
// The parts of the communication hooks that need no runtime: CommFuture's chains and errors,
// CommHook's checks, fp16/bf16_compress around a local inner hook, PowerSGD's option checks,
// and PowerSGD's arithmetic (compression decision, Gram-Schmidt, seeded draws) against closed
// forms. Their collectives are tested under MPI (test/mpi/training/comm_hooks_test.cc).
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "src/nn/parallel/powersgd_math.h"
#include "test/unit/nn/nn_test_util.h"
#include "tutti/nn.h"

namespace tutti::nn {
namespace {

using test::random_tensor;
using test::values;

template <class F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::Internal;
}

Tensor floats(std::vector<float> v) {
  return Tensor::from<float>(v, {static_cast<std::int64_t>(v.size())});
}

TEST_CASE("CommFuture: ready values flow through continuations in order", "[comm_hooks]") {
  std::vector<int> order;
  CommFuture future = CommFuture::ready(floats({1, 2}))
                          .then([&](const Tensor& t) {
                            order.push_back(1);
                            return floats({values(t)[0] + 10, values(t)[1] + 10});
                          })
                          .then([&](const Tensor& t) {
                            order.push_back(2);
                            return CommFuture::ready(floats({values(t)[0] * 2}));
                          });
  CHECK(order.empty());  // Nothing runs before poll() or wait().
  CHECK(future.poll());
  CHECK(order == std::vector<int>{1, 2});
  CHECK(values(future.wait()) == std::vector<float>{22});
  CHECK(values(future.wait()) == std::vector<float>{22});  // Again: the same result.
  CHECK(order.size() == 2);
}

TEST_CASE("CommFuture: an error skips the continuations and is thrown by wait()", "[comm_hooks]") {
  bool ran = false;
  // A default Handle is an op that failed with InvalidArgument.
  CommFuture failed = CommFuture(Handle(), floats({1})).then([&](const Tensor& t) {
    ran = true;
    return t;
  });
  CHECK(failed.poll());  // Done (with its error); poll() does not throw.
  CHECK(code_of([&] { failed.wait(); }) == ErrorCode::InvalidArgument);
  CHECK_FALSE(ran);
  CommFuture throwing = CommFuture::ready(floats({1})).then([](const Tensor&) -> Tensor {
    throw Error(ErrorCode::Mismatch, "from the continuation");
  });
  CHECK(code_of([&] { throwing.wait(); }) == ErrorCode::Mismatch);
  CommFuture empty_next =
      CommFuture::ready(floats({1})).then([](const Tensor&) { return CommFuture(); });
  CHECK(code_of([&] { empty_next.wait(); }) == ErrorCode::InvalidArgument);
  CHECK(code_of([] { CommFuture().wait(); }) == ErrorCode::InvalidArgument);
  CHECK_FALSE(CommFuture().valid());
}

TEST_CASE("CommHook: empty hooks are refused where they would be called", "[comm_hooks]") {
  CHECK(CommHook().empty());
  CHECK(code_of([] { static_cast<void>(CommHook(CommHook::Function{})); }) ==
        ErrorCode::InvalidArgument);
  GradBucket bucket;
  CHECK(code_of([&] { CommHook()(bucket); }) == ErrorCode::InvalidArgument);
  const CommHook hook([](GradBucket& b) { return CommFuture::ready(b.buffer); }, "mine");
  const CommHook copy = hook;  // NOLINT(performance-unnecessary-copy-initialization): a value.
  CHECK(copy.name() == "mine");
  CHECK_FALSE(copy.empty());
}

// A bucket of two gradients ([2, 3] and [4]) over one buffer, as DDP hands it to a hook.
GradBucket two_gradient_bucket(const Tensor& buffer) {
  GradBucket bucket;
  bucket.buffer = buffer;
  bucket.names = {"w", "b"};
  bucket.gradients = {buffer.slice(0, {2, 3}), buffer.slice(6, {4})};
  bucket.op_name = "test.bucket.0";
  return bucket;
}

TEST_CASE("fp16_compress and bf16_compress hand the inner hook a 2-byte bucket with views",
          "[comm_hooks]") {
  const bool half = GENERATE(true, false);
  const DataType wire = half ? DataType::Float16 : DataType::BFloat16;
  // Values exact in both 2-byte types, so the round trip is exact.
  std::vector<float> input = {0.5f, -1.0f, 2.0f, 0.25f, -3.0f, 8.0f, 1.5f, -0.75f, 4.0f, 16.0f};
  const Tensor buffer = floats(input);
  GradBucket bucket = two_gradient_bucket(buffer);
  bool inner_ok = false;
  const CommHook doubling([&](GradBucket& b) {
    inner_ok = b.buffer.dtype() == wire && b.gradients.size() == 2 &&
               b.gradients[0].shape() == Shape{2, 3} && b.gradients[1].shape() == Shape{4} &&
               static_cast<const char*>(b.gradients[1].data()) ==
                   static_cast<const char*>(b.buffer.data()) + 6 * 2 &&
               b.names == std::vector<std::string>{"w", "b"} && b.op_name == "test.bucket.0";
    Tensor doubled(wire, b.buffer.shape());
    for (std::int64_t i = 0; i < b.buffer.num_elements(); ++i) {
      if (half) {
        doubled.span<float16>()[i] = 2.0f * static_cast<float>(b.buffer.span<float16>()[i]);
      } else {
        doubled.span<bfloat16>()[i] = 2.0f * static_cast<float>(b.buffer.span<bfloat16>()[i]);
      }
    }
    return CommFuture::ready(doubled);
  });
  const CommHook hook = half ? hooks::fp16_compress(doubling) : hooks::bf16_compress(doubling);
  const Tensor result = hook(bucket).wait();
  CHECK(inner_ok);
  CHECK(result.data() == buffer.data());  // Decompressed into the float32 bucket itself.
  std::vector<float> expected;
  for (float v : input) expected.push_back(2 * v);
  CHECK(values(buffer) == expected);
  // The inner hook must answer in the 2-byte type.
  const CommHook wrong(
      [](GradBucket&) { return CommFuture::ready(Tensor(DataType::Float32, {10})); });
  GradBucket again = two_gradient_bucket(floats(input));
  CHECK(code_of([&] { hooks::fp16_compress(wrong)(again).wait(); }) == ErrorCode::InvalidArgument);
  // A bucket that is not float32 (compressed twice).
  GradBucket narrow = two_gradient_bucket(Tensor(DataType::Float16, {10}));
  CHECK(code_of([&] { hooks::fp16_compress(doubling)(narrow); }) == ErrorCode::InvalidArgument);
}

TEST_CASE("PowerSGD refuses bad states as PyTorch does", "[comm_hooks][powersgd]") {
  using hooks::PowerSGDState;
  auto with = [](auto edit) {
    auto state = std::make_shared<PowerSGDState>();
    edit(*state);
    return state;
  };
  for (bool batched : {false, true}) {
    auto make = [&](std::shared_ptr<PowerSGDState> s) {
      return code_of([&] { batched ? hooks::batched_powersgd(s) : hooks::powersgd(s); });
    };
    CHECK(make(nullptr) == ErrorCode::InvalidArgument);
    CHECK(make(with([](auto& s) { s.matrix_approximation_rank = 0; })) ==
          ErrorCode::InvalidArgument);
    CHECK(make(with([](auto& s) { s.min_compression_rate = -1; })) == ErrorCode::InvalidArgument);
    CHECK(make(with([](auto& s) { s.min_compression_rate = NAN; })) == ErrorCode::InvalidArgument);
    CHECK(make(with([](auto& s) { s.orthogonalization_epsilon = -1e-8; })) ==
          ErrorCode::InvalidArgument);
    // start_powerSGD_iter <= 1 with error feedback or warm start.
    CHECK(make(with([](auto& s) { s.start_powerSGD_iter = 1; })) == ErrorCode::InvalidArgument);
    CHECK(make(with([](auto& s) {
            s.start_powerSGD_iter = 0;
            s.use_error_feedback = false;
          })) == ErrorCode::InvalidArgument);
    CHECK(make(with([](auto& s) {
            s.start_powerSGD_iter = 1;
            s.warm_start = false;
          })) == ErrorCode::InvalidArgument);
    CHECK(make(with([](auto& s) {
            s.start_powerSGD_iter = 1;
            s.warm_start = false;
            s.use_error_feedback = false;
          })) == ErrorCode::Internal);  // Fine: nothing to remember across the rebuild.
    CHECK(make(with([](auto& s) { s.start_powerSGD_iter = 2; })) == ErrorCode::Internal);
  }
}

TEST_CASE("PowerSGD compresses an n x m matrix iff (n + m)·r·rate < n·m", "[powersgd]") {
  CHECK(detail::should_compress(100, 100, 1, 2));       // 400 < 10000
  CHECK_FALSE(detail::should_compress(10, 1, 1, 2));    // A bias: 22 >= 10.
  CHECK_FALSE(detail::should_compress(4, 4, 1, 2));     // 16 == 16: not smaller.
  CHECK(detail::should_compress(4, 4, 1, 1.9));         // 15.2 < 16
  CHECK(detail::should_compress(4, 4, 4, 0));           // Rate 0 compresses everything.
  CHECK_FALSE(detail::should_compress(64, 27, 27, 1));  // Full rank never pays at rate 1.
}

TEST_CASE("Gram-Schmidt makes the columns orthonormal; epsilon shrinks them; zero stays zero",
          "[powersgd]") {
  const std::int64_t rows = 37, cols = 5;
  Tensor m = random_tensor({rows, cols}, 11);
  detail::orthogonalize(static_cast<float*>(m.data()), rows, cols, 0);
  const std::vector<float> v = values(m);
  double worst = 0;
  for (std::int64_t a = 0; a < cols; ++a) {
    for (std::int64_t b = 0; b < cols; ++b) {
      double dot = 0;
      for (std::int64_t k = 0; k < rows; ++k) dot += double(v[k * cols + a]) * v[k * cols + b];
      worst = std::max(worst, std::abs(dot - (a == b ? 1.0 : 0.0)));
    }
  }
  CHECK(worst < 1e-5);
  // One column: divided by (norm + epsilon), so its norm is norm / (norm + epsilon).
  std::vector<float> col = {3, 4};
  CHECK(detail::orthogonalize(col.data(), 2, 1, 5.0) == 0);
  CHECK(col[0] == Approx(0.3).epsilon(1e-6));
  CHECK(col[1] == Approx(0.4).epsilon(1e-6));
  std::vector<float> zero = {0, 0, 0, 1, 0, 2};             // Column 0 zero, column 1 (0, 1, 2).
  CHECK(detail::orthogonalize(zero.data(), 3, 2, 0) == 1);  // How many it zeroed.
  CHECK(zero[0] == 0);
  CHECK(zero[2] == 0);
  CHECK(zero[4] == 0);
  CHECK(zero[3] == Approx(1 / std::sqrt(5.0)));
  CHECK(zero[5] == Approx(2 / std::sqrt(5.0)));
  // A column dependent on the previous ones becomes zero, not normalized rounding noise.
  std::vector<float> dependent = {1, 2, 0.1f, 2, 4, 0.3f, 3, 6, 0.2f};  // Column 1 = 2 x column 0.
  CHECK(detail::orthogonalize(dependent.data(), 3, 3, 0) == 1);
  CHECK(dependent[1] == 0);
  CHECK(dependent[4] == 0);
  CHECK(dependent[7] == 0);
  double dot = 0, norm0 = 0, norm2 = 0;
  for (int k = 0; k < 3; ++k) {
    dot += double(dependent[3 * k]) * dependent[3 * k + 2];
    norm0 += double(dependent[3 * k]) * dependent[3 * k];
    norm2 += double(dependent[3 * k + 2]) * dependent[3 * k + 2];
  }
  CHECK(std::abs(dot) < 1e-6);
  CHECK(norm0 == Approx(1));
  CHECK(norm2 == Approx(1));
}

TEST_CASE("Seeded normal draws repeat exactly and look standard normal", "[powersgd]") {
  std::vector<float> a(10001), b(10001), c(10001);
  detail::fill_normal(a, 7, 3, 0);
  detail::fill_normal(b, 7, 3, 0);
  detail::fill_normal(c, 7, 3, 1);  // Another draw of the same bucket.
  CHECK(a == b);
  CHECK(a != c);
  double sum = 0, squares = 0;
  for (float x : a) {
    sum += x;
    squares += double(x) * x;
  }
  const double mean = sum / double(a.size());
  CHECK(std::abs(mean) < 0.05);                            // 5 sigma of the mean: 0.05.
  CHECK(std::abs(squares / double(a.size()) - 1) < 0.07);  // Variance within ~5 sigma.
}

}  // namespace
}  // namespace tutti::nn

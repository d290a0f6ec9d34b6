// SPDX-License-Identifier: Apache-2.0
// The arithmetic of the PowerSGD hooks (src/nn/parallel/powersgd.cc), apart from their
// communication so that unit tests reach it: the compression decision, Gram-Schmidt with
// epsilon, and the seeded normal draws every rank repeats identically. Private to src/nn.
#pragma once

#include <cstdint>
#include <span>

namespace tutti::nn::detail {

// PyTorch's _should_compress: an n x m matrix at rank r is compressed iff its factors, scaled by
// `min_compression_rate`, are smaller than the matrix: (n + m)·r·rate < n·m.
bool should_compress(std::int64_t rows, std::int64_t cols, std::int64_t rank,
                     double min_compression_rate);

// Orthonormalizes the columns of the row-major `rows` x `cols` matrix at `data`, in place, by
// Gram-Schmidt (PyTorch's _orthogonalize_gram_schmidt): each column in turn is divided by its
// norm (plus `epsilon`), then its projection is removed from the columns after it. Unlike
// PyTorch, a column left with less than 1e-4 of its norm (dependent on the previous ones, or
// zero) becomes zero instead of normalized rounding noise (or NaN): the nonzero columns stay
// orthonormal and span what the input spanned. Norms and dot products are accumulated in double.
// Returns how many columns became zero.
std::int64_t orthogonalize(float* data, std::int64_t rows, std::int64_t cols, double epsilon);

// Fills `out` with standard normal values drawn from a generator seeded by (seed, stream, draw):
// the same three numbers give the same values on every rank and every run, independent of any
// other draw. Box-Muller over splitmix64, so no library distribution's implementation matters.
void fill_normal(std::span<float> out, std::uint64_t seed, std::uint64_t stream,
                 std::uint64_t draw);

}  // namespace tutti::nn::detail

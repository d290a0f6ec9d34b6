// SPDX-License-Identifier: Apache-2.0
// The median the benchmarks built with allreduce_benchmark report (one home: they share a unity
// translation unit).
#pragma once

#include <algorithm>
#include <vector>

namespace tutti::examples {

// The middle value of `values` (the upper one of an even count). `values` must not be empty.
inline double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace tutti::examples

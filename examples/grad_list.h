// SPDX-License-Identifier: Apache-2.0
// The reference gradient list of DESIGN.md section 6 (ResNet-50's 161 gradient element counts
// in the order backward produces them), for every benchmark: built into the binary from
// examples/data/resnet50_grads.txt, so a benchmark finds it wherever it runs; --grads FILE
// reads another list in the same format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tutti::examples {

// The built-in list: 161 counts, 25,557,032 elements.
std::vector<std::int64_t> resnet50_grads();

// The counts of a list file: one positive count per line; empty lines and lines starting with
// '#' are skipped. Prints what is wrong (the file, the line) and exits 2 if the file cannot be
// read, a line is not a count, or there is none.
std::vector<std::int64_t> read_grads(const std::string& path);

// read_grads(path), or the built-in list for an empty path.
std::vector<std::int64_t> grads_or_default(const std::string& path);

}  // namespace tutti::examples

// SPDX-License-Identifier: Apache-2.0
#include "src/core/submission_window.h"

#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/completer.h"
#include "src/core/tensor_queue.h"

namespace tutti::core {
namespace {

TEST_CASE("A submission window marks every kChunk-th push", "[window]") {
  SubmissionWindow window;
  std::vector<int> marked;
  for (int push = 1; push <= 5 * SubmissionWindow::kChunk; ++push) {
    if (window.count()) marked.push_back(push);
  }
  const int k = SubmissionWindow::kChunk;
  CHECK(marked == std::vector<int>{k, 2 * k, 3 * k, 4 * k, 5 * k});
}

TEST_CASE("A submission window names the op marked kLagChunks marks before, until it is done",
          "[window]") {
  SubmissionWindow window;
  const Completer completer(nullptr);
  std::vector<std::shared_ptr<Entry>> entries;
  const auto mark_new = [&] {
    entries.push_back(make_entry());
    return window.mark(handle_state(entries.back()));
  };
  // Nothing to wait for until kLagChunks ops are marked.
  for (std::size_t i = 0; i < SubmissionWindow::kLagChunks; ++i) CHECK(mark_new() == nullptr);
  // Then, at each mark, the one marked kLagChunks before, while it is not done.
  for (std::size_t i = 0; i < 3; ++i) {
    const Entry& expected = *entries[i];  // Marked kLagChunks marks before this one.
    const std::shared_ptr<const detail::OpState> oldest = mark_new();
    REQUIRE(oldest != nullptr);
    CHECK(oldest.get() == expected.state.get());
  }
  // A done op is not waited for.
  completer.complete(*entries[entries.size() - SubmissionWindow::kLagChunks], Status());
  CHECK(mark_new() == nullptr);
  // The window keeps the ops it marked alive for as long as it may name them.
  const std::weak_ptr<const detail::OpState> kept = handle_state(entries.back());
  entries.clear();
  CHECK_FALSE(kept.expired());
}

}  // namespace
}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
#include "src/core/completer.h"

#include "src/core/op_state.h"

namespace tutti::core {

void Completer::complete(Entry& entry, const Status& status) const {
  if (timeline_ != nullptr && timeline_->enabled()) {
    timeline_->op_end(entry.request.name, status.ok() ? "OK" : status.message());
  }
  detail::OpResults& results = entry.state->results;
  if (results.drop_output) results.output = Tensor();
  if (results.output_row_dims && status.ok()) {
    Shape shape = *results.output_row_dims;
    const std::int64_t row = num_elements(shape);
    shape.insert(shape.begin(), row == 0 ? 0 : results.output.num_elements() / row);
    results.output = results.output.slice(0, std::move(shape));
  }
  results.scratch = Tensor();
  entry.state->complete(status);
}

void Completer::complete(std::span<const std::shared_ptr<Entry>> entries,
                         const Status& status) const {
  for (const std::shared_ptr<Entry>& entry : entries) complete(*entry, status);
}

}  // namespace tutti::core

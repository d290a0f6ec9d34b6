// SPDX-License-Identifier: Apache-2.0
#include "src/core/completer.h"

#include "src/core/op_state.h"

namespace tutti::core {

void Completer::complete(Entry& entry, const Status& status, bool record) const {
  if (timeline_ != nullptr && timeline_->enabled()) {
    timeline_->op_end(entry.request.name, status.ok() ? "OK" : status.message());
  }
  if (record && recorder_ != nullptr) {
    recorder_->update(entry.record, status.ok() ? OpPhase::Done : OpPhase::Failed, {},
                      status.message());
  }
  entry.state->complete(status);
}

void Completer::complete(std::span<const std::shared_ptr<Entry>> entries,
                         const Status& status) const {
  for (const std::shared_ptr<Entry>& entry : entries) complete(*entry, status);
}

}  // namespace tutti::core

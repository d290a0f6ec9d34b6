// SPDX-License-Identifier: Apache-2.0
#include "src/core/completer.h"

#include "src/core/op_state.h"

namespace tutti::core {

bool Completer::finish(Entry& entry, const Status& status, bool record) const {
  if (timeline_ != nullptr && timeline_->enabled()) {
    timeline_->op_end(entry.request.name, status.ok() ? "OK" : status.message());
  }
  if (record && recorder_ != nullptr) {
    recorder_->update(entry.record, status.ok() ? OpPhase::Done : OpPhase::Failed, {},
                      status.message());
  }
  return entry.state->finish(status);
}

void Completer::complete(Entry& entry, const Status& status, bool record) const {
  if (finish(entry, status, record)) entry.state->wake();
}

void Completer::complete(std::span<const std::shared_ptr<Entry>> entries,
                         const Status& status) const {
  Batch batch(*this);
  for (const std::shared_ptr<Entry>& entry : entries) batch.complete(entry, status);
}

void Completer::Batch::complete(const std::shared_ptr<Entry>& entry, const Status& status,
                                bool record) {
  if (completer_.finish(*entry, status, record)) to_wake_.push_back(handle_state(entry));
}

Completer::Batch::~Batch() {
  for (const std::shared_ptr<detail::OpState>& state : to_wake_) state->wake();
}

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/pending_ops.h"

#include <utility>

#include "src/common/check.h"

namespace tutti::core {

PendingOp& PendingOps::file(OpKeyView key, std::uint64_t hash, int members,
                            std::chrono::steady_clock::time_point now, bool* made) {
  if (PendingOp* op = find(key, hash)) {
    *made = false;
    return *op;
  }
  std::unique_ptr<PendingOp> op;
  if (spare_.empty()) {
    op = std::make_unique<PendingOp>();
  } else {
    op = std::move(spare_.back());
    spare_.pop_back();
    spare_slots_ -= op->requests.capacity();
  }
  op->process_set_id = key.process_set_id;
  op->name.assign(key.name);  // Keeps a recycled record's capacity.
  op->hash = hash;
  op->requests.assign(static_cast<std::size_t>(members), nullptr);
  op->count = 0;
  op->common_hit = -2;
  op->first_seen = now;
  op->queued = false;
  *made = true;
  // The key now views the record's own name, which the index keeps with it.
  return *index_.insert(hash, std::move(op)).first->get();
}

std::unique_ptr<PendingOp> PendingOps::take(const PendingOp& op) {
  std::unique_ptr<PendingOp> taken = index_.take({op.process_set_id, op.name}, op.hash);
  TUTTI_CHECK(taken.get() == &op, "pending op '", op.name, "' of set ", op.process_set_id,
              " is not in the table");
  return taken;
}

void PendingOps::recycle(std::unique_ptr<PendingOp> op) {
  if (op == nullptr || spare_.size() >= kSpare ||
      spare_slots_ + op->requests.capacity() > kSpareSlots)
    return;
  op->requests.clear();  // Releases the requests; keeps the slots' allocation.
  spare_slots_ += op->requests.capacity();
  spare_.push_back(std::move(op));
}

void PendingOps::take_set(int process_set_id) {
  index_.take_if(
      [&](const std::unique_ptr<PendingOp>& op) { return op->process_set_id == process_set_id; },
      [&](std::unique_ptr<PendingOp>&& op) { recycle(std::move(op)); });
}

}  // namespace tutti::core

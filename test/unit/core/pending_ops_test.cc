// SPDX-License-Identifier: Apache-2.0
// The coordinator's table of ops pending by name (Note [Pending ops by name] in
// src/core/negotiation/pending_ops.h): one record per (set, name), records that stay where they
// are while the table grows and shrinks, and taken records reused with a fresh state.
#include "src/core/negotiation/pending_ops.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

using Clock = std::chrono::steady_clock;
const Clock::time_point t0 = Clock::now();

PendingOp& file(PendingOps& ops, int set, const std::string& name, int members,
                Clock::time_point now, bool* made) {
  const OpKeyView key{set, name};
  return ops.file(key, name_hash(key), members, now, made);
}

PendingOp* find(PendingOps& ops, int set, const std::string& name) {
  const OpKeyView key{set, name};
  return ops.find(key, name_hash(key));
}

TEST_CASE("An op is filed once per set and name, with a slot per member", "[pending_ops]") {
  PendingOps ops;
  CHECK(ops.empty());
  bool made = false;
  PendingOp& a = file(ops, 0, "a", 3, t0, &made);
  CHECK(made);
  CHECK(a.process_set_id == 0);
  CHECK(a.name == "a");
  CHECK(a.requests == std::vector<std::shared_ptr<const Request>>(3));
  CHECK(a.count == 0);
  CHECK(a.common_hit == -2);
  CHECK(a.first_seen == t0);
  CHECK_FALSE(a.queued);
  a.count = 1;
  // The second member's request finds the same record, first seen as before.
  PendingOp& again = file(ops, 0, "a", 3, t0 + std::chrono::seconds(1), &made);
  CHECK_FALSE(made);
  CHECK(&again == &a);
  CHECK(again.count == 1);
  CHECK(again.first_seen == t0);
  // The same name in another set is another op.
  PendingOp& other = file(ops, 1, "a", 2, t0, &made);
  CHECK(made);
  CHECK(&other != &a);
  CHECK(other.requests.size() == 2);
  CHECK(ops.size() == 2);
  CHECK(find(ops, 0, "a") == &a);
  CHECK(find(ops, 1, "a") == &other);
  CHECK(find(ops, 2, "a") == nullptr);
  CHECK(find(ops, 0, "b") == nullptr);
}

TEST_CASE("A taken op leaves the table; its record comes back fresh for the next op",
          "[pending_ops]") {
  PendingOps ops;
  bool made = false;
  PendingOp& a = file(ops, 0, "a", 2, t0, &made);
  a.requests[1] = std::make_shared<const Request>();
  a.count = 1;
  a.common_hit = 7;
  a.queued = true;
  const std::weak_ptr<const Request> request = a.requests[1];
  std::unique_ptr<PendingOp> taken = ops.take(a);
  CHECK(taken.get() == &a);
  CHECK(ops.empty());
  CHECK(find(ops, 0, "a") == nullptr);
  CHECK(ops.spare() == 0);
  ops.recycle(std::move(taken));
  CHECK(ops.spare() == 1);
  CHECK(request.expired());  // The requests go with the op; the record stays.
  const Clock::time_point later = t0 + std::chrono::seconds(3);
  PendingOp& b = file(ops, 4, "a much longer name than the first one had", 3, later, &made);
  CHECK(made);
  CHECK(&b == &a);  // Reused.
  CHECK(ops.spare() == 0);
  CHECK(b.process_set_id == 4);
  CHECK(b.name == "a much longer name than the first one had");
  CHECK(b.requests == std::vector<std::shared_ptr<const Request>>(3));
  CHECK(b.count == 0);
  CHECK(b.common_hit == -2);
  CHECK(b.first_seen == later);
  CHECK_FALSE(b.queued);
  CHECK(find(ops, 4, "a much longer name than the first one had") == &b);
}

TEST_CASE("Records stay where they are while the table grows and shrinks", "[pending_ops]") {
  // 20,000 ops: the index rehashes as it grows past 64, 128, ... 65,536 slots, and shrinks as
  // they are taken.
  PendingOps ops;
  constexpr int kOps = 20000;
  std::vector<PendingOp*> filed;
  bool made = false;
  for (int i = 0; i < kOps; ++i) {
    PendingOp& op = file(ops, i % 3, "op." + std::to_string(i), 2, t0, &made);
    REQUIRE(made);
    op.count = i;
    filed.push_back(&op);
  }
  CHECK(ops.size() == kOps);
  for (int i = 0; i < kOps; ++i) {
    PendingOp* op = find(ops, i % 3, "op." + std::to_string(i));
    REQUIRE(op == filed[i]);
    REQUIRE(op->count == i);
  }
  // Take every other one: the rest are still found at their addresses.
  for (int i = 0; i < kOps; i += 2) ops.recycle(ops.take(*filed[i]));
  CHECK(ops.size() == kOps / 2);
  CHECK(ops.spare() == kOps / 2);
  for (int i = 0; i < kOps; ++i) {
    PendingOp* op = find(ops, i % 3, "op." + std::to_string(i));
    REQUIRE(op == (i % 2 == 0 ? nullptr : filed[i]));
  }
  for (int i = 1; i < kOps; i += 2) ops.recycle(ops.take(*filed[i]));
  CHECK(ops.empty());
  CHECK(ops.spare() == PendingOps::kSpare);  // 20,000 taken, 16,384 kept.
}

TEST_CASE("In a large job fewer records are kept: kSpareSlots request slots at most",
          "[pending_ops]") {
  PendingOps ops;
  constexpr int kMembers = 1000;  // 131 records' slots fit in kSpareSlots (131,072).
  std::vector<PendingOp*> filed;
  bool made = false;
  for (int i = 0; i < 200; ++i)
    filed.push_back(&file(ops, 0, "op." + std::to_string(i), kMembers, t0, &made));
  for (PendingOp* op : filed) ops.recycle(ops.take(*op));
  CHECK(ops.spare() == PendingOps::kSpareSlots / kMembers);
  CHECK(ops.spare() == 131);
  // Reused records come back with their slots, and make room for others again.
  for (int i = 0; i < 131; ++i) file(ops, 1, "again." + std::to_string(i), kMembers, t0, &made);
  CHECK(ops.spare() == 0);
}

TEST_CASE("Removing a set drops its ops and keeps the others'", "[pending_ops]") {
  PendingOps ops;
  bool made = false;
  PendingOp& a0 = file(ops, 0, "a", 2, t0, &made);
  file(ops, 1, "a", 2, t0, &made);
  file(ops, 1, "b", 2, t0, &made);
  PendingOp& c2 = file(ops, 2, "c", 2, t0, &made);
  ops.take_set(1);
  CHECK(ops.size() == 2);
  CHECK(ops.spare() == 2);
  CHECK(find(ops, 1, "a") == nullptr);
  CHECK(find(ops, 1, "b") == nullptr);
  CHECK(find(ops, 0, "a") == &a0);
  CHECK(find(ops, 2, "c") == &c2);
  std::vector<std::string> left;
  ops.for_each([&](const PendingOp& op) {
    left.push_back(std::to_string(op.process_set_id) + ":" + op.name);
  });
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"0:a", "2:c"});
}

}  // namespace
}  // namespace tutti::core

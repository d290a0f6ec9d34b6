// SPDX-License-Identifier: Apache-2.0
// See Note [Desync check] in negotiation/desync_check.h.
#include "src/core/negotiation/desync_check.h"

#include "src/base/strings.h"

namespace tutti::core {
namespace {

using detail::str_cat;

// "seq 3 ALLREDUCE 'grad.fc1'", as scripts/tutti-trace names ops.
std::string desync_op_name(std::int64_t sequence, Collective op, const std::string& name) {
  return str_cat("seq ", sequence, " ", to_string(op), " '", name, "'");
}

}  // namespace

Status DesyncCheck::observe(int global_rank, const RequestList& list) {
  if (reported_ || list.requests.empty()) return Status();
  if (list.sequences.size() != list.requests.size()) {
    return Status(ErrorCode::Internal,
                  str_cat("the desync check got ", list.requests.size(), " requests from rank ",
                          global_rank, " with ", list.sequences.size(), " sequence numbers"));
  }
  for (std::size_t i = 0; i < list.requests.size(); ++i) {
    Status status = observe_one(global_rank, list.requests[i], list.sequences[i]);
    if (!status.ok()) {
      reported_ = true;
      return status;
    }
  }
  return Status();
}

Status DesyncCheck::observe_one(int global_rank, const Request& request, std::int64_t sequence) {
  const int set_id = request.process_set_id;
  const Result<SetInfo> info = sets_.find(set_id);
  if (!info.ok()) {
    checks_.erase(set_id);  // Removed: its ranks fail its ops, and set ids are never reused.
    return Status();
  }
  const int set_rank = info.value().set_rank_of(global_rank);
  if (set_rank < 0) return Status();  // Refused by the rank's own argument checks.
  SetCheck& check = checks_[set_id];
  if (check.members.empty()) check.members.resize(static_cast<std::size_t>(info.value().size()));
  Member& member = check.members[static_cast<std::size_t>(set_rank)];
  Seen seen{.sequence = sequence, .op = request.op, .name = request.name.str()};
  member.recent.push_back(seen);
  if (member.recent.size() > kRecentOps) member.recent.pop_front();
  const std::int64_t place = sequence - member.base;
  if (request.op == Collective::Join) {
    join(check, set_rank, place);
    return Status();
  }
  auto [it, first] = check.places.try_emplace(place, Expected{.op = seen, .set_rank = set_rank});
  if (!first) {
    Expected& expected = it->second;
    if (expected.op.op != seen.op || expected.op.name != seen.name) {
      return mismatch(info.value(), check, expected, set_rank, seen);
    }
    ++expected.arrived;
  }
  forget_if_passed(check, it);
  return Status();
}

void DesyncCheck::join(SetCheck& check, int set_rank, std::int64_t place) {
  Member& joiner = check.members[static_cast<std::size_t>(set_rank)];
  joiner.joined_at = place;
  if (++check.joined < static_cast<int>(check.members.size())) {
    // Places past the join no longer wait for this member.
    for (auto it = check.places.lower_bound(place); it != check.places.end();) {
      forget_if_passed(check, it++);
    }
    return;
  }
  // The last member joined: the join completes, and every member's places start after it.
  for (Member& member : check.members) {
    member.base += member.joined_at + 1;
    member.joined_at = -1;
  }
  check.joined = 0;
  check.places.clear();
}

void DesyncCheck::forget_if_passed(SetCheck& check, std::map<std::int64_t, Expected>::iterator it) {
  int passed = it->second.arrived;
  for (const Member& member : check.members) {
    if (member.joined_at >= 0 && member.joined_at <= it->first) ++passed;
  }
  if (passed >= static_cast<int>(check.members.size())) check.places.erase(it);
}

Status DesyncCheck::mismatch(const SetInfo& info, const SetCheck& check, const Expected& expected,
                             int set_rank, const Seen& seen) const {
  const int set_id = info.id;
  const auto recent = [&](int member_rank) {
    std::vector<std::string> ops;
    for (const Seen& op : check.members[static_cast<std::size_t>(member_rank)].recent) {
      ops.push_back(desync_op_name(op.sequence, op.op, op.name));
    }
    return str_cat("rank ", info.global_rank_of(member_rank),
                   "'s last ops: ", detail::join_list(ops));
  };
  return Status(ErrorCode::Mismatch,
                str_cat("desync in process set ", set_id, " (", setting_, "): rank ",
                        info.global_rank_of(set_rank), " submitted ",
                        desync_op_name(seen.sequence, seen.op, seen.name), " where rank ",
                        info.global_rank_of(expected.set_rank), " submitted ",
                        desync_op_name(expected.op.sequence, expected.op.op, expected.op.name),
                        "; every rank must submit a set's ops in the same order in this mode. ",
                        recent(expected.set_rank), ". ", recent(set_rank), "."));
}

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// TUTTI_DEBUG=DETAIL's desync check, on the coordinator: every rank must submit each process
// set's ops in the same order, and the first rank that does not stops the job with Mismatch.
//
// Note [Desync check]
// Tutti negotiates ops by name, so ranks may submit them in any order; a rank that skipped an
// op then shows only as a stall, minutes later, on the ops the others wait in. With
// TUTTI_DEBUG=DETAIL a job promises one order per set instead (as torch.distributed requires of
// every job), and breaking it is reported at once, on every rank, with both ranks' recent ops.
// 1. Each rank numbers its ops per set as its queue accepts them (Entry::sequence, the flight
//    recorder's numbers) and sends the numbers with its requests (RequestList::sequences). The
//    response cache is off in this mode, so every request travels in full, in that order.
// 2. The coordinator lines the members' ops up by place: a member's sequence number less its
//    base (0, or the number after its last completed join). The first member to reach a place
//    fixes the op expected there (collective and name); every other member's op there must be
//    the same. A place is forgotten once every member has passed it.
// 3. Join is where members legitimately part: a member that joined submits nothing more in the
//    set while the others go on. Its join is not compared, and places at or past it do not
//    wait for it. When the last member joins, the join completes and every member's places
//    start again after its own join.
// 4. The first difference is returned as Mismatch; the coordinator stage then stops the job
//    with it, as with a stall, without filing the list that diverged (so no op at or past the
//    divergence runs, whichever rank's list came first): every rank fails its pending ops with
//    the message, and dumps its flight recorder. The check says nothing after that.
// Not covered: a rank that submits nothing more (there is nothing to compare: the stall
// inspector names it), shape or dtype differences under one name (negotiation reports those),
// and a thread that submits in a set while its own rank's join() waits there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "src/common/status.h"
#include "src/core/process_set_table.h"
#include "src/core/request.h"

namespace tutti::core {

// Communication thread of the coordinator only.
class DesyncCheck {
 public:
  // How many of a member's most recent ops a Mismatch message lists.
  static constexpr std::size_t kRecentOps = 8;

  // `sets` must outlive the check. `setting` names what turned it on, in its messages.
  explicit DesyncCheck(const ProcessSetTable& sets, std::string setting = "TUTTI_DEBUG=DETAIL")
      : sets_(sets), setting_(std::move(setting)) {}

  // Lines up one rank's requests (step 2). Mismatch describing the first op that differs from
  // another member's at the same place, naming both ranks' recent ops; Internal if the list
  // lacks sequence numbers. Requests of sets the rank is not in, or that no longer exist, are
  // skipped, as the coordinator drops them.
  Status observe(int global_rank, const RequestList& list);

 private:
  struct Seen {
    std::int64_t sequence = 0;
    Collective op = Collective::Allreduce;
    std::string name;
  };
  struct Member {
    std::int64_t base = 0;        // The sequence number of place 0.
    std::int64_t joined_at = -1;  // The place of its pending join, or -1.
    std::deque<Seen> recent;      // Its last kRecentOps ops in the set, oldest first.
  };
  // The op the first member to reach a place submitted there.
  struct Expected {
    Seen op;
    int set_rank = 0;
    int arrived = 1;  // Members whose op at this place has been seen.
  };
  struct SetCheck {
    std::vector<Member> members;  // By set rank.
    std::map<std::int64_t, Expected> places;
    int joined = 0;  // Members with a pending join.
  };

  Status observe_one(int global_rank, const Request& request, std::int64_t sequence);
  // Step 3 for set rank `set_rank` joining at `place`.
  void join(SetCheck& check, int set_rank, std::int64_t place);
  // Forgets the place if every member has passed it or joined before it.
  static void forget_if_passed(SetCheck& check, std::map<std::int64_t, Expected>::iterator it);
  // The Mismatch message: where `seen`, set rank `set_rank`'s op, differs from `expected`.
  Status mismatch(const SetInfo& info, const SetCheck& check, const Expected& expected,
                  int set_rank, const Seen& seen) const;

  const ProcessSetTable& sets_;
  const std::string setting_;
  std::map<int, SetCheck> checks_;  // By set id.
  bool reported_ = false;
};

}  // namespace tutti::core

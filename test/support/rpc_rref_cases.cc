// SPDX-License-Identifier: Apache-2.0
// The shared cases of RRef lifetimes (Note [Shared RPC cases] in rpc_cases.h): forks to third
// workers, back to the owner, to oneself and in responses; owners' value counts while the
// references live, once they are gone, and at graceful shutdown.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "test/support/error_of.h"
#include "test/support/rpc_cases.h"
#include "test/support/rpc_functions.h"

namespace tutti::test {
namespace {

using rpc::Message;

int owned_on(const std::string& name) {
  return std::stoi(rpc::rpc_sync(name, "owned_count").bytes);
}

// Polls until worker `name` owns no value (deletes are asynchronous); returns its last count.
int wait_until_none_owned(const std::string& name) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int count = owned_on(name);
  while (count != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    count = owned_on(name);
  }
  return count;
}

// The forks of one value, checked: to a third worker, back to its owner, on through the third
// worker to the owner, to oneself, and back in a response (kept in `returned`).
void fork_everywhere(RpcWorld& world, const rpc::RRef& ref, int i, std::vector<rpc::RRef>& returned,
                     Problems& p) {
  const std::string owner = world.peer(1), third = world.peer(2), me = worker(world.rank());
  const Message one{.tensors = {}, .rrefs = {ref}, .bytes = {}};
  const std::string want = std::to_string(i);
  const std::vector<float> value = values_of(filled({4}, float(i)));
  Message a = rpc::rpc_sync(third, "fetch", one);
  p.expect(a.bytes == want && values_of(a.tensors.at(0).value()) == value,
           "third worker's fetch " + want);
  Message b = rpc::rpc_sync(owner, "owner_value", one);
  p.expect(b.bytes == "owner" && values_of(b.tensors.at(0).value()) == value,
           "the owner's value " + want);
  Message c =
      rpc::rpc_sync(third, "forward_fetch", {.tensors = {}, .rrefs = {ref}, .bytes = owner});
  p.expect(c.bytes == want, "forwarded to the owner " + want);
  p.expect(rpc::rpc_sync(me, "fetch", one).bytes == want, "fork to oneself " + want);
  // Forks coming back in a response, twice in one message.
  Message e =
      rpc::rpc_sync(third, "return_rrefs", {.tensors = {}, .rrefs = {ref, ref}, .bytes = {}});
  p.expect(e.rrefs.size() == 2 && e.rrefs[0].is_owner() == (owner == me) &&
               e.rrefs[1].owner().name == owner && e.rrefs[1].to_here().bytes == want,
           "returned forks " + want);
  for (rpc::RRef& r : e.rrefs) returned.push_back(r);
}

Problems rrefs_freed_under_forks_body(RpcWorld& world) {
  // Every worker creates values on the next worker and forks them through the one after, so
  // each owner holds exactly what the worker before it made.
  constexpr int kRefs = 25;
  Problems p;
  const std::string owner = world.peer(1);
  std::vector<rpc::RRef> refs, returned;
  for (int i = 0; i < kRefs; ++i) {
    refs.push_back(rpc::remote(owner, "echo",
                               {.tensors = {nn::Variable(filled({4}, float(i)))},
                                .rrefs = {},
                                .bytes = std::to_string(i)}));
  }
  for (int i = 0; i < kRefs; ++i)
    fork_everywhere(world, refs[static_cast<std::size_t>(i)], i, returned, p);
  // An RRef its owner made and returned: a fork from the owner.
  Message made =
      rpc::rpc_sync(owner, "make_local_rref", {.tensors = {}, .rrefs = {}, .bytes = "local"});
  rpc::RRef from_owner = made.rrefs.at(0);
  p.expect(from_owner.to_here().bytes == "local" && from_owner.confirmed_by_owner(),
           "the owner's fork");
  world.barrier();  // Every worker's values exist, and none is dropped yet.
  const int during = owned_on(owner);
  p.expect(during == kRefs + 1, "the owner holds " + std::to_string(during) + " values, want " +
                                    std::to_string(kRefs + 1));
  world.barrier();  // Every count is taken.
  refs.clear();
  returned.clear();
  from_owner = rpc::RRef();
  made = Message{};
  world.barrier();  // Every worker's handles are gone; the deletes are on their way.
  const int after = wait_until_none_owned(owner);
  p.expect(after == 0, "the owner still holds " + std::to_string(after) + " values");
  return p;
}

Problems shutdown_releases_rrefs_body(RpcWorld& world) {
  Problems p;
  // Values on the other workers only (a group of one: on itself).
  const int others = std::max(1, world.size() - 1);
  std::vector<rpc::RRef> kept;
  for (int i = 0; i < 10; ++i) kept.push_back(rpc::remote(world.peer(1 + i % others), "echo"));
  kept.push_back(
      rpc::rpc_sync(world.peer(2), "return_rrefs", {.tensors = {}, .rrefs = {kept[0]}, .bytes = {}})
          .rrefs.at(0));
  world.leave(true);
  // What this worker owned for others is freed; a group of one owns its ten itself, and the
  // handles in `kept` still hold them.
  const int left = world.owned_rref_count(), expected = world.size() == 1 ? 10 : 0;
  p.expect(left == expected, "owns " + std::to_string(left) + " values after shutdown, want " +
                                 std::to_string(expected));
  p.expect_error(error_of([&] { kept.back().to_here(); }), ErrorCode::ShutDown,
                 "to_here() of a returned fork after shutdown");
  if (world.size() > 1) {
    p.expect_error(error_of([&] { kept.front().to_here(); }), ErrorCode::ShutDown,
                   "to_here() after shutdown");
  }
  return p;
}

}  // namespace

RpcCase rrefs_freed_under_forks() { return {.setup = {}, .body = rrefs_freed_under_forks_body}; }

RpcCase shutdown_releases_rrefs() { return {.setup = {}, .body = shutdown_releases_rrefs_body}; }

}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// Usage: layout_program HOST:SLOTS,...   (the -H list the job was launched with, --map-by slot)
// Checks on every rank that it runs on the host the layout puts it on, and that local_rank,
// local_size, cross_rank, cross_size and is_homogeneous equal their closed forms for that
// layout; prints one line per rank and exits 1 on every rank if any rank disagrees.
#include <tutti/tutti.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Host {
  std::string name;
  int slots = 0;
};

std::vector<Host> parse_hosts(const std::string& text) {
  std::vector<Host> hosts;
  std::istringstream in(text);
  for (std::string entry; std::getline(in, entry, ',');) {
    const std::size_t colon = entry.rfind(':');
    hosts.push_back({entry.substr(0, colon), std::stoi(entry.substr(colon + 1))});
  }
  return hosts;
}

struct Expected {
  std::string host;
  int local_rank = 0, local_size = 0, cross_rank = 0, cross_size = 0;
  bool homogeneous = true;
};

// mpirun --map-by slot fills each host's slots in order: rank r is on the host h whose slots
// cover it, at local rank r - (slots of the hosts before h). Its cross group is the local
// rank `l` of every host with more than l slots, in host order.
Expected expected_for(const std::vector<Host>& hosts, int rank) {
  Expected e;
  int first = 0;
  std::size_t h = 0;
  while (rank >= first + hosts[h].slots) first += hosts[h++].slots;
  e.host = hosts[h].name;
  e.local_rank = rank - first;
  e.local_size = hosts[h].slots;
  for (std::size_t k = 0; k < hosts.size(); ++k) {
    if (hosts[k].slots <= e.local_rank) continue;
    if (k < h) ++e.cross_rank;
    ++e.cross_size;
  }
  for (const Host& host : hosts) e.homogeneous = e.homogeneous && host.slots == hosts[0].slots;
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: layout_program HOST:SLOTS,...\n");
    return 2;
  }
  const std::vector<Host> hosts = parse_hosts(argv[1]);
  tutti::init();
  const int rank = tutti::rank();
  int total = 0;
  for (const Host& host : hosts) total += host.slots;
  const Expected e = expected_for(hosts, rank);
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  const bool ok = tutti::size() == total && e.host == name && tutti::local_rank() == e.local_rank &&
                  tutti::local_size() == e.local_size && tutti::cross_rank() == e.cross_rank &&
                  tutti::cross_size() == e.cross_size && tutti::is_homogeneous() == e.homogeneous;
  std::printf(
      "rank %d on %s: local %d/%d cross %d/%d homogeneous %d; expected %s: local %d/%d cross "
      "%d/%d homogeneous %d: %s\n",
      rank, name, tutti::local_rank(), tutti::local_size(), tutti::cross_rank(),
      tutti::cross_size(), tutti::is_homogeneous() ? 1 : 0, e.host.c_str(), e.local_rank,
      e.local_size, e.cross_rank, e.cross_size, e.homogeneous ? 1 : 0, ok ? "ok" : "WRONG");
  std::fflush(stdout);
  // Every rank learns whether all were right, so that all exit alike.
  std::vector<int> flag = {ok ? 1 : 0};
  tutti::allreduce(tutti::TensorView(flag.data(), {1}), "layout.ok", {.op = tutti::ReduceOp::Min});
  tutti::shutdown();
  return flag[0] == 1 ? 0 : 1;
}

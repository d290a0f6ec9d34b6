// SPDX-License-Identifier: Apache-2.0
#include "src/base/host_cpus.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace tutti::base {
namespace {

std::string_view trimmed(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

// A whole non-negative decimal, or nullopt.
std::optional<std::int64_t> whole_number(std::string_view text) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || at != end || value < 0) return std::nullopt;
  return value;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return in.bad() ? std::nullopt : std::optional<std::string>(text.str());
}

// A cgroup hierarchy this process is in: the directory of its cgroup, and the hierarchy's
// mount point, the last directory whose limits apply that this process can see.
struct Hierarchy {
  bool v2 = false;
  bool cpuset = false;  // v1: the hierarchy has the cpuset controller; v2: always possible.
  bool cpu = false;     // v1: ... the cpu controller.
  std::string mount;    // Under root.
  std::string leaf;     // Under root: mount + the cgroup's path below the mount's root.
};

// One line of /proc/self/mountinfo: "id parent dev root mount options [tags] - type source
// super-options". What a cgroup's directory is found with.
struct Mount {
  std::string root;
  std::string point;
  std::string type;
  std::vector<std::string> super_options;
};

std::vector<Mount> cgroup_mounts(const std::string& mountinfo) {
  std::vector<Mount> mounts;
  std::istringstream lines(mountinfo);
  for (std::string line; std::getline(lines, line);) {
    const std::size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    const std::vector<std::string_view> head = split(std::string_view(line).substr(0, dash), ' ');
    const std::vector<std::string_view> tail = split(std::string_view(line).substr(dash + 3), ' ');
    if (head.size() < 5 || tail.size() < 3) continue;
    if (tail[0] != "cgroup" && tail[0] != "cgroup2") continue;
    Mount mount{.root = std::string(head[3]),
                .point = std::string(head[4]),
                .type = std::string(tail[0]),
                .super_options = {}};
    for (std::string_view option : split(tail[2], ',')) mount.super_options.emplace_back(option);
    mounts.push_back(std::move(mount));
  }
  return mounts;
}

bool has_option(const Mount& mount, std::string_view option) {
  return std::find(mount.super_options.begin(), mount.super_options.end(), option) !=
         mount.super_options.end();
}

// The hierarchies of /proc/self/cgroup's lines ("id:controllers:path") that can limit CPUs.
std::vector<Hierarchy> cpu_hierarchies(const std::string& root) {
  std::vector<Hierarchy> found;
  const std::optional<std::string> cgroup = read_file(root + "/proc/self/cgroup");
  const std::optional<std::string> mountinfo = read_file(root + "/proc/self/mountinfo");
  if (!cgroup || !mountinfo) return found;
  const std::vector<Mount> mounts = cgroup_mounts(*mountinfo);
  std::istringstream lines(*cgroup);
  for (std::string line; std::getline(lines, line);) {
    const std::size_t first = line.find(':');
    const std::size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    const std::vector<std::string_view> names = split(controllers, ',');
    const auto named = [&](std::string_view name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    Hierarchy hierarchy;
    hierarchy.v2 = controllers.empty();
    hierarchy.cpuset = named("cpuset");
    hierarchy.cpu = named("cpu");
    if (!hierarchy.v2 && !hierarchy.cpuset && !hierarchy.cpu) continue;
    for (const Mount& mount : mounts) {
      const bool matches = hierarchy.v2 ? mount.type == "cgroup2"
                                        : mount.type == "cgroup" &&
                                              (!hierarchy.cpuset || has_option(mount, "cpuset")) &&
                                              (!hierarchy.cpu || has_option(mount, "cpu"));
      if (!matches) continue;
      // The cgroup's path is below the mount's root (a container sees its own cgroup as the
      // root of the mount); a path outside it cannot be reached here, so the mount's own
      // directory is the nearest one that applies.
      std::string below;
      if (mount.root == "/") {
        below = path == "/" ? "" : path;
      } else if (path.starts_with(mount.root) &&
                 (path.size() == mount.root.size() || path[mount.root.size()] == '/')) {
        below = path.substr(mount.root.size());
      }
      hierarchy.mount = root + mount.point;
      hierarchy.leaf = hierarchy.mount + below;
      found.push_back(hierarchy);
      break;
    }
  }
  return found;
}

// The directories from `leaf` up to `mount`, both included.
std::vector<std::string> path_up(const Hierarchy& hierarchy) {
  std::vector<std::string> dirs;
  std::string dir = hierarchy.leaf;
  while (true) {
    dirs.push_back(dir);
    if (dir.size() <= hierarchy.mount.size()) return dirs;
    dir.resize(dir.rfind('/'));
  }
}

template <class T>
void keep_smallest(std::optional<T>& kept, std::optional<T> value) {
  if (value && (!kept || *value < *kept)) kept = value;
}

}  // namespace

std::optional<int> count_cpu_list(std::string_view list) {
  list = trimmed(list);
  if (list.empty()) return std::nullopt;
  std::int64_t count = 0;
  for (std::string_view item : split(list, ',')) {
    const std::size_t dash = item.find('-');
    const std::optional<std::int64_t> low = whole_number(item.substr(0, dash));
    const std::optional<std::int64_t> high =
        dash == std::string_view::npos ? low : whole_number(item.substr(dash + 1));
    if (!low || !high || *high < *low || *high >= (1 << 20)) return std::nullopt;
    count += *high - *low + 1;
  }
  return static_cast<int>(std::min<std::int64_t>(count, 1 << 20));
}

std::optional<double> quota_of_cpu_max(std::string_view text) {
  // "QUOTA PERIOD", or "max PERIOD", which is no quota as v1's -1 is.
  const std::vector<std::string_view> fields = split(trimmed(text), ' ');
  return fields.size() == 2 ? quota_of_cfs(fields[0], fields[1]) : std::nullopt;
}

std::optional<double> quota_of_cfs(std::string_view quota_us, std::string_view period_us) {
  const std::optional<std::int64_t> quota = whole_number(trimmed(quota_us));  // -1: none.
  const std::optional<std::int64_t> period = whole_number(trimmed(period_us));
  if (!quota || !period || *quota == 0 || *period == 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

CgroupCpuLimit read_cgroup_cpu_limit(const std::string& root) {
  CgroupCpuLimit limit;
  for (const Hierarchy& hierarchy : cpu_hierarchies(root)) {
    const std::vector<std::string> dirs = path_up(hierarchy);
    if (hierarchy.v2 || hierarchy.cpuset) {
      // The effective set of the nearest cgroup that has one already holds its ancestors'
      // limits; v1's cpuset.cpus where the kernel has no effective_cpus.
      for (const std::string& dir : dirs) {
        std::optional<std::string> list =
            read_file(dir + (hierarchy.v2 ? "/cpuset.cpus.effective" : "/cpuset.effective_cpus"));
        if (!list && !hierarchy.v2) list = read_file(dir + "/cpuset.cpus");
        const std::optional<int> count = list ? count_cpu_list(*list) : std::nullopt;
        if (count) {
          keep_smallest(limit.cpuset, count);
          break;
        }
      }
    }
    if (hierarchy.v2 || hierarchy.cpu) {
      for (const std::string& dir : dirs) {
        if (hierarchy.v2) {
          const std::optional<std::string> max = read_file(dir + "/cpu.max");
          keep_smallest(limit.quota, max ? quota_of_cpu_max(*max) : std::nullopt);
        } else {
          const std::optional<std::string> quota = read_file(dir + "/cpu.cfs_quota_us");
          const std::optional<std::string> period = read_file(dir + "/cpu.cfs_period_us");
          keep_smallest(limit.quota,
                        quota && period ? quota_of_cfs(*quota, *period) : std::nullopt);
        }
      }
    }
  }
  return limit;
}

unsigned host_cpus_within(unsigned online, const CgroupCpuLimit& limit) {
  std::optional<unsigned> cpus;
  if (online > 0) cpus = online;
  if (limit.cpuset && *limit.cpuset > 0)
    keep_smallest(cpus, std::optional<unsigned>(static_cast<unsigned>(*limit.cpuset)));
  if (limit.quota && *limit.quota > 0) {
    const double rounded = std::ceil(*limit.quota);
    keep_smallest(
        cpus, std::optional<unsigned>(rounded >= 1e6 ? 1000000u : static_cast<unsigned>(rounded)));
  }
  return cpus.value_or(0);
}

unsigned host_cpus() {
  return host_cpus_within(std::thread::hardware_concurrency(), read_cgroup_cpu_limit());
}

}  // namespace tutti::base

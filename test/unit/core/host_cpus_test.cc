// SPDX-License-Identifier: Apache-2.0
// host_cpus(): the host's CPUs within this process's cgroup limits (Note [The host's CPUs] in
// src/base/host_cpus.h), from cgroup files laid out as cgroup v1 and v2 kernels and container
// runtimes lay them out, in a directory standing in for /.
#include "src/base/host_cpus.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

namespace tutti::base {
namespace {

namespace fs = std::filesystem;

// A directory standing in for /, removed with the object.
class FakeRoot {
 public:
  FakeRoot() {
    static int made = 0;
    path_ = fs::temp_directory_path() /
            ("tutti_host_cpus_" + std::to_string(getpid()) + "_" + std::to_string(made++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~FakeRoot() { fs::remove_all(path_); }
  FakeRoot(const FakeRoot&) = delete;
  FakeRoot& operator=(const FakeRoot&) = delete;

  // Writes `text` to `relative` (a path without the leading '/'), making its directories.
  void write(const std::string& relative, const std::string& text) const {
    const fs::path file = path_ / relative;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

CgroupCpuLimit limit_of(std::optional<int> cpuset, std::optional<double> quota) {
  return CgroupCpuLimit{.cpuset = cpuset, .quota = quota};
}

// The limit read is `cpuset` CPUs and a quota of `quota` CPUs.
void check_limit(const CgroupCpuLimit& limit, int cpuset, double quota) {
  CHECK(limit.cpuset == cpuset);
  REQUIRE(limit.quota);
  CHECK(*limit.quota == Approx(quota));
}

constexpr const char* kV2Mount = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";

TEST_CASE("cpuset lists count their CPUs", "[host_cpus]") {
  CHECK(count_cpu_list("0-3,8,10-11\n") == 7);
  CHECK(count_cpu_list("5") == 1);
  CHECK(count_cpu_list(" 0-1 \n") == 2);
  CHECK_FALSE(count_cpu_list(""));
  CHECK_FALSE(count_cpu_list("\n"));
  CHECK_FALSE(count_cpu_list("3-1"));
  CHECK_FALSE(count_cpu_list("0-1,"));
  CHECK_FALSE(count_cpu_list("a"));
  CHECK_FALSE(count_cpu_list("-1"));
}

TEST_CASE("CPU quotas are counted in CPUs", "[host_cpus]") {
  CHECK(quota_of_cpu_max("150000 100000\n") == Approx(1.5));
  CHECK(quota_of_cpu_max("50000 100000") == Approx(0.5));
  CHECK_FALSE(quota_of_cpu_max("max 100000\n"));
  CHECK_FALSE(quota_of_cpu_max("0 100000"));
  CHECK_FALSE(quota_of_cpu_max("150000"));
  CHECK(quota_of_cfs("300000\n", "100000\n") == Approx(3.0));
  CHECK_FALSE(quota_of_cfs("-1\n", "100000\n"));
  CHECK_FALSE(quota_of_cfs("300000", "0"));
}

TEST_CASE("The host's CPUs are the smallest of the online CPUs and the limits", "[host_cpus]") {
  CHECK(host_cpus_within(64, limit_of(2, {})) == 2);
  CHECK(host_cpus_within(64, limit_of({}, 1.5)) == 2);  // Both CPUs, half the time.
  CHECK(host_cpus_within(64, limit_of({}, 0.25)) == 1);
  CHECK(host_cpus_within(16, limit_of(4, 2.2)) == 3);
  CHECK(host_cpus_within(2, limit_of(8, {})) == 2);
  CHECK(host_cpus_within(8, limit_of({}, {})) == 8);
  CHECK(host_cpus_within(0, limit_of(4, {})) == 4);
  CHECK(host_cpus_within(0, limit_of({}, {})) == 0);
}

TEST_CASE("cgroup v2 in a container: its own cgroup is the mount's root", "[host_cpus]") {
  FakeRoot root;
  root.write("proc/self/cgroup", "0::/\n");
  root.write("proc/self/mountinfo", kV2Mount);
  root.write("sys/fs/cgroup/cpuset.cpus.effective", "0-1\n");
  root.write("sys/fs/cgroup/cpu.max", "150000 100000\n");
  const CgroupCpuLimit limit = read_cgroup_cpu_limit(root.path());
  check_limit(limit, 2, 1.5);
}

TEST_CASE("cgroup v2 nested: the nearest cpuset, the smallest quota on the way up", "[host_cpus]") {
  FakeRoot root;
  root.write("proc/self/cgroup", "0::/job/step/rank\n");
  root.write("proc/self/mountinfo", kV2Mount);
  root.write("sys/fs/cgroup/cpuset.cpus.effective", "0-63\n");
  root.write("sys/fs/cgroup/job/step/cpuset.cpus.effective", "4-7\n");
  root.write("sys/fs/cgroup/job/step/rank/cpu.max", "max 100000\n");
  root.write("sys/fs/cgroup/job/step/cpu.max", "400000 100000\n");
  root.write("sys/fs/cgroup/job/cpu.max", "200000 100000\n");
  const CgroupCpuLimit limit = read_cgroup_cpu_limit(root.path());
  check_limit(limit, 4, 2.0);
}

TEST_CASE("cgroup v1 as a container without a cgroup namespace sees it", "[host_cpus]") {
  FakeRoot root;
  root.write("proc/self/cgroup",
             "5:memory:/docker/abc\n4:cpuset:/docker/abc\n3:cpu,cpuacct:/docker/abc\n"
             "1:name=systemd:/docker/abc\n0::/\n");
  root.write("proc/self/mountinfo",
             "40 30 0:33 /docker/abc /sys/fs/cgroup/cpuset ro - cgroup cgroup rw,cpuset\n"
             "41 30 0:34 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup "
             "rw,cpu,cpuacct\n"
             "42 30 0:35 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n");
  root.write("sys/fs/cgroup/cpuset/cpuset.effective_cpus", "2-3\n");
  root.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "300000\n");
  root.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const CgroupCpuLimit limit = read_cgroup_cpu_limit(root.path());
  check_limit(limit, 2, 3.0);
  CHECK(host_cpus_within(64, limit) == 2);
}

TEST_CASE("cgroup v1 on a host: cpuset.cpus where there is no effective list, no quota",
          "[host_cpus]") {
  FakeRoot root;
  root.write("proc/self/cgroup", "4:cpuset:/slurm/job1\n3:cpu,cpuacct:/\n");
  root.write("proc/self/mountinfo",
             "40 30 0:33 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
             "41 30 0:34 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n");
  root.write("sys/fs/cgroup/cpuset/cpuset.cpus", "0-31\n");
  root.write("sys/fs/cgroup/cpuset/slurm/job1/cpuset.cpus", "0,2,4\n");
  root.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  root.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const CgroupCpuLimit limit = read_cgroup_cpu_limit(root.path());
  CHECK(limit.cpuset == 3);
  CHECK_FALSE(limit.quota);
}

TEST_CASE("Without cgroup files nothing is limited", "[host_cpus]") {
  FakeRoot root;
  CgroupCpuLimit limit = read_cgroup_cpu_limit(root.path());
  CHECK_FALSE(limit.cpuset);
  CHECK_FALSE(limit.quota);
  // A hybrid host: cgroup v2 mounted without controllers, v1's cpuset at the root's set.
  root.write("proc/self/cgroup", "4:cpuset:/\n0::/\n");
  root.write("proc/self/mountinfo",
             "40 30 0:33 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
             "44 30 0:36 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  root.write("sys/fs/cgroup/cpuset/cpuset.effective_cpus", "0-1\n");
  limit = read_cgroup_cpu_limit(root.path());
  CHECK(limit.cpuset == 2);
  CHECK_FALSE(limit.quota);
  CHECK(host_cpus_within(2, limit) == 2);
}

TEST_CASE("This machine's CPUs are within its online CPUs", "[host_cpus]") {
  const unsigned online = std::thread::hardware_concurrency();
  const unsigned cpus = host_cpus();
  CHECK(cpus >= 1);
  if (online > 0) CHECK(cpus <= online);
}

}  // namespace
}  // namespace tutti::base

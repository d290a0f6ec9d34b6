// SPDX-License-Identifier: Apache-2.0
// Usage: host_cpus_program
// Prints what a session decided about this host's CPUs, for host_cpus_test.py:
// "host_cpus_program: local_size=N cores_shared=0|1 default_gradient_groups=0|1".
#include <tutti/tutti.h>

#include <cstdio>

int main() {
  tutti::init();
  std::printf("host_cpus_program: local_size=%d cores_shared=%d default_gradient_groups=%d\n",
              tutti::local_size(), tutti::cores_shared() ? 1 : 0, tutti::default_gradient_groups());
  tutti::shutdown();
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// See Note [SIGPIPE while a session runs] in sigpipe_guard.h.
#include "src/core/sigpipe_guard.h"

#include <csignal>

#include "src/common/mutex.h"

namespace tutti::core {
namespace {

struct Holders {
  detail::Mutex mutex;
  int count TUTTI_GUARDED_BY(mutex) = 0;
  // The first guard turned the default action into "ignore": the last one restores it.
  bool changed TUTTI_GUARDED_BY(mutex) = false;
};

Holders& holders() {
  static Holders* const instance = new Holders();  // Never destroyed: guards may outlive main().
  return *instance;
}

// Reads SIGPIPE's current action; false if it cannot.
bool read_action(struct sigaction* action) { return sigaction(SIGPIPE, nullptr, action) == 0; }

void set_handler(void (*handler)(int)) {
  struct sigaction action = {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  sigaction(SIGPIPE, &action, nullptr);
}

}  // namespace

SigpipeGuard::SigpipeGuard() {
  Holders& h = holders();
  detail::MutexLock lock(h.mutex);
  if (h.count++ > 0) return;
  struct sigaction current = {};
  if (!read_action(&current) || current.sa_handler != SIG_DFL) return;
  set_handler(SIG_IGN);
  h.changed = true;
}

SigpipeGuard::~SigpipeGuard() {
  Holders& h = holders();
  detail::MutexLock lock(h.mutex);
  if (--h.count > 0 || !h.changed) return;
  h.changed = false;
  struct sigaction current = {};
  // Left alone if the application has set an action of its own since.
  if (read_action(&current) && current.sa_handler == SIG_IGN) set_handler(SIG_DFL);
}

}  // namespace tutti::core

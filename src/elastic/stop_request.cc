// SPDX-License-Identifier: Apache-2.0
// SIGUSR2 as a stop request: see stop_request.h.
#include "src/elastic/stop_request.h"

#include <signal.h>

#include <atomic>
#include <mutex>

namespace tutti::elastic::internal {
namespace {

// A signal can only reach the program through process-wide state, so these two are the
// elastic layer's only globals. The flag is lock-free, hence safe to set from the handler.
std::atomic<bool> g_stop_requested{false};
struct sigaction g_previous = {};

void on_stop_signal(int signal, siginfo_t* info, void* context) {
  g_stop_requested.store(true);
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(signal, info, context);
  } else if ((g_previous.sa_flags & SA_SIGINFO) == 0 && g_previous.sa_handler != SIG_DFL &&
             g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(signal);
  }
}

}  // namespace

void install_stop_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action = {};
    action.sa_sigaction = &on_stop_signal;
    // SA_RESTART: a system call that the signal interrupts (in MPI, in the loop's I/O) goes
    // on rather than failing with EINTR.
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR2, &action, &g_previous);
  });
}

bool stop_requested() { return g_stop_requested.load(); }

void clear_stop_request() { g_stop_requested.store(false); }

}  // namespace tutti::elastic::internal

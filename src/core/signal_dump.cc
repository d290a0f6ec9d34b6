// SPDX-License-Identifier: Apache-2.0
// See Note [Dump on SIGUSR1] in signal_dump.h.
#include "src/core/signal_dump.h"

#include <pthread.h>
#include <semaphore.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <mutex>

#include "src/common/logging.h"

namespace tutti::core {
namespace {

// Posted by the handler (sem_post is async-signal-safe; std::call_once, which initializes it, is
// not, so the handler reaches it directly: it is installed only after dump_requests() ran).
sem_t requests_semaphore;

sem_t& dump_requests() {
  static std::once_flag once;
  std::call_once(once, [] { sem_init(&requests_semaphore, 0, 0); });
  return requests_semaphore;
}

volatile std::sig_atomic_t terminating = 0;  // SIGTERM arrived: dump, then end.

// How long a rank that dumped on SIGTERM lives on before it ends (Note [Dump on SIGUSR1]).
constexpr std::chrono::milliseconds kSigtermLinger(250);

extern "C" void request_dump(int signal) {
  const int saved = errno;  // A handler must leave errno as it found it.
  if (signal == SIGTERM) terminating = 1;
  sem_post(&requests_semaphore);
  errno = saved;
}

// Installs request_dump for `signal` where it has its default action; whether it did.
bool install(int signal) {
  struct sigaction current = {};
  if (sigaction(signal, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) {
    TUTTI_LOG_INFO(strsignal(signal),
                   " has a handler of the application's: it does not dump "
                   "the flight recorder (tutti::debug::dump_flight_recorder() does)");
    return false;
  }
  struct sigaction action = {};
  action.sa_handler = request_dump;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (sigaction(signal, &action, nullptr) != 0) {
    TUTTI_LOG_WARNING("could not install the ", strsignal(signal),
                      " handler that dumps the flight recorder");
    return false;
  }
  return true;
}

void restore_default(int signal) {
  struct sigaction action = {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
}

// Restores the default for `signal` only while request_dump is still its handler: one the
// application installed after init() stays (the promise in signal_dump.h; resetting it would let
// a later signal end the process the application meant to handle it in).
void restore_default_if_ours(int signal) {
  struct sigaction current = {};
  if (sigaction(signal, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != request_dump) return;
  restore_default(signal);
}

}  // namespace

SignalDumper::SignalDumper(FlightRecorder& recorder) : recorder_(recorder) {
  sem_t& requests = dump_requests();  // Initialized before a handler can run.
  while (sem_trywait(&requests) == 0) {
  }  // Requests left from an earlier session's signals.
  usr1_installed_ = install(SIGUSR1);
  term_installed_ = install(SIGTERM);
  if (usr1_installed_ || term_installed_) thread_ = std::thread([this] { run(); });
}

SignalDumper::~SignalDumper() {
  if (usr1_installed_) restore_default_if_ours(SIGUSR1);
  if (term_installed_) restore_default_if_ours(SIGTERM);
  if (!thread_.joinable()) return;
  stopping_.store(true);
  while (!finished_.load()) {
    sem_post(&dump_requests());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  thread_.join();
}

void SignalDumper::run() {
  pthread_setname_np(pthread_self(), "tutti-sigdump");
  sem_t& requests = dump_requests();
  for (;;) {
    while (sem_wait(&requests) != 0) {
    }  // EINTR: a signal arrived while waiting; wait again.
    const bool terminate = terminating != 0;
    if (stopping_.load() && !terminate) {
      finished_.store(true);
      return;
    }
    const char* why = terminate ? "SIGTERM" : "SIGUSR1";
    const std::string path = recorder_.signal_dump_path(why);
    const Status dumped = recorder_.dump(path, why);
    if (dumped.ok() && path != recorder_.default_path())
      TUTTI_LOG_WARNING(why, ": flight recorder dumped to ", path, "; ", recorder_.default_path(),
                        " keeps the dump of the error that stopped the runtime");
    else if (dumped.ok())
      TUTTI_LOG_WARNING(why, ": flight recorder dumped to ", path);
    else
      TUTTI_LOG_ERROR(why, ": ", dumped.message());
    if (terminate) {
      // Ends the process as the first SIGTERM would have, once the host's other ranks have
      // had time to dump too (Note [Dump on SIGUSR1]).
      std::this_thread::sleep_for(kSigtermLinger);
      restore_default(SIGTERM);
      raise(SIGTERM);
    }
  }
}

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// SigpipeGuard: SIGPIPE ignored while a session runs, where it had its default action (Note
// [SIGPIPE while a session runs] in sigpipe_guard.h). The unit test runs no session, so SIGPIPE
// starts at its default here; each case puts back what it found.
#include "src/core/sigpipe_guard.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <optional>

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

using Handler = void (*)(int);

Handler sigpipe_handler() {
  struct sigaction current = {};
  REQUIRE(sigaction(SIGPIPE, nullptr, &current) == 0);
  return current.sa_handler;
}

void set_sigpipe_handler(Handler handler) {
  struct sigaction action = {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  REQUIRE(sigaction(SIGPIPE, &action, nullptr) == 0);
}

// A write to a pipe whose reading end is closed: -1 and errno, in a process that survives it.
int write_to_broken_pipe() {
  int ends[2];
  REQUIRE(pipe(ends) == 0);
  close(ends[0]);
  const char byte = 'x';
  errno = 0;
  const ssize_t written = write(ends[1], &byte, 1);
  const int error = errno;
  close(ends[1]);
  REQUIRE(written == -1);
  return error;
}

void on_sigpipe(int) {}

TEST_CASE("SigpipeGuard ignores SIGPIPE while it lives, then restores the default", "[sigpipe]") {
  REQUIRE(sigpipe_handler() == SIG_DFL);
  {
    SigpipeGuard guard;
    CHECK(sigpipe_handler() == SIG_IGN);
    // What a TCP transport's write to a dead peer sees: an error, not the end of the process.
    CHECK(write_to_broken_pipe() == EPIPE);
  }
  CHECK(sigpipe_handler() == SIG_DFL);
}

TEST_CASE("Nested guards: the last one to go restores the default", "[sigpipe]") {
  REQUIRE(sigpipe_handler() == SIG_DFL);
  std::optional<SigpipeGuard> first(std::in_place);
  {
    SigpipeGuard second;  // A second session in the same process.
    CHECK(sigpipe_handler() == SIG_IGN);
  }
  CHECK(sigpipe_handler() == SIG_IGN);  // The first session still runs.
  first.reset();
  CHECK(sigpipe_handler() == SIG_DFL);
}

TEST_CASE("SigpipeGuard leaves an application's own SIGPIPE handling alone", "[sigpipe]") {
  REQUIRE(sigpipe_handler() == SIG_DFL);
  SECTION("a handler of its own") {
    set_sigpipe_handler(on_sigpipe);
    {
      SigpipeGuard guard;
      CHECK(sigpipe_handler() == on_sigpipe);
    }
    CHECK(sigpipe_handler() == on_sigpipe);
  }
  SECTION("ignored already") {
    set_sigpipe_handler(SIG_IGN);
    { SigpipeGuard guard; }
    CHECK(sigpipe_handler() == SIG_IGN);  // Not turned into the default on the way out.
  }
  SECTION("set by the application while the guard lived") {
    {
      SigpipeGuard guard;
      set_sigpipe_handler(on_sigpipe);
    }
    CHECK(sigpipe_handler() == on_sigpipe);
  }
  set_sigpipe_handler(SIG_DFL);
}

}  // namespace
}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// SignalDumper: SIGUSR1 and SIGTERM dump only where they had their default action, and the
// session's end gives back the default only where Tutti's handler is still the one installed
// (Note [Dump on SIGUSR1] in signal_dump.h). The unit test runs no session; Catch2 handles
// SIGTERM itself, so each case gives both signals their default first (WithDefaults) and puts
// back what it found.
#include "src/core/signal_dump.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

using Handler = void (*)(int);

Handler handler_of(int signal) {
  struct sigaction current = {};
  REQUIRE(sigaction(signal, nullptr, &current) == 0);
  return current.sa_handler;
}

void set_handler(int signal, Handler handler) {
  struct sigaction action = {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  REQUIRE(sigaction(signal, &action, nullptr) == 0);
}

// SIGUSR1 and SIGTERM at their default action while it lives, as in a program before init().
class WithDefaults {
 public:
  WithDefaults() {
    for (int i = 0; i < 2; ++i) {
      REQUIRE(sigaction(kSignals[i], nullptr, &saved_[i]) == 0);
      set_handler(kSignals[i], SIG_DFL);
    }
  }
  ~WithDefaults() {
    for (int i = 0; i < 2; ++i) sigaction(kSignals[i], &saved_[i], nullptr);
  }
  WithDefaults(const WithDefaults&) = delete;
  WithDefaults& operator=(const WithDefaults&) = delete;

 private:
  static constexpr int kSignals[2] = {SIGUSR1, SIGTERM};
  struct sigaction saved_[2] = {};
};

volatile std::sig_atomic_t last_signal = 0;
void on_signal(int signal) { last_signal = signal; }

std::string file_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits up to 10 s for `path` (a dump appears whole: it is renamed into place).
bool appears(const std::filesystem::path& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return std::filesystem::exists(path);
}

// A recorder of rank 1 whose runtime stopped on a stall and dumped for it, as
// Session::dump_after_error does, into a fresh folder.
struct AfterAStall {
  explicit AfterAStall(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / (name + std::to_string(getpid()))) {
    std::filesystem::remove_all(dir);
    recorder.set_context({.job = "j", .rank = 1, .size = 2, .dir = dir.string()});
    REQUIRE(recorder.dump(recorder.error_dump_path(), "Stalled: rank 0 never submitted").ok());
  }
  ~AfterAStall() { std::filesystem::remove_all(dir); }
  std::filesystem::path dir;
  FlightRecorder recorder{4};
};

TEST_CASE("SignalDumper installs its handlers where the default was, and restores it",
          "[signal_dump]") {
  const WithDefaults defaults;
  REQUIRE(handler_of(SIGUSR1) == SIG_DFL);
  REQUIRE(handler_of(SIGTERM) == SIG_DFL);
  FlightRecorder recorder(4);
  {
    SignalDumper dumper(recorder);
    CHECK(dumper.installed());
    CHECK(handler_of(SIGUSR1) != SIG_DFL);
    CHECK(handler_of(SIGTERM) != SIG_DFL);
  }
  CHECK(handler_of(SIGUSR1) == SIG_DFL);
  CHECK(handler_of(SIGTERM) == SIG_DFL);
}

TEST_CASE("A handler the application installs while the dumper lives is left installed",
          "[signal_dump]") {
  const WithDefaults defaults;
  // An application that handles SIGTERM (a graceful stop) and SIGUSR1 itself, set up after
  // init(): shutdown() must not turn them back into the default, which ends the process.
  REQUIRE(handler_of(SIGUSR1) == SIG_DFL);
  REQUIRE(handler_of(SIGTERM) == SIG_DFL);
  FlightRecorder recorder(4);
  {
    SignalDumper dumper(recorder);
    REQUIRE(dumper.installed());
    set_handler(SIGUSR1, on_signal);
    set_handler(SIGTERM, on_signal);
  }
  CHECK(handler_of(SIGUSR1) == on_signal);
  CHECK(handler_of(SIGTERM) == on_signal);
  last_signal = 0;
  REQUIRE(raise(SIGUSR1) == 0);  // Handled synchronously: raise() returns after the handler.
  CHECK(last_signal == SIGUSR1);
  REQUIRE(raise(SIGTERM) == 0);
  CHECK(last_signal == SIGTERM);
  set_handler(SIGUSR1, SIG_DFL);
  set_handler(SIGTERM, SIG_DFL);
}

TEST_CASE("A handler the application had before is neither replaced nor reset", "[signal_dump]") {
  const WithDefaults defaults;
  REQUIRE(handler_of(SIGUSR1) == SIG_DFL);
  set_handler(SIGUSR1, on_signal);
  FlightRecorder recorder(4);
  {
    SignalDumper dumper(recorder);
    CHECK_FALSE(dumper.installed());
    CHECK(handler_of(SIGUSR1) == on_signal);
  }
  CHECK(handler_of(SIGUSR1) == on_signal);
  CHECK(handler_of(SIGTERM) == SIG_DFL);  // Installed and restored: it had the default.
  set_handler(SIGUSR1, SIG_DFL);
}

TEST_CASE("After an error's dump, SIGUSR1 dumps beside it", "[signal_dump]") {
  const WithDefaults defaults;
  REQUIRE(handler_of(SIGUSR1) == SIG_DFL);
  AfterAStall stalled("tutti_sigdump_usr1_");
  {
    SignalDumper dumper(stalled.recorder);
    REQUIRE(dumper.installed());
    REQUIRE(raise(SIGUSR1) == 0);
    CHECK(appears(stalled.dir / "rank1.SIGUSR1.json"));
  }
  CHECK_THAT(file_text(stalled.dir / "rank1.SIGUSR1.json"),
             Catch::Contains("\"reason\": \"SIGUSR1\""));
  CHECK_THAT(file_text(stalled.dir / "rank1.json"),
             Catch::Contains("\"reason\": \"Stalled: rank 0 never submitted\""));
}

TEST_CASE("After an error's dump, SIGTERM dumps beside it and still ends the process",
          "[signal_dump]") {
  const WithDefaults defaults;
  // What a stuck rank sees: its stall dump is written, then a peer's MPI_Abort has mpirun send
  // it SIGTERM. SIGTERM ends the process, so a child takes it.
  REQUIRE(handler_of(SIGTERM) == SIG_DFL);
  AfterAStall stalled("tutti_sigdump_term_");
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    SignalDumper dumper(stalled.recorder);
    raise(SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(10));  // Ended long before.
    _exit(3);
  }
  int status = 0;
  pid_t ended = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((ended = waitpid(child, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (ended == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  REQUIRE(ended == child);
  CHECK(WIFSIGNALED(status));
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM));
  CHECK_THAT(file_text(stalled.dir / "rank1.SIGTERM.json"),
             Catch::Contains("\"reason\": \"SIGTERM\""));
  CHECK_THAT(file_text(stalled.dir / "rank1.json"),
             Catch::Contains("\"reason\": \"Stalled: rank 0 never submitted\""));
}

}  // namespace
}  // namespace tutti::core

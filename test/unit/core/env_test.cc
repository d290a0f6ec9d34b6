// SPDX-License-Identifier: Apache-2.0
#include "src/common/env.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "src/core/config.h"

namespace tutti::detail {
namespace {

// Sets a variable for the scope of a test.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

TEST_CASE("TUTTI_ wins over HOROVOD_, which is the fallback", "[env]") {
  {
    ScopedEnv horovod("HOROVOD_CACHE_CAPACITY", "5");
    CHECK(knob_value(knob::CACHE_CAPACITY).value() == 5);
    ScopedEnv tutti("TUTTI_CACHE_CAPACITY", "6");
    CHECK(knob_value(knob::CACHE_CAPACITY).value() == 6);
  }
  CHECK(knob_value(knob::CACHE_CAPACITY).value() == knob_default(knob::CACHE_CAPACITY));
  CHECK(knob_default(knob::CACHE_CAPACITY) == 1024);  // knobs.def's default.
}

// What `f` writes to stderr (the log's file descriptor 2), through a temporary file.
template <class F>
std::string stderr_of(F&& f) {
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(::fileno(file), STDERR_FILENO);
  f();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::rewind(file);
  std::string text;
  for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) text += static_cast<char>(c);
  std::fclose(file);
  return text;
}

TEST_CASE("A TUTTI_ value overriding another HOROVOD_ value is warned about once", "[env]") {
  // Before, every lookup warned: three times per rank per init().
  ScopedEnv horovod("HOROVOD_CYCLE_TIME", "3");
  ScopedEnv tutti("TUTTI_CYCLE_TIME", "2.25");
  const std::string log = stderr_of([] {
    CHECK(core::Config::from_env().ok());
    CHECK(core::Config::from_env().ok());
  });
  const std::string warning = "TUTTI_CYCLE_TIME='2.25' overrides HOROVOD_CYCLE_TIME='3'";
  const std::size_t first = log.find(warning);
  CHECK(first != std::string::npos);
  CHECK(log.find(warning, first + 1) == std::string::npos);
}

TEST_CASE("Malformed values name the variable", "[env]") {
  ScopedEnv bad("TUTTI_CYCLE_TIME", "12x");
  Result<double> cycle = knob_value(knob::CYCLE_TIME);
  REQUIRE_FALSE(cycle.ok());
  CHECK(cycle.status().code() == ErrorCode::InvalidArgument);
  CHECK(cycle.status().message() ==
        "TUTTI_CYCLE_TIME='12x' is not a number: must be a number in [0, 10000]");
  ScopedEnv flag("HOROVOD_TIMELINE_MARK_CYCLES", "maybe");
  CHECK(knob_value(knob::TIMELINE_MARK_CYCLES)
            .status()
            .message()
            .find("HOROVOD_TIMELINE_MARK_CYCLES") == 0);
}

TEST_CASE("Config::from_env parses every knob and rejects out-of-range values", "[env]") {
  {
    ScopedEnv threshold("TUTTI_FUSION_THRESHOLD", "1048576");
    ScopedEnv cycle("TUTTI_CYCLE_TIME", "2.5");
    ScopedEnv stall("TUTTI_STALL_SHUTDOWN_TIME_SECONDS", "0");
    Result<core::Config> config = core::Config::from_env();
    REQUIRE(config.ok());
    CHECK(config.value().fusion_threshold_bytes == 1048576);
    CHECK(config.value().cycle_time == std::chrono::microseconds(2500));
    CHECK(config.value().cycle_time_set);  // Autotune then measures it as a candidate.
    CHECK(config.value().fusion_threshold_set);
    CHECK(config.value().stall_shutdown_time.count() == 0);
    // Unset, the response cache may grow (Note [Cache growth]); set, even to its default, not.
    CHECK_FALSE(config.value().cache_capacity_set);
    ScopedEnv capacity("HOROVOD_CACHE_CAPACITY", "1024");
    Result<core::Config> fixed = core::Config::from_env();
    REQUIRE(fixed.ok());
    CHECK(fixed.value().cache_capacity == 1024);
    CHECK(fixed.value().cache_capacity_set);
  }
  ScopedEnv negative("TUTTI_FUSION_THRESHOLD", "-1");
  Result<core::Config> config = core::Config::from_env();
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("TUTTI_FUSION_THRESHOLD") != std::string_view::npos);
  ScopedEnv level("TUTTI_LOG_LEVEL", "LOUD");
  CHECK_FALSE(core::Config::from_env().ok());
}

TEST_CASE("A flight recorder the process could not hold is refused by name", "[env]") {
  // 10^8 ops (the old maximum) is some 22 GB of ring: init() threw std::bad_alloc, not an Error.
  {
    ScopedEnv size("TUTTI_FLIGHT_RECORDER_SIZE", "1000000");
    CHECK(core::Config::from_env().ok());
  }
  ScopedEnv size("TUTTI_FLIGHT_RECORDER_SIZE", "100000000");
  Result<core::Config> config = core::Config::from_env();
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == ErrorCode::InvalidArgument);
  CHECK_THAT(std::string(config.status().message()), Catch::Contains("TUTTI_FLIGHT_RECORDER_SIZE"));
}

TEST_CASE("Values that overflow or are not numbers are refused by name", "[env]") {
  // The values hostile probes got through init() before knobs had ranges (issue 11, defect 5).
  const char* cases[][2] = {
      {"STALL_CHECK_TIME_SECONDS", "inf"},
      {"CYCLE_TIME", "inf"},
      {"CYCLE_TIME", "1e300"},
      {"CYCLE_TIME", "nan"},
      {"STALL_SHUTDOWN_TIME_SECONDS", "inf"},
      {"STALL_SHUTDOWN_TIME_SECONDS", "1e300"},
      {"THREAD_AFFINITY", "abc"},
      {"START_TIMEOUT", "abc"},
      {"AUTOTUNE_WARMUP_SAMPLES", "abc"},
      {"FUSION_THRESHOLD", "9000000000000000000000"},
      {"EXIT_GRACE_SECONDS", "0"},
  };
  for (const auto& [knob, value] : cases) {
    const std::string variable = std::string("TUTTI_") + knob;
    ScopedEnv env(variable.c_str(), value);
    Result<core::Config> config = core::Config::from_env();
    INFO(variable << "=" << value);
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().code() == ErrorCode::InvalidArgument);
    CHECK(config.status().message().find(variable) != std::string_view::npos);
  }
}

TEST_CASE("Numbers are plain decimals: no spaces, '+', hexadecimal or underflow", "[env]") {
  // strtoll()/strtod() took these (" 5" as 5, "0x10" as 16 ms, "1e-400" as 0) while trailing
  // spaces and the elastic layer's parser refused them.
  const char* cases[][3] = {
      {"FUSION_THRESHOLD", " 5", "is not an integer"},
      {"FUSION_THRESHOLD", "+5", "is not an integer"},
      {"FUSION_THRESHOLD", "5 ", "is not an integer"},
      {"CYCLE_TIME", "0x10", "is not a number"},
      {"CYCLE_TIME", " 1", "is not a number"},
      {"CYCLE_TIME", "1e-400", "is not a number"},
      {"STALL_CHECK_TIME_SECONDS", "inf", "is not a number"},
      {"TIMELINE_MARK_CYCLES", "", "is not a boolean"},
      {"HIERARCHICAL_ALLREDUCE", "", "is not auto, 1 (on) or 0 (off)"},
  };
  for (const auto& [knob, value, why] : cases) {
    const std::string variable = std::string("TUTTI_") + knob;
    ScopedEnv env(variable.c_str(), value);
    Result<core::Config> config = core::Config::from_env();
    INFO(variable << "='" << value << "'");
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().message().find(variable + "='" + value + "' " + why) == 0);
  }
  ScopedEnv fine("TUTTI_CYCLE_TIME", "-0.0");
  CHECK(core::Config::from_env().ok());
  // An integer knob takes an integer written with an exponent, and nothing that is not one.
  {
    ScopedEnv exponent("TUTTI_FUSION_THRESHOLD", "1e6");
    CHECK(core::Config::from_env().value().fusion_threshold_bytes == 1000000);
  }
  for (const char* value : {"1.5", "1e-3", "1e16", "inf"}) {
    ScopedEnv bad("TUTTI_FUSION_THRESHOLD", value);
    Result<core::Config> config = core::Config::from_env();
    INFO("TUTTI_FUSION_THRESHOLD='" << value << "'");
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().message().find("TUTTI_FUSION_THRESHOLD='" + std::string(value) +
                                         "' is ") == 0);
  }
  CHECK(core::Config::from_env().ok());
  ScopedEnv small("TUTTI_STALL_CHECK_TIME_SECONDS", ".5e-2");
  CHECK(core::Config::from_env().value().stall_check_time == std::chrono::milliseconds(5));
  // Under a millisecond is one, not 0: a stall shutdown time of 0 means never.
  ScopedEnv tiny("TUTTI_STALL_SHUTDOWN_TIME_SECONDS", "0.0004");
  CHECK(core::Config::from_env().value().stall_shutdown_time == std::chrono::milliseconds(1));
}

TEST_CASE("Knobs of absent features and elastic knobs fail init(), not later", "[env]") {
  {
    // This unit build has no CUDA, and no simulated device is installed here.
    ScopedEnv streams("TUTTI_NUM_NCCL_STREAMS", "2");
    Result<core::Config> config = core::Config::from_env();
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().message().find("TUTTI_NUM_NCCL_STREAMS='2' sets GPU streams, but this "
                                         "build has no CUDA") == 0);
  }
  {
    ScopedEnv dir("TUTTI_ELASTIC_DIR", "/tmp/commits");
    ScopedEnv keep("TUTTI_ELASTIC_KEEP", "two");
    Result<core::Config> config = core::Config::from_env();
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().message() ==
          "TUTTI_ELASTIC_KEEP='two' is not an integer: must be an integer in [1, 1000000]");
    ScopedEnv three("TUTTI_ELASTIC_KEEP", "3");
    CHECK(core::Config::from_env().ok());
  }
  ScopedEnv keep("HOROVOD_ELASTIC_KEEP", "3");  // Without TUTTI_ELASTIC_DIR.
  Result<core::Config> config = core::Config::from_env();
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message() ==
        "HOROVOD_ELASTIC_KEEP='3' needs TUTTI_ELASTIC_DIR (the directory whose commits it counts)");
}

TEST_CASE("TUTTI_AUTOTUNE and its settings are parsed, or refused rather than ignored",
          "[env][autotune]") {
  {
    ScopedEnv on("TUTTI_AUTOTUNE", "1");
    ScopedEnv log("TUTTI_AUTOTUNE_LOG", "/tmp/at.csv");
    ScopedEnv steps("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "4");
    ScopedEnv samples("TUTTI_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "17");
    Result<core::Config> config = core::Config::from_env();
    REQUIRE(config.ok());
    CHECK(config.value().autotune);
    CHECK(config.value().autotune_log == "/tmp/at.csv");
    CHECK(config.value().autotune_steps_per_sample == 4);
    CHECK(config.value().autotune_max_samples == 17);
    CHECK(config.value().autotune_warmup_samples == 3);  // knobs.def's default.
    CHECK_FALSE(config.value().fusion_threshold_set);
    ScopedEnv threshold("TUTTI_FUSION_THRESHOLD", "3000000");
    CHECK(core::Config::from_env().value().fusion_threshold_set);
  }
  {
    ScopedEnv log("TUTTI_AUTOTUNE_LOG", "/tmp/at.csv");  // Without TUTTI_AUTOTUNE=1.
    Result<core::Config> config = core::Config::from_env();
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().message() == "TUTTI_AUTOTUNE_LOG='/tmp/at.csv' needs TUTTI_AUTOTUNE=1");
  }
  ScopedEnv on("TUTTI_AUTOTUNE", "1");
  ScopedEnv noise("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.8");
  Result<core::Config> config = core::Config::from_env();
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == ErrorCode::InvalidArgument);
  CHECK(config.status().message().find("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE='0.8' is not "
                                       "used") == 0);
}

TEST_CASE("Settings that would be ignored beside another are refused", "[env]") {
  {
    ScopedEnv marks("TUTTI_TIMELINE_MARK_CYCLES", "1");  // Without TUTTI_TIMELINE.
    Result<core::Config> config = core::Config::from_env();
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().code() == ErrorCode::InvalidArgument);
    CHECK(
        config.status().message() ==
        "TUTTI_TIMELINE_MARK_CYCLES='1' needs TUTTI_TIMELINE (the timeline file the marks go to)");
    ScopedEnv timeline("TUTTI_TIMELINE", "/tmp/timeline.json");
    CHECK(core::Config::from_env().value().timeline_mark_cycles);
  }
  ScopedEnv off("TUTTI_STALL_CHECK_DISABLE", "1");
  CHECK(core::Config::from_env().value().stall_check_disabled);
  for (const char* limit :
       {"TUTTI_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"}) {
    CAPTURE(limit);
    ScopedEnv set(limit, "3");
    Result<core::Config> config = core::Config::from_env();
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().message() ==
          std::string(limit) +
              "='3' is a limit of the stall inspector, which "
              "TUTTI_STALL_CHECK_DISABLE=1 turns off: unset one of them");
  }
}

TEST_CASE("TUTTI_DEBUG=DETAIL turns the desync check on and the response cache off", "[env]") {
  CHECK_FALSE(core::Config::from_env().value().desync_check);  // OFF by default.
  {
    ScopedEnv detail("TUTTI_DEBUG", "DETAIL");
    Result<core::Config> config = core::Config::from_env();
    REQUIRE(config.ok());
    CHECK(config.value().desync_check);
    CHECK(config.value().cache_capacity == 0);
    ScopedEnv cache_off("TUTTI_CACHE_CAPACITY", "0");  // Saying the same is fine.
    CHECK(core::Config::from_env().ok());
  }
  {
    ScopedEnv detail("TUTTI_DEBUG", "DETAIL");
    ScopedEnv cache("TUTTI_CACHE_CAPACITY", "64");
    Result<core::Config> config = core::Config::from_env();
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().message().find("TUTTI_CACHE_CAPACITY='64' cannot be used with "
                                         "TUTTI_DEBUG=DETAIL") == 0);
  }
  {
    // Messages name the setting as given (before, always "TUTTI_DEBUG=DETAIL").
    ScopedEnv detail("HOROVOD_DEBUG", "detail");
    Result<core::Config> config = core::Config::from_env();
    REQUIRE(config.ok());
    CHECK(config.value().desync_setting == "HOROVOD_DEBUG=detail");
    ScopedEnv cache("HOROVOD_CACHE_CAPACITY", "64");
    config = core::Config::from_env();
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().message().find("HOROVOD_CACHE_CAPACITY='64' cannot be used with "
                                         "HOROVOD_DEBUG=detail") == 0);
  }
  ScopedEnv info("TUTTI_DEBUG", "INFO");
  Result<core::Config> config = core::Config::from_env();
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message() == "TUTTI_DEBUG='INFO' is not one of OFF, DETAIL");
}

TEST_CASE("TUTTI_GRADIENT_GROUPING is auto, each or one", "[env]") {
  using Grouping = core::Config::GradientGrouping;
  CHECK(core::Config::from_env().value().gradient_grouping == Grouping::Auto);
  {
    ScopedEnv each("TUTTI_GRADIENT_GROUPING", "each");
    CHECK(core::Config::from_env().value().gradient_grouping == Grouping::Each);
  }
  {
    ScopedEnv one("HOROVOD_GRADIENT_GROUPING", "one");  // Horovod's prefix as a fallback.
    CHECK(core::Config::from_env().value().gradient_grouping == Grouping::One);
  }
  ScopedEnv two("TUTTI_GRADIENT_GROUPING", "2");
  Result<core::Config> config = core::Config::from_env();
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message() == "TUTTI_GRADIENT_GROUPING='2' is not one of auto, each, one");
}

TEST_CASE("TUTTI_HOST_TRANSPORT names one transport, or one per size class", "[env]") {
  struct Case {
    const char* text;
    ops::HostTransport transport;
    ops::HostRoutes routes;  // Bit 0: up to 64 KiB over MPI; bit 1: larger ones.
  };
  for (const Case& c :
       {Case{"auto", ops::HostTransport::Auto, 0}, Case{"shm", ops::HostTransport::Shm, 0},
        Case{"mpi", ops::HostTransport::Mpi, 0}, Case{"shm/shm", ops::HostTransport::Shm, 0},
        Case{"mpi/mpi", ops::HostTransport::Mpi, 0}, Case{"shm/mpi", ops::HostTransport::Shm, 2},
        Case{"mpi/shm", ops::HostTransport::Shm, 1}}) {
    ScopedEnv set("TUTTI_HOST_TRANSPORT", c.text);
    Result<core::Config> config = core::Config::from_env();
    INFO(c.text);
    REQUIRE(config.ok());
    CHECK(config.value().host_transport == c.transport);
    CHECK(config.value().host_routes == c.routes);
  }
  ScopedEnv bad("TUTTI_HOST_TRANSPORT", "shm/nccl");
  Result<core::Config> config = core::Config::from_env();
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message() ==
        "TUTTI_HOST_TRANSPORT='shm/nccl' is not one of auto, shm, mpi, shm/mpi, mpi/shm");
}

TEST_CASE("TUTTI_SHM_STREAMING_STORES is auto or a boolean", "[env]") {
  CHECK(core::Config::from_env().value().shm_stores == ops::ShmStores::Auto);
  struct Case {
    const char* text;
    ops::ShmStores stores;
  };
  for (const Case& c : {Case{"auto", ops::ShmStores::Auto}, Case{"1", ops::ShmStores::Streaming},
                        Case{"on", ops::ShmStores::Streaming}, Case{"0", ops::ShmStores::Cached},
                        Case{"false", ops::ShmStores::Cached}}) {
    ScopedEnv set("TUTTI_SHM_STREAMING_STORES", c.text);
    Result<core::Config> config = core::Config::from_env();
    INFO(c.text);
    REQUIRE(config.ok());
    CHECK(config.value().shm_stores == c.stores);
  }
  ScopedEnv bad("TUTTI_SHM_STREAMING_STORES", "sometimes");
  Result<core::Config> config = core::Config::from_env();
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message() ==
        "TUTTI_SHM_STREAMING_STORES='sometimes' is not auto, 1 (on) or 0 (off)");
}

TEST_CASE("Two settings agree when they give the same value, however spelt", "[env]") {
  // The start handshake's comparison of a rank's Job knobs with rank 0's.
  const Knob& cache = knob_named("CACHE_CAPACITY");  // Int, default 1024.
  CHECK(same_knob_value(cache, "01024", std::nullopt));
  CHECK(same_knob_value(cache, "1024", "01024"));
  CHECK_FALSE(same_knob_value(cache, "1025", std::nullopt));
  CHECK_FALSE(same_knob_value(cache, "x", "1024"));
  CHECK(same_knob_value(cache, "x", "x"));  // Not a number: as text (init() refuses it anyway).
  const Knob& cycle = knob_named("CYCLE_TIME");  // Double, default 1.
  CHECK(same_knob_value(cycle, "0.5", ".5"));
  CHECK(same_knob_value(cycle, "1.0", std::nullopt));
  CHECK_FALSE(same_knob_value(cycle, "0.5", "0.25"));
  const Knob& autotune = knob_named("AUTOTUNE");  // Bool, default 0.
  CHECK(same_knob_value(autotune, "no", std::nullopt));
  CHECK(same_knob_value(autotune, "yes", "1"));
  CHECK_FALSE(same_knob_value(autotune, "true", "0"));
  const Knob& grouping = knob_named("GRADIENT_GROUPING");  // String, default auto.
  CHECK(same_knob_value(grouping, "auto", std::nullopt));
  CHECK_FALSE(same_knob_value(grouping, "each", "one"));
}

TEST_CASE("Every knob is documented", "[env]") {
  for (const Knob& knob : knobs()) {
    CHECK_FALSE(knob.name.empty());
    CHECK_FALSE(knob.doc.empty());
  }
}

}  // namespace
}  // namespace tutti::detail

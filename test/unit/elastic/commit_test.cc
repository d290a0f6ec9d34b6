// SPDX-License-Identifier: Apache-2.0
// Elastic commits without MPI: the file format (round trip, damage, refusal of a commit that
// does not fit the program, nothing changed on refusal) and the store (atomic writes, keeping
// the newest, a writer killed mid-write leaving the previous commit readable).
#include <signal.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "src/elastic/commit_store.h"
#include "src/elastic/entry.h"
#include "src/elastic/snapshot.h"
#include "test/support/error_of.h"
#include "tutti/data/distributed_sampler.h"
#include "tutti/nn/variable.h"
#include "tutti/optim/sgd.h"

namespace tutti::elastic::internal {
namespace {

using test::error_of;
namespace fs = std::filesystem;

Tensor filled(Shape shape, float first) {
  Tensor t(DataType::Float32, std::move(shape));
  float value = first;
  for (float& x : t.span<float>()) x = value++;
  return t;
}

// A training loop's state: two parameters, SGD with momentum (state after one step), a
// sampler mid-epoch, an integer, bytes and an object of its own (a Stateful over `note`, which
// refuses bytes while `refuse` is set), all registered as State::add() would.
struct Loop {
  nn::Variable w{filled({2, 3}, 1), true};
  nn::Variable b{filled({3}, -1), true};
  optim::SGD sgd{{w, b}, {.lr = 0.1, .momentum = 0.9}};
  data::DistributedSampler sampler{100, 4, 1, true, 7};
  std::int64_t step = 41;
  std::vector<std::uint8_t> bytes = {1, 2, 3};
  std::string note = "note";
  bool refuse = false;
  std::vector<Entry> entries;

  Loop() {
    w.grad().span<float>()[0] = 1;
    sgd.step();  // Creates the momentum buffers.
    sampler.set_epoch(2);
    sampler.advance(5);  // Position 20.
    entries.resize(6);
    entries[0].key = "model";
    entries[0].kind = EntryKind::Parameters;
    entries[0].parameters = {{"w", w}, {"b", b}};
    entries[1].key = "sgd";
    entries[1].kind = EntryKind::Optimizer;
    entries[1].optimizer = &sgd;
    entries[2].key = "sampler";
    entries[2].kind = EntryKind::Sampler;
    entries[2].sampler = &sampler;
    entries[3].key = "step";
    entries[3].kind = EntryKind::Int64;
    entries[3].value = &step;
    entries[4].key = "bytes";
    entries[4].kind = EntryKind::Bytes;
    entries[4].bytes = &bytes;
    entries[5].key = "note";
    entries[5].kind = EntryKind::Stateful;
    entries[5].object.save = [this] { return note; };
    entries[5].object.prepare_load = [this](std::string_view saved) -> std::function<void()> {
      if (refuse) throw std::runtime_error("not a note of mine");
      return [this, copy = std::string(saved)] { note = copy; };
    };
  }
  void scramble() {
    for (float& x : w.value().span<float>()) x = 0;
    b.value().span<float>()[2] = 99;
    sgd.load_state_dict({});
    sampler.set_epoch(9);
    step = 0;
    bytes.clear();
    note = "scrambled";
  }
  std::vector<float> values() const {
    std::vector<float> v(w.value().span<float>().begin(), w.value().span<float>().end());
    v.insert(v.end(), b.value().span<float>().begin(), b.value().span<float>().end());
    return v;
  }
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct TempDir {
  std::string path;
  TempDir() {
    char pattern[] = "/tmp/tutti_elastic_test.XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST_CASE("A commit round-trips every kind of entry", "[elastic]") {
  Loop loop;
  const std::vector<float> values = loop.values();
  const optim::StateDict sgd_state = loop.sgd.state_dict();
  const std::string bytes = encode("state", 7, 3, loop.entries);
  loop.scramble();
  const Snapshot s = decode(bytes);
  CHECK(s.name == "state");
  CHECK(s.commit == 7);
  CHECK(s.world_size == 3);
  check_matches(s, loop.entries);
  load_into(s, loop.entries);
  CHECK(loop.values() == values);
  const optim::StateDict restored = loop.sgd.state_dict();
  REQUIRE(restored.tensors.size() == sgd_state.tensors.size());
  for (std::size_t i = 0; i < restored.tensors.size(); ++i) {
    CHECK(restored.tensors[i].first == sgd_state.tensors[i].first);
    const auto a = restored.tensors[i].second.span<float>();
    const auto b = sgd_state.tensors[i].second.span<float>();
    CHECK(std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end()));
  }
  CHECK(restored.scalars == sgd_state.scalars);
  CHECK(loop.sampler.epoch() == 2);
  CHECK(loop.sampler.position() == 20);
  CHECK(loop.step == 41);
  CHECK(loop.bytes == std::vector<std::uint8_t>{1, 2, 3});
  CHECK(loop.note == "note");
}

TEST_CASE("A damaged, truncated or foreign file is refused with the reason", "[elastic]") {
  Loop loop;
  const std::string bytes = encode("state", 1, 1, loop.entries);
  std::string message;
  std::string damaged = bytes;
  damaged[damaged.size() / 2] ^= 0x20;
  CHECK(error_of([&] { decode(damaged); }, &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("checksum mismatch") != std::string::npos);
  CHECK(error_of([&] { decode(bytes.substr(0, bytes.size() - 9)); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(error_of([&] { decode("TUTTICK2 a fashion_mnist checkpoint"); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message.find("not a Tutti elastic commit") != std::string::npos);
  CHECK(error_of([&] { decode(""); }) == ErrorCode::InvalidArgument);
}

TEST_CASE("A count larger than the file could hold is refused without allocating for it",
          "[elastic]") {
  // Before, 8 million entries claimed over 8 MB of 0xff made decode() allocate 1.5 GB (each
  // entry far larger in memory than the byte the count check allows it), enough to abort a
  // rank with bad_alloc. The file here has a valid checksum: only the parse can refuse it.
  Loop loop;
  const std::string empty = encode("state", 1, 1, {});
  std::string body = empty.substr(0, empty.size() - sizeof(std::uint32_t));
  const std::uint64_t claimed = 8'000'000;
  body.replace(body.size() - sizeof claimed, sizeof claimed,
               std::string(reinterpret_cast<const char*>(&claimed), sizeof claimed));
  body.append(8'000'000, '\xff');
  const std::uint32_t crc = crc32_of(body);
  const std::string crafted = body + std::string(reinterpret_cast<const char*>(&crc), sizeof crc);
  // The peak resident size the parse adds, in a child of its own (so that no other test's
  // peak counts): 1.4 GB before, a few MB now; 256 MB leaves room for the sanitizers' builds.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    struct rusage before = {};
    struct rusage after = {};
    ::getrusage(RUSAGE_SELF, &before);
    const bool refused = error_of([&] { decode(crafted); }) == ErrorCode::InvalidArgument;
    ::getrusage(RUSAGE_SELF, &after);
    const long added_kb = after.ru_maxrss - before.ru_maxrss;
    ::_exit(!refused ? 3 : added_kb > (256L << 10) ? 4 : 0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("A commit that does not fit the program is refused and changes nothing", "[elastic]") {
  Loop saved;
  const std::string bytes = encode("state", 4, 2, saved.entries);
  const Snapshot s = decode(bytes);
  std::string message;
  SECTION("another shape") {
    Loop other;
    other.w.value() = filled({3, 2}, 0);
    other.entries[0].parameters = {{"w", other.w}, {"b", other.b}};
    CHECK(error_of([&] { check_matches(s, other.entries); }, &message) ==
          ErrorCode::InvalidArgument);
    CHECK(message.find("'model' tensor 'w' is float32 [2, 3] in the commit, float32 [3, 2]") !=
          std::string::npos);
  }
  SECTION("a key the program lacks, and one the commit lacks") {
    Loop other;
    other.entries[3].key = "iteration";
    CHECK(error_of([&] { check_matches(s, other.entries); }, &message) ==
          ErrorCode::InvalidArgument);
    CHECK(message.find("'step', which the program did not add()") != std::string::npos);
  }
  SECTION("a sampler over another data set") {
    Loop other;
    other.sampler = data::DistributedSampler(99, 4, 1, true, 7);
    CHECK(error_of([&] { check_matches(s, other.entries); }, &message) ==
          ErrorCode::InvalidArgument);
    CHECK(message.find("covers 100 samples") != std::string::npos);
  }
  SECTION("an optimizer that refuses its state: the other optimizers keep theirs") {
    Loop other;
    other.scramble();
    nn::Variable lone(filled({5}, 0), true);
    optim::SGD second({lone}, {.lr = 0.1, .momentum = 0.9});
    Entry extra;
    extra.key = "second";
    extra.kind = EntryKind::Optimizer;
    extra.optimizer = &second;
    other.entries.push_back(extra);
    // The commit's "second" holds the first optimizer's buffers: shapes [2, 3] and [3].
    Loop source;
    std::vector<Entry> entries = source.entries;
    Entry same = extra;
    same.optimizer = &source.sgd;
    entries.push_back(same);
    const Snapshot bad = decode(encode("state", 5, 2, entries));
    check_matches(bad, other.entries);
    const std::vector<float> before = other.values();
    CHECK(error_of([&] { load_into(bad, other.entries); }) == ErrorCode::InvalidArgument);
    CHECK(other.sgd.state_dict().tensors.empty());  // Loaded, then given its state back.
    CHECK(other.values() == before);
    CHECK(other.step == 0);
  }
  SECTION("an object that refuses its bytes: nothing is loaded") {
    Loop other;
    other.scramble();
    other.refuse = true;
    const std::vector<float> before = other.values();
    check_matches(s, other.entries);
    CHECK(error_of([&] { load_into(s, other.entries); }, &message) == ErrorCode::InvalidArgument);
    CHECK(message.find("'note' refused its bytes: not a note of mine") != std::string::npos);
    CHECK(other.sgd.state_dict().tensors.empty());
    CHECK(other.values() == before);
    CHECK(other.note == "scrambled");
  }
  SECTION("an object whose prepare_load() returns no function") {
    Loop other;
    other.entries[5].object.prepare_load = [](std::string_view) { return std::function<void()>(); };
    CHECK(error_of([&] { load_into(s, other.entries); }, &message) == ErrorCode::InvalidArgument);
    CHECK(message.find("'note': prepare_load() returned an empty function") != std::string::npos);
  }
}

TEST_CASE("An object whose save() throws fails the encoding, naming it", "[elastic]") {
  Loop loop;
  loop.entries[5].object.save = []() -> std::string { throw std::runtime_error("no bytes"); };
  std::string message;
  CHECK(error_of([&] { encode("state", 1, 1, loop.entries); }, &message) ==
        ErrorCode::InvalidArgument);
  CHECK(message == "elastic: saving 'note' failed: no bytes");
}

TEST_CASE("The store keeps the newest commits and skips damaged ones", "[elastic]") {
  TempDir dir;
  Loop loop;
  CommitStore store(dir.path + "/sub", "state", 2);
  for (std::int64_t c = 1; c <= 3; ++c) {
    REQUIRE(store.write(c, encode("state", c, 1, loop.entries)).empty());
  }
  CHECK(store.list() == std::vector<std::int64_t>{3, 2});
  auto accept = [](std::int64_t, std::string_view bytes) -> std::string {
    try {
      decode(bytes);
      return "";
    } catch (const Error& e) {
      return e.what();
    }
  };
  std::vector<std::string> problems;
  CHECK(store.newest(accept, &problems)->commit == 3);
  CHECK(problems.empty());
  {  // A bit flipped on the disk.
    std::string bytes = read_all(store.path_of(3));
    bytes[20] ^= 1;
    std::ofstream(store.path_of(3), std::ios::binary | std::ios::trunc) << bytes;
  }
  const auto found = store.newest(accept, &problems);
  REQUIRE(found);
  CHECK(found->commit == 2);
  CHECK(decode(found->bytes).commit == 2);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("state.3.commit: checksum mismatch") != std::string::npos);
  // Another State's files and stray names are not this State's commits.
  std::ofstream(dir.path + "/sub/other.9.commit") << "x";
  std::ofstream(dir.path + "/sub/state.x9.commit") << "x";
  CHECK(store.list() == std::vector<std::int64_t>{3, 2});
}

TEST_CASE("A writer killed mid-write leaves the previous commit readable", "[elastic]") {
  TempDir dir;
  Loop loop;
  CommitStore store(dir.path, "state", 2);
  REQUIRE(store.write(1, encode("state", 1, 1, loop.entries)).empty());
  const std::string big(1 << 20, 'x');  // Commit 2, cut off after 4 KiB.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The kernel kills the writer (SIGXFSZ) the moment its file would pass 4 KiB.
    struct rlimit limit = {4096, 4096};
    struct rlimit no_core = {0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ::signal(SIGXFSZ, SIG_DFL);
    static_cast<void>(store.write(2, big));
    ::_exit(0);  // Not reached.
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGXFSZ);
  CHECK(store.list() == std::vector<std::int64_t>{1});
  std::vector<std::string> problems;
  const auto found =
      store.newest([](std::int64_t, std::string_view) { return std::string(); }, &problems);
  REQUIRE(found);
  CHECK(found->commit == 1);
  CHECK(decode(found->bytes).commit == 1);
  // The cut-off temporary file is there until the next restore removes it (its writer is
  // dead), and another host's temporary file is left alone.
  std::size_t leftovers = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    leftovers += e.path().filename().string().ends_with(".tmp");
  }
  CHECK(leftovers == 1);
  std::ofstream(dir.path + "/.state.2.elsewhere.example." + std::to_string(child) + ".tmp") << "x";
  CHECK(store.remove_leftovers() == 1);
  CHECK(fs::exists(dir.path + "/.state.2.elsewhere.example." + std::to_string(child) + ".tmp"));
}

TEST_CASE("A directory that cannot be written is reported, not thrown", "[elastic]") {
  TempDir dir;
  std::ofstream(dir.path + "/file") << "x";
  CommitStore store(dir.path + "/file/sub", "state", 2);
  const std::string why = store.write(1, "bytes");
  CHECK(why.find("cannot create " + dir.path + "/file/sub") == 0);
  CHECK(store.list().empty());
}

TEST_CASE("A folder that cannot be listed is a problem; one not made yet is not", "[elastic]") {
  // Before, both read as "no commit": a job whose commits could not be listed (permissions, a
  // stale NFS handle) started over without a word. Root reads any folder, so the test's
  // unlistable folder is a file.
  TempDir dir;
  std::ofstream(dir.path + "/file") << "x";
  auto accept = [](std::int64_t, std::string_view) { return std::string(); };
  std::vector<std::string> problems;
  CHECK_FALSE(CommitStore(dir.path + "/file", "state", 2).newest(accept, &problems));
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find(dir.path + "/file: cannot list the folder: ") == 0);
  problems.clear();
  CHECK_FALSE(CommitStore(dir.path + "/not_yet", "state", 2).newest(accept, &problems));
  CHECK(problems.empty());
}

TEST_CASE("%h in the directory is the host name", "[elastic]") {
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  CHECK(expand_directory("/tmp/x/%h/y%%z") == std::string("/tmp/x/") + host + "/y%z");
  CHECK(expand_directory("/tmp/%") == "/tmp/%");
}

}  // namespace
}  // namespace tutti::elastic::internal

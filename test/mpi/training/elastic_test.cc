// SPDX-License-Identifier: Apache-2.0
// elastic::State and elastic::run at 1-4 ranks: commit and restore, sync from a root, the stop
// request (SIGUSR2 on one rank stops every rank at the commit), the reset callbacks, the
// relaunch status, and the errors (a directory no host can write, a commit that does not fit,
// bad arguments) on every rank. Expected values are set by the test and compared with plain
// MPI; see Note [Collective assertions].
#include "tutti/elastic.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "src/elastic/commit_store.h"
#include "src/elastic/snapshot.h"
#include "test/mpi/training/elastic_dir.h"
#include "test/mpi/training/training_test_util.h"
#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "tutti/data.h"
#include "tutti/nn.h"
#include "tutti/optim.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

namespace fs = std::filesystem;

// What one training loop keeps: a model, SGD with momentum, a sampler, a step and bytes.
struct Loop {
  std::shared_ptr<nn::Sequential> model = make_model(5);
  nn::NamedParameters named = model->named_parameters();
  optim::SGD sgd{variables(named), {.lr = 0.1, .momentum = 0.9}};
  data::DistributedSampler sampler{40, tutti::size(), tutti::rank(), true, 3};
  std::int64_t step = 0;
  std::vector<std::uint8_t> bytes;

  void add_to(elastic::State& state) {
    state.add("model", named);
    state.add("sgd", sgd);
    state.add("sampler", sampler);
    state.add("step", step);
    state.add("bytes", bytes);
  }
  // One deterministic update, the same on every rank for the same `seed`.
  void train_step(float seed) {
    for (auto& [name, p] : named) {
      for (float& g : p.grad().span<float>()) g = seed;
    }
    sgd.step();
    sampler.advance(1);
    ++step;
    bytes.push_back(static_cast<std::uint8_t>(seed));
  }
  // Everything as numbers: equal fingerprints, equal state.
  std::vector<double> fingerprint() const {
    std::vector<double> out = flatten_values(named);
    for (const auto& [key, tensor] : sgd.state_dict().tensors) {
      for (float v : tensor.span<float>()) out.push_back(v);
    }
    out.push_back(static_cast<double>(sampler.epoch()));
    out.push_back(static_cast<double>(sampler.position()));
    out.push_back(static_cast<double>(step));
    for (std::uint8_t b : bytes) out.push_back(b);
    return out;
  }
  // Rank-dependent values everywhere.
  void scramble(int seed) {
    for (auto& [name, p] : named) {
      for (float& v : p.value().span<float>()) v = static_cast<float>(seed);
    }
    sgd.load_state_dict({});
    sampler.set_epoch(static_cast<std::uint64_t>(seed) + 100);
    step = -seed;
    bytes.assign(static_cast<std::size_t>(seed), 7);
  }
};

// True on every rank iff `mine` equals `root`'s, sent with plain MPI.
bool equals_roots(const std::vector<double>& mine, int root) {
  int count = static_cast<int>(mine.size());
  MPI_Bcast(&count, 1, MPI_INT, root, MPI_COMM_WORLD);
  std::vector<double> oracle = mine;
  oracle.resize(static_cast<std::size_t>(count));
  MPI_Bcast(oracle.data(), count, MPI_DOUBLE, root, MPI_COMM_WORLD);
  return all_ranks(mine == oracle);
}

// What a first launch left: two steps, each committed, then a third step lost (after the last
// commit). Its State is gone when this returns, as a relaunched process's predecessor is (one
// live State per name, Note [One State per name] in src/elastic/state.cc).
struct FirstLaunch {
  std::vector<double> committed;  // The loop's fingerprint at the last commit.
  std::int64_t commits = 0;
};
FirstLaunch commit_two_steps() {
  Loop loop;
  elastic::State state;
  loop.add_to(state);
  loop.train_step(1);
  state.commit();
  loop.train_step(2);
  state.commit();
  FirstLaunch launch{.committed = loop.fingerprint(), .commits = state.commits()};
  loop.train_step(3);  // Lost: after the last commit.
  loop.scramble(tutti::rank() + 1);
  return launch;
}

TEST_CASE("restore() brings back the newest commit on every rank", "[elastic]") {
  Session session;
  ElasticDir dir;
  const auto [committed, commits] = commit_two_steps();

  // A relaunched process: new objects, a new State.
  Loop fresh;
  fresh.scramble(tutti::rank() + 7);
  elastic::State relaunched;
  fresh.add_to(relaunched);
  CHECK(all_ranks(relaunched.restore()));
  CHECK(all_ranks(fresh.fingerprint() == committed));
  CHECK(all_ranks(relaunched.commits() == 2 && commits == 2));
  CHECK(all_ranks(relaunched.restored_world_size() == tutti::size()));
  CHECK(all_ranks(fresh.sampler.position() == 2 * static_cast<std::size_t>(tutti::size())));
}

TEST_CASE("A commit file whose name and contents disagree is skipped, not restored", "[elastic]") {
  // A copy of commit 1 named as commit 9 was restored at every relaunch (steps lost silently),
  // and pruning by name kept it over the newer commits.
  Session session;
  ElasticDir dir;
  const std::vector<double> committed = commit_two_steps().committed;
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    fs::copy_file(dir.path() + "/state.1.commit", dir.path() + "/state.9.commit");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Loop fresh;
  fresh.scramble(tutti::rank() + 3);
  elastic::State relaunched;
  fresh.add_to(relaunched);
  CHECK(all_ranks(relaunched.restore()));
  CHECK(all_ranks(relaunched.commits() == 2));
  CHECK(all_ranks(fresh.fingerprint() == committed));
}

TEST_CASE("Without a commit restore() changes nothing, and sync() gives every rank the root's",
          "[elastic]") {
  Session session;
  ElasticDir dir;
  Loop loop;
  loop.scramble(tutti::rank() + 1);
  loop.train_step(static_cast<float>(tutti::rank()));
  elastic::State state("run-1");
  loop.add_to(state);
  const std::vector<double> mine = loop.fingerprint();
  CHECK(all_ranks(!state.restore()));
  CHECK(all_ranks(loop.fingerprint() == mine));
  const int root = tutti::size() - 1;
  const std::vector<double> roots = loop.fingerprint();
  state.sync(root);
  CHECK(equals_roots(loop.fingerprint(), root));
  CHECK(all_ranks(error_of([&] { state.sync(tutti::size()); }) == ErrorCode::InvalidArgument));
}

// An optimizer of the caller's whose state_dict() or load_state_dict() throws an exception of
// its own (not a tutti::Error) while `refuse_save` or `refuse_load` is set.
class Refusing final : public optim::Optimizer {
 public:
  explicit Refusing(std::vector<nn::Variable> parameters) : Optimizer(std::move(parameters)) {}
  void step() override {}
  optim::StateDict state_dict() const override {
    if (refuse_save) throw std::runtime_error("no state today");
    return {};
  }
  void load_state_dict(const optim::StateDict&) override {
    if (refuse_load) throw std::runtime_error("cannot load today");
  }
  bool refuse_save = false, refuse_load = false;
};

TEST_CASE("A caller's optimizer that throws its own exception fails sync() on every rank",
          "[elastic]") {
  // Before, only tutti::Error was caught: the root's exception left before the broadcast (the
  // others waited in it until the stall limit), a loading rank's before the agreement.
  Session session;
  Loop loop;
  Refusing optimizer(variables(loop.named));
  elastic::State state("refusing");
  state.add("optimizer", optimizer);
  const int root = tutti::size() - 1;
  optimizer.refuse_save = tutti::rank() == root;
  std::string message;
  CHECK(all_ranks(error_of([&] { state.sync(root); }, &message) == ErrorCode::InvalidArgument));
  if (tutti::size() < 2) return;
  optimizer.refuse_save = false;
  optimizer.refuse_load = tutti::rank() == 0;  // The root does not load its own.
  message.clear();
  CHECK(all_ranks(error_of([&] { state.sync(root); }, &message) == ErrorCode::InvalidArgument));
  if (tutti::rank() == 0) CHECK_THAT(message, Catch::Contains("cannot load today"));
}

TEST_CASE("SIGUSR2 on one rank stops every rank at the next commit, which is written",
          "[elastic]") {
  Session session;
  ElasticDir dir;
  Loop loop;
  std::optional<elastic::State> state(std::in_place);
  loop.add_to(*state);
  state->commit();  // No request yet.
  if (tutti::rank() == tutti::size() - 1) ::raise(SIGUSR2);
  loop.train_step(4);
  const std::vector<double> committed = loop.fingerprint();
  bool stopped = false;
  try {
    state->commit();
  } catch (const elastic::HostsUpdated&) {
    stopped = true;
  }
  CHECK(all_ranks(stopped && state->commits() == 2));
  // The request is used up, and the commit that stopped the job is the one restored.
  CHECK_NOTHROW(state->commit());
  state.reset();  // The relaunched process's State replaces it.
  Loop fresh;
  elastic::State relaunched;
  fresh.add_to(relaunched);
  // Commit 3 is the newest: drop it to find 2, as a job stopped at 2 would.
  if (tutti::local_rank() == 0) fs::remove(dir.path() + "/state.3.commit");
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(all_ranks(relaunched.restore() && relaunched.commits() == 2));
  CHECK(all_ranks(fresh.fingerprint() == committed));
}

TEST_CASE("run() restores, resets at another world size, and returns the relaunch status",
          "[elastic]") {
  Session session;
  ElasticDir dir;
  Loop saved;
  saved.train_step(6);
  {  // A commit written by a job of 99 ranks.
    std::vector<elastic::internal::Entry> entries(5);
    const char* keys[] = {"model", "sgd", "sampler", "step", "bytes"};
    for (int i = 0; i < 5; ++i) entries[i].key = keys[i];
    entries[0].kind = elastic::internal::EntryKind::Parameters;
    entries[0].parameters = saved.named;
    entries[1].kind = elastic::internal::EntryKind::Optimizer;
    entries[1].optimizer = &saved.sgd;
    entries[2].kind = elastic::internal::EntryKind::Sampler;
    entries[2].sampler = &saved.sampler;
    entries[3].kind = elastic::internal::EntryKind::Int64;
    entries[3].value = &saved.step;
    entries[4].kind = elastic::internal::EntryKind::Bytes;
    entries[4].bytes = &saved.bytes;
    if (tutti::rank() == 0) {
      elastic::internal::CommitStore store(dir.path(), "state", 2);
      CHECK(store.write(8, elastic::internal::encode("state", 8, 99, entries)).empty());
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  Loop loop;
  elastic::State state;
  loop.add_to(state);
  int resets = 0;
  state.on_reset([&] { ++resets; });
  std::vector<double> seen;
  int code = elastic::run(state, [&](elastic::State& s) {
    seen = loop.fingerprint();
    loop.train_step(1);
    s.commit();
  });
  CHECK(all_ranks(code == 0 && resets == 1 && state.commits() == 9));
  CHECK(all_ranks(seen == saved.fingerprint()));
  // Restored at the same size: no reset. A stop request: the relaunch status.
  code = elastic::run(state, [&](elastic::State& s) {
    ::raise(SIGUSR2);
    s.commit();
  });
  CHECK(all_ranks(code == elastic::kRelaunchExitCode && resets == 1));
  // An error that stopped the runtime: relaunch; the program's own errors propagate.
  const ErrorCode stopped =
      GENERATE(ErrorCode::ShutDown, ErrorCode::Stalled, ErrorCode::Communication);
  code = elastic::run(state, [&](elastic::State&) { throw Error(stopped, "a peer is gone"); });
  CHECK(all_ranks(code == elastic::kRelaunchExitCode));
  const auto error = error_of([&] {
    elastic::run(state, [](elastic::State&) { throw Error(ErrorCode::InvalidArgument, "bug"); });
  });
  CHECK(all_ranks(error == ErrorCode::InvalidArgument));
}

TEST_CASE("A directory no host can write fails commit() on every rank", "[elastic]") {
  Session session;
  ElasticDir dir;
  if (tutti::rank() == 0) std::ofstream(dir.path() + "/file") << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  ::setenv("TUTTI_ELASTIC_DIR", (dir.path() + "/file/sub").c_str(), 1);
  Loop loop;
  elastic::State state;
  loop.add_to(state);
  std::string message;
  const auto error = error_of([&] { state.commit(); }, &message);
  CHECK(all_ranks(error == ErrorCode::InvalidArgument && state.commits() == 0));
  CHECK(all_ranks(message.find("commit 1 could not be written on any host") != std::string::npos));
}

TEST_CASE("A commit that does not fit the program is refused on every rank, changing nothing",
          "[elastic]") {
  Session session;
  ElasticDir dir;
  {
    Loop loop;
    elastic::State state;
    loop.add_to(state);
    state.commit();
  }
  auto other = make_model(9);
  other->add(std::make_shared<nn::Linear>(2, 3));
  nn::NamedParameters named = other->named_parameters();
  const std::vector<double> before = flatten_values(named);
  Loop loop;
  elastic::State state;
  state.add("model", named);
  state.add("sgd", loop.sgd);
  state.add("sampler", loop.sampler);
  state.add("step", loop.step);
  state.add("bytes", loop.bytes);
  std::string message;
  const auto error = error_of([&] { state.restore(); }, &message);
  CHECK(all_ranks(error == ErrorCode::InvalidArgument));
  CHECK(all_ranks(message.find("'model' holds 4 tensors, the program 6") != std::string::npos));
  CHECK(all_ranks(flatten_values(named) == before && state.commits() == 0));
}

TEST_CASE("Without TUTTI_ELASTIC_DIR commits are agreed but written nowhere", "[elastic]") {
  Session session;
  ElasticDir dir(/*use=*/false);
  Loop loop;
  std::optional<elastic::State> state(std::in_place);
  loop.add_to(*state);
  state->commit();
  CHECK(all_ranks(state->commits() == 1 && fs::is_empty(dir.path())));
  state.reset();  // The relaunched process's State replaces it.
  Loop fresh;
  elastic::State again;
  fresh.add_to(again);
  CHECK(all_ranks(!again.restore()));
}

// Note [ZeRO in a State] in src/elastic/state.cc. Adam over the model, sharded by ZeRO or not;
// every rank sets the same gradients, so the sharded and the plain optimizer step alike.
std::unique_ptr<optim::Optimizer> adam_over(std::vector<nn::Variable> params) {
  return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions{.lr = 0.01});
}
// Adam over `named`, sharded by ZeRO or not.
std::unique_ptr<optim::Optimizer> adam_for(const nn::NamedParameters& named, bool sharded) {
  if (sharded) return std::make_unique<optim::ZeroRedundancyOptimizer>(named, adam_over);
  return adam_over(variables(named));
}
void set_gradients(const nn::NamedParameters& named, float seed) {
  float k = 1;
  for (const auto& [name, p] : named) {
    for (float& g : p.grad().span<float>()) g = seed * k;
    k += 1;
  }
}
std::vector<double> values_of(const optim::StateDict& state) {
  std::vector<double> out;
  for (const auto& [key, tensor] : state.tensors) {
    for (float v : tensor.span<float>()) out.push_back(v);
  }
  for (const auto& [key, value] : state.scalars) out.push_back(value);
  return out;
}
// The parameters after steps with seeds 1, 2, 3 of a plain Adam in one process: the oracle.
std::vector<double> three_plain_steps() {
  const std::shared_ptr<nn::Sequential> model = make_model(5);
  const nn::NamedParameters named = model->named_parameters();
  const std::unique_ptr<optim::Optimizer> adam = adam_over(variables(named));
  for (float seed : {1.0f, 2.0f, 3.0f}) {
    set_gradients(named, seed);
    adam->step();
  }
  return flatten_values(named);
}
bool close_to(const std::vector<double>& got, const std::vector<double>& expected) {
  if (got.size() != expected.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - expected[i]) > 1e-6) return false;
  }
  return true;
}

TEST_CASE("A ZeroRedundancyOptimizer's state is committed whole and restored into each shard",
          "[elastic]") {
  // Before, add() refused a ZeRO optimizer. Now its commit holds the unsharded state, which a
  // relaunch at any world size loads into its own shards, and a plain optimizer's commit loads
  // into ZeRO (and the other way round). Each check steps once more after the restore and
  // compares with a plain Adam over the whole model: a lost Adam state (moments, step count)
  // moves the parameters elsewhere.
  Session session;
  ElasticDir dir;
  const bool committed_by_zero = GENERATE(true, false);
  const std::vector<double> expected = three_plain_steps();
  {  // The first launch: two steps committed, the third lost.
    const std::shared_ptr<nn::Sequential> model = make_model(5);
    const nn::NamedParameters named = model->named_parameters();
    const std::unique_ptr<optim::Optimizer> optimizer = adam_for(named, committed_by_zero);
    elastic::State state;
    state.add("model", named);
    state.add("adam", *optimizer);
    for (float seed : {1.0f, 2.0f}) {
      set_gradients(named, seed);
      optimizer->step();
      state.commit();
    }
    set_gradients(named, 3);
    optimizer->step();  // Lost.
  }
  // Relaunched with ZeRO, and with a plain Adam: both restore, step 3 and end at the oracle.
  for (const bool zero : {true, false}) {
    const std::shared_ptr<nn::Sequential> model = make_model(7);  // Other values until restored.
    const nn::NamedParameters named = model->named_parameters();
    const std::unique_ptr<optim::Optimizer> optimizer = adam_for(named, zero);
    elastic::State state;
    state.add("model", named);
    state.add("adam", *optimizer);
    CHECK(all_ranks(state.restore()));
    CHECK(all_ranks(state.commits() == 2));
    set_gradients(named, 3);
    optimizer->step();
    INFO("committed by ZeRO " << committed_by_zero << ", restored into ZeRO " << zero);
    CHECK(all_ranks(close_to(flatten_values(named), expected)));
  }
  // sync(): the other ranks get rank 0's parameters; a ZeRO state is the set's (each shard's
  // from its owner), so each rank's shard comes back as it was, through rank 0's consolidation.
  const std::shared_ptr<nn::Sequential> model = make_model(5);
  const nn::NamedParameters named = model->named_parameters();
  optim::ZeroRedundancyOptimizer zero(named, adam_over);
  elastic::State state("synced");
  state.add("model", named);
  state.add("adam", zero);
  for (float seed : {1.0f, 2.0f}) {
    set_gradients(named, seed);
    zero.step();
  }
  const std::vector<double> before = values_of(zero.local_optimizer().state_dict());
  if (tutti::rank() != 0) {
    for (const auto& [name, p] : named) {
      for (float& v : p.value().span<float>()) v = 42;
    }
  }
  state.sync(0);
  CHECK(all_ranks(values_of(zero.local_optimizer().state_dict()) == before));
  set_gradients(named, 3);
  zero.step();
  CHECK(all_ranks(close_to(flatten_values(named), expected)));
}

TEST_CASE("A ZeRO state one shard refuses is refused on every rank, changing nothing",
          "[elastic]") {
  // The commit's Adam state holds a [3] moment for the last parameter, a [2] bias here: only
  // the member that owns it refuses it. Before, the others had loaded their shards by then.
  Session session;
  ElasticDir dir;
  {
    std::vector<nn::Variable> other = {nn::Variable(Tensor(DataType::Float32, {8, 4}), true),
                                       nn::Variable(Tensor(DataType::Float32, {8}), true),
                                       nn::Variable(Tensor(DataType::Float32, {2, 8}), true),
                                       nn::Variable(Tensor(DataType::Float32, {3}), true)};
    const std::unique_ptr<optim::Optimizer> adam = adam_over(other);
    for (nn::Variable& p : other) {
      for (float& g : p.grad().span<float>()) g = 1;
    }
    adam->step();
    elastic::State state;
    state.add("adam", *adam);
    state.commit();
  }
  const std::shared_ptr<nn::Sequential> model = make_model(5);
  const nn::NamedParameters named = model->named_parameters();
  optim::ZeroRedundancyOptimizer zero(named, adam_over);
  set_gradients(named, 2);
  zero.step();
  const std::vector<double> before = values_of(zero.local_optimizer().state_dict());
  elastic::State state;
  state.add("adam", zero);
  std::string message;
  CHECK(all_ranks(error_of([&] { state.restore(); }, &message) == ErrorCode::InvalidArgument));
  INFO(message);
  CHECK(all_ranks(values_of(zero.local_optimizer().state_dict()) == before));
}

// An object of the caller's (elastic::Stateful): integers saved as text; it refuses bytes
// that hold another count of them.
struct Numbers {
  std::vector<std::int64_t> values;

  elastic::Stateful stateful() {
    return {.save =
                [this] {
                  std::string text;
                  for (std::int64_t v : values) text += std::to_string(v) + " ";
                  return text;
                },
            .prepare_load = [this](std::string_view bytes) -> std::function<void()> {
              std::vector<std::int64_t> read;
              std::istringstream in{std::string(bytes)};
              for (std::int64_t v = 0; in >> v;) read.push_back(v);
              if (read.size() != values.size()) {
                throw std::runtime_error(std::to_string(read.size()) + " numbers, this one holds " +
                                         std::to_string(values.size()));
              }
              return [this, read] { values = read; };
            }};
  }
};

TEST_CASE("An object of the caller's is committed as its bytes, loaded only if every rank can",
          "[elastic]") {
  Session session;
  ElasticDir dir;
  const int last = tutti::size() - 1;
  const auto r = static_cast<std::int64_t>(tutti::rank());
  {
    Numbers numbers{{1, 2, 3}};
    std::int64_t step = 5;
    elastic::State state;
    state.add("numbers", numbers.stateful());
    state.add("step", step);
    state.commit();
  }
  {
    Numbers numbers{{-r, -r, -r}};
    std::int64_t step = -1;
    elastic::State state;
    state.add("numbers", numbers.stateful());
    state.add("step", step);
    CHECK(all_ranks(state.restore()));
    CHECK(all_ranks(numbers.values == std::vector<std::int64_t>{1, 2, 3} && step == 5));
  }
  {  // The last rank's object holds four numbers: it refuses, and no rank changes anything.
    Numbers numbers{std::vector<std::int64_t>(tutti::rank() == last ? 4 : 3, -r)};
    const std::vector<std::int64_t> before = numbers.values;
    std::int64_t step = -1;
    elastic::State state;
    state.add("numbers", numbers.stateful());
    state.add("step", step);
    std::string message;
    CHECK(all_ranks(error_of([&] { state.restore(); }, &message) == ErrorCode::InvalidArgument));
    INFO(message);
    CHECK(all_ranks(numbers.values == before && step == -1 && state.commits() == 0));
    const std::string expected = tutti::rank() == last
                                     ? "'numbers' refused its bytes: 3 numbers, this one holds 4"
                                     : "restore failed on another rank";
    CHECK(all_ranks(message.find(expected) != std::string::npos));
  }
  {  // sync(): the root's object on every rank.
    Numbers numbers{{r, 2 * r, 7}};
    elastic::State state;
    state.add("numbers", numbers.stateful());
    state.sync(last);
    CHECK(all_ranks(numbers.values == std::vector<std::int64_t>{last, 2 * last, 7}));
  }
  elastic::State state;
  CHECK(all_ranks(error_of([&] { state.add("empty", elastic::Stateful{}); }) ==
                  ErrorCode::InvalidArgument));
}

TEST_CASE("Bad names, keys and TUTTI_ELASTIC_KEEP are refused by the call", "[elastic]") {
  Session session;
  CHECK(all_ranks(error_of([] { elastic::State("a/b"); }) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(error_of([] { elastic::State(""); }) == ErrorCode::InvalidArgument));
  elastic::State state;
  std::int64_t a = 0;
  state.add("a", a);
  CHECK(all_ranks(error_of([&] { state.add("a", a); }) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(error_of([&] { state.add("", a); }) == ErrorCode::InvalidArgument));
  nn::NamedParameters empty = {{"x", nn::Variable()}};
  CHECK(all_ranks(error_of([&] { state.add("p", empty); }) == ErrorCode::InvalidArgument));
  // A ZeRO optimizer over a set of some ranks: its state cannot be consolidated to every
  // writer (Note [ZeRO in a State] in src/elastic/state.cc).
  if (tutti::size() > 1) {
    const ProcessSet first = add_process_set({0});
    if (tutti::rank() == 0) {
      nn::Linear layer(3, 2);
      optim::ZeroRedundancyOptimizer zero(layer.named_parameters(), adam_over,
                                          {.process_set = first});
      std::string zero_message;
      CHECK(error_of([&] { state.add("zero", zero); }, &zero_message) ==
            ErrorCode::InvalidArgument);
      CHECK(zero_message.find("a State holds one only over all the ranks") != std::string::npos);
    }
    remove_process_set(first);
  }
  std::string message;
  ::setenv("TUTTI_ELASTIC_KEEP", "0", 1);
  CHECK(all_ranks(error_of([] { elastic::State(); }, &message) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(message.find("TUTTI_ELASTIC_KEEP='0' is out of range") == 0));
  ::setenv("TUTTI_ELASTIC_KEEP", "two", 1);
  CHECK(all_ranks(error_of([] { elastic::State(); }, &message) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(
      message == "TUTTI_ELASTIC_KEEP='two' is not an integer: must be an integer in [1, 1000000]"));
  ::setenv("TUTTI_ELASTIC_KEEP", "1.5", 1);
  CHECK(all_ranks(error_of([] { elastic::State(); }, &message) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(message.find("TUTTI_ELASTIC_KEEP='1.5' is not an integer") == 0));
  ::setenv("TUTTI_ELASTIC_KEEP", "1e1", 1);  // As init() takes it.
  CHECK(all_ranks(!error_of([] { elastic::State("keep"); }).has_value()));
  ::unsetenv("TUTTI_ELASTIC_KEEP");
  // Note [One State per name] in src/elastic/state.cc: a second live State of a name would write
  // over the first one's commits; once the first is gone the name is free again.
  CHECK(
      all_ranks(error_of([] { elastic::State("state"); }, &message) == ErrorCode::InvalidArgument));
  CHECK(all_ranks(message.find("another State of this name is alive") != std::string::npos));
  { elastic::State other("other"); }
  CHECK(all_ranks(!error_of([] { elastic::State("other"); }).has_value()));
}

}  // namespace
}  // namespace tutti::test

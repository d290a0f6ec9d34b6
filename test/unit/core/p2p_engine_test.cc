// SPDX-License-Identifier: Apache-2.0
// P2PEngine's sharing between threads (Note [A waiting thread drives point-to-point] in
// src/core/execution/p2p_engine.h), on a scripted channel: a driving thread starts and completes
// ops and wakes the loop only for what stays in flight and moves only while polled (Note [Waking
// the loop for point-to-point]), and not for the op of a thread that waits on it at once, nor
// when the loop looks within kLookWithin anyway (Note [A wake left to the loop's next look]); its
// errors reach the loop's progress();
// the loop skips a step while another thread runs one; finish() first completes what already
// arrived or finished (Note [Settling at the end]); nothing is driven after finish().
#include "src/core/execution/p2p_engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/p2p_channel.h"
#include "src/core/completer.h"
#include "src/core/config.h"
#include "src/core/op_state.h"

namespace tutti::core {
namespace {

// A channel whose sends complete at once (unless `sends_finish` is false: then once it is true
// again) and whose headers never arrive, unless told otherwise: `headers` arrive in order, and a
// payload receive fills its floats with 2.0f and completes at once. Counts its calls; `gate` (if
// set) holds take_header() until opened.
class ScriptedChannel final : public ops::P2PChannel {
 public:
  struct Script {
    std::atomic<int> sends{0};
    std::atomic<bool> sends_finish{true};
    int max_tag = 1 << 24;
    std::atomic<int> header_probes{0};
    std::atomic<bool> destroyed{false};
    Status header_error;              // take_header() fails with it if not OK.
    std::deque<std::string> headers;  // Arrived messages' headers, under `mutex`.
    // take_header() waits while `gate_closed` (then counts `inside_gate`).
    std::mutex mutex;
    std::condition_variable cv;
    bool gate_closed = false;
    std::atomic<bool> inside_gate{false};
  };

  explicit ScriptedChannel(Script& script) : script_(script) {}
  ~ScriptedChannel() override { script_.destroyed = true; }

  int max_tag() const override { return script_.max_tag; }
  Result<Id> start_send(int, int, std::string, const void*, std::size_t) override {
    ++script_.sends;
    (script_.sends_finish ? done_ : unfinished_).push_back(next_);
    return next_++;
  }
  Result<std::optional<Header>> take_header(int, int) override {
    ++script_.header_probes;
    {
      std::unique_lock<std::mutex> lock(script_.mutex);
      script_.inside_gate = true;
      script_.cv.wait(lock, [&] { return !script_.gate_closed; });
      script_.inside_gate = false;
    }
    if (!script_.header_error.ok()) return script_.header_error;
    std::lock_guard<std::mutex> lock(script_.mutex);
    if (script_.headers.empty()) return std::optional<Header>();
    Header header{.source = 1, .bytes = std::move(script_.headers.front())};
    script_.headers.pop_front();
    return std::optional<Header>(std::move(header));
  }
  Result<Id> start_receive(int, int, void* data, std::size_t bytes) override {
    std::fill_n(static_cast<float*>(data), bytes / sizeof(float), 2.0f);
    done_.push_back(next_);
    return next_++;
  }
  Result<std::vector<Id>> completed() override {
    if (script_.sends_finish) {
      done_.insert(done_.end(), unfinished_.begin(), unfinished_.end());
      unfinished_.clear();
    }
    std::vector<Id> done;
    done.swap(done_);
    return done;
  }
  bool active(Id) const override { return false; }
  void abandon() override {}

 private:
  Script& script_;
  Id next_ = 1;
  std::vector<Id> done_;
  std::vector<Id> unfinished_;  // Sends started while `sends_finish` was false.
};

// A header of `count` floats, with `inline_payload` inside it unless that is empty.
std::string float_header(std::int64_t count, const std::vector<float>& inline_payload = {}) {
  return encode_p2p_header(DataType::Float32, count,
                           inline_payload.empty() ? nullptr : inline_payload.data(),
                           inline_payload.size() * sizeof(float));
}

struct Fixture {
  ScriptedChannel::Script script;
  P2PQueue queue;
  Completer completer{nullptr};
  Config config;
  std::atomic<int> wakes{0};
  std::shared_ptr<P2PEngine> engine;
  std::shared_ptr<Entry> last;  // The entry of the op push() queued last.
  // Room for a message of more than P2PEngine::kInlineBytes.
  std::vector<float> data = std::vector<float>(P2PEngine::kInlineBytes, 1.0f);

  explicit Fixture(int max_tag = 1 << 24) {
    script.max_tag = max_tag;
    engine = std::make_shared<P2PEngine>(std::make_unique<ScriptedChannel>(script), queue,
                                         completer, config, /*drivable=*/true, [this] { ++wakes; });
  }

  // A queued send (or receive) of `floats` of `data` to (from) rank 1, tag 0; returns its state.
  std::shared_ptr<detail::OpState> push(bool send, std::int64_t floats = 4) {
    P2POpEntry op{.send = send,
                  .peer = 1,
                  .tag = 0,
                  .set_id = 0,
                  .channel_tag = P2PEngine::channel_tag(0, 0),
                  .entry = std::make_shared<Entry>()};
    op.entry->inputs.push_back(TensorView(data.data(), {floats}));
    op.entry->state = std::make_shared<detail::OpState>();
    op.entry->submitted = std::chrono::steady_clock::now();
    std::shared_ptr<detail::OpState> state = op.entry->state;
    last = op.entry;
    std::vector<P2POpEntry> ops;
    ops.push_back(std::move(op));
    REQUIRE(queue.push(std::move(ops)).ok());
    return state;
  }
};

TEST_CASE("Channel tags: 32768 per set for sets 0 to 127, none beyond", "[p2p]") {
  // Before, set 128 had tag 0 alone; the limit is now per set, as p2p.h states it.
  CHECK(P2PEngine::channel_tag(0, 0) == 0);
  CHECK(P2PEngine::channel_tag(1, 0) == 32768);
  CHECK(P2PEngine::channel_tag(127, 32767) == (1 << 22) - 1);
  CHECK(P2PEngine::channel_tag(128, 0) == -1);
  CHECK(P2PEngine::channel_tag(131, 5) == -1);
}

TEST_CASE("An op beyond the channel's tag space is InvalidArgument", "[p2p]") {
  // An MPI whose MPI_TAG_UB is below the doubled channel tags (the standard asks only 32767).
  Fixture f(40000);
  const auto op = [](int set_id, int tag) {
    return P2POpEntry{.send = true,
                      .peer = 1,
                      .tag = tag,
                      .set_id = set_id,
                      .channel_tag = P2PEngine::channel_tag(set_id, tag),
                      .entry = nullptr};
  };
  CHECK(f.engine->check_tag(op(0, 32767)).ok());
  CHECK(f.engine->check_tag(op(1, 40000 - 32768)).ok());
  const Status beyond = f.engine->check_tag(op(1, 40000 - 32768 + 1));
  CHECK(beyond.code() == ErrorCode::InvalidArgument);
  CHECK_THAT(std::string(beyond.message()),
             Catch::Contains("tag 7233 on process set 1") &&
                 Catch::Contains("MPI_TAG_UB leaves point-to-point 40001 tags"));
  CHECK(f.engine->check_tag(op(2, 0)).code() == ErrorCode::InvalidArgument);
}

TEST_CASE("A driven step starts and completes a send without waking the loop", "[p2p]") {
  Fixture f;
  std::shared_ptr<detail::OpState> send = f.push(true);
  f.engine->drive();
  CHECK(f.script.sends == 1);
  CHECK(send->done());
  CHECK(send->wait().ok());
  CHECK_FALSE(f.engine->busy());
  CHECK(f.wakes == 0);
}

TEST_CASE("A driven step leaves a small receive to its waiter without waking the loop", "[p2p]") {
  Fixture f;
  // kInlineBytes exactly: the message would arrive whole inside its header.
  std::shared_ptr<detail::OpState> receive =
      f.push(false, static_cast<std::int64_t>(P2PEngine::kInlineBytes / sizeof(float)));
  f.engine->drive();
  CHECK(f.script.header_probes == 1);
  CHECK_FALSE(receive->done());
  CHECK(f.engine->busy());  // The loop, when it next looks, polls for it.
  CHECK(f.wakes == 0);
  // A waiter that gives up hands it to the loop.
  f.engine->hand_back();
  CHECK(f.wakes == 1);
  f.engine->finish(Status(ErrorCode::ShutDown, "test over"));
  CHECK(receive->wait().code() == ErrorCode::ShutDown);
}

TEST_CASE("A driven step that leaves a large receive waiting wakes the loop once", "[p2p]") {
  Fixture f;
  // One float past kInlineBytes: the data would follow the header.
  std::shared_ptr<detail::OpState> receive =
      f.push(false, static_cast<std::int64_t>(P2PEngine::kInlineBytes / sizeof(float)) + 1);
  f.engine->drive();
  CHECK_FALSE(receive->done());
  CHECK(f.wakes == 1);
  // Later steps start nothing new: the loop already knows.
  f.engine->drive();
  CHECK(f.script.header_probes == 2);
  CHECK(f.wakes == 1);
  f.engine->finish(Status(ErrorCode::ShutDown, "test over"));
  CHECK(receive->wait().code() == ErrorCode::ShutDown);
}

TEST_CASE("A driven step leaves a large receive to a loop that looks within kLookWithin", "[p2p]") {
  // Note [A wake left to the loop's next look].
  using std::chrono::microseconds;
  const auto large = static_cast<std::int64_t>(P2PEngine::kInlineBytes / sizeof(float)) + 1;
  Fixture f;
  const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  // A small receive needs no look: the loop keeps a long nap it decided on before it.
  std::shared_ptr<detail::OpState> small = f.push(false);
  f.engine->drive();
  CHECK(f.engine->before_pause(now, microseconds(100000)) == microseconds(100000));
  // A nap within kLookWithin is taken as asked.
  CHECK(f.engine->before_pause(now, microseconds(100)) == microseconds(100));
  std::shared_ptr<detail::OpState> first = f.push(false, large);
  f.engine->drive();
  CHECK(f.engine->busy());
  CHECK(f.wakes == 0);  // Its nap ends within kLookWithin: no wake-up.
  // The loop lies down for longer meanwhile (it decided before the op came): it naps
  // kLookWithin at most, and says so.
  CHECK(f.engine->before_pause(now, microseconds(100000)) == P2PEngine::kLookWithin);
  std::shared_ptr<detail::OpState> second = f.push(false, large);
  f.engine->drive();
  CHECK(f.wakes == 0);
  // The loop's own step sees them in flight (its idle policy keeps its naps short from then on).
  bool did_work = false;
  CHECK(f.engine->progress(std::chrono::steady_clock::now(), &did_work).ok());
  CHECK(f.engine->before_pause(now, microseconds(100000)) == microseconds(100000));
  f.engine->finish(Status(ErrorCode::ShutDown, "test over"));
  CHECK(small->wait().code() == ErrorCode::ShutDown);
  CHECK(first->wait().code() == ErrorCode::ShutDown);
  CHECK(second->wait().code() == ErrorCode::ShutDown);
}

TEST_CASE("A driven step wakes a loop whose nap ends past kLookWithin", "[p2p]") {
  using std::chrono::microseconds;
  Fixture f;
  // An idle loop's long nap, said before the op (nothing in flight: it keeps the whole nap).
  CHECK(f.engine->before_pause(std::chrono::steady_clock::now(), microseconds(100000)) ==
        microseconds(100000));
  std::shared_ptr<detail::OpState> receive =
      f.push(false, static_cast<std::int64_t>(P2PEngine::kInlineBytes / sizeof(float)) + 1);
  f.engine->drive();
  CHECK(f.wakes == 1);
  f.engine->finish(Status(ErrorCode::ShutDown, "test over"));
  CHECK(receive->wait().code() == ErrorCode::ShutDown);
}

TEST_CASE("A driven step that leaves a send unfinished wakes the loop", "[p2p]") {
  Fixture f;
  f.script.sends_finish = false;
  std::shared_ptr<detail::OpState> send = f.push(true);
  f.engine->drive();
  CHECK(f.script.sends == 1);
  CHECK_FALSE(send->done());
  CHECK(f.wakes == 1);
  // A later step that starts a small receive wakes it again: the send still needs polling.
  std::shared_ptr<detail::OpState> receive = f.push(false);
  f.engine->drive();
  CHECK(f.wakes == 2);
  f.engine->finish(Status(ErrorCode::ShutDown, "test over"));
  CHECK(send->wait().code() == ErrorCode::ShutDown);
  CHECK(receive->wait().code() == ErrorCode::ShutDown);
}

TEST_CASE("A step before a wait does not wake the loop for the waiter's own op", "[p2p]") {
  Fixture f;
  f.script.sends_finish = false;
  std::shared_ptr<detail::OpState> send = f.push(true);
  const std::shared_ptr<Entry> own = f.last;
  f.engine->drive_before_wait(*own);
  CHECK(f.script.sends == 1);
  CHECK_FALSE(send->done());
  CHECK(f.wakes == 0);
  // The waiting thread drives it to the end; its steps start nothing new and wake nothing.
  f.engine->drive();
  CHECK(f.wakes == 0);
  f.script.sends_finish = true;
  f.engine->drive();
  CHECK(send->done());
  CHECK(f.wakes == 0);
  // The same for a large receive, which drive() wakes the loop for.
  std::shared_ptr<detail::OpState> receive =
      f.push(false, static_cast<std::int64_t>(P2PEngine::kInlineBytes / sizeof(float)) + 1);
  f.engine->drive_before_wait(*f.last);
  CHECK_FALSE(receive->done());
  CHECK(f.wakes == 0);
  f.engine->finish(Status(ErrorCode::ShutDown, "test over"));
  CHECK(receive->wait().code() == ErrorCode::ShutDown);
}

TEST_CASE("A step before a wait wakes the loop for other ops it starts", "[p2p]") {
  Fixture f;
  // Another thread's large receive, queued first, then the waiting thread's own small send.
  std::shared_ptr<detail::OpState> receive =
      f.push(false, static_cast<std::int64_t>(P2PEngine::kInlineBytes / sizeof(float)) + 1);
  std::shared_ptr<detail::OpState> send = f.push(true);
  f.engine->drive_before_wait(*f.last);
  CHECK(send->done());
  CHECK_FALSE(receive->done());
  CHECK(f.wakes == 1);
  f.engine->finish(Status(ErrorCode::ShutDown, "test over"));
  CHECK(receive->wait().code() == ErrorCode::ShutDown);
}

TEST_CASE("A step before a wait that meets an error wakes the loop at once", "[p2p]") {
  Fixture f;
  f.script.header_error = Status(ErrorCode::Communication, "scripted failure");
  f.push(false);
  f.engine->drive_before_wait(*f.last);
  CHECK(f.wakes == 1);
  bool did_work = false;
  CHECK(f.engine->progress(std::chrono::steady_clock::now(), &did_work).code() ==
        ErrorCode::Communication);
}

TEST_CASE("An error a driving thread meets stops the loop through its next progress()", "[p2p]") {
  Fixture f;
  f.script.header_error = Status(ErrorCode::Communication, "scripted failure");
  f.push(false);
  f.engine->drive();
  CHECK(f.wakes == 1);
  bool did_work = false;
  const Status first = f.engine->progress(std::chrono::steady_clock::now(), &did_work);
  CHECK(first.code() == ErrorCode::Communication);
  CHECK(first.message() == "scripted failure");
  // No step runs after it, on any thread, until the loop has stopped.
  const int probes = f.script.header_probes;
  f.engine->drive();
  CHECK(f.engine->progress(std::chrono::steady_clock::now(), &did_work).code() ==
        ErrorCode::Communication);
  CHECK(f.script.header_probes == probes);
}

TEST_CASE("The loop skips its step while another thread runs one", "[p2p]") {
  Fixture f;
  f.push(false);
  {
    std::lock_guard<std::mutex> lock(f.script.mutex);
    f.script.gate_closed = true;
  }
  std::thread driver([&] { f.engine->drive(); });
  while (!f.script.inside_gate) std::this_thread::yield();
  bool did_work = false;
  CHECK(f.engine->progress(std::chrono::steady_clock::now(), &did_work).ok());
  CHECK_FALSE(did_work);
  CHECK(f.script.header_probes == 1);  // The driver's probe only.
  {
    std::lock_guard<std::mutex> lock(f.script.mutex);
    f.script.gate_closed = false;
  }
  f.script.cv.notify_all();
  driver.join();
  CHECK(f.engine->progress(std::chrono::steady_clock::now(), &did_work).ok());
  CHECK(f.script.header_probes == 2);
}

TEST_CASE("finish() completes a receive whose message arrived as the session ended", "[p2p]") {
  Fixture f;
  std::shared_ptr<detail::OpState> receive = f.push(false);
  f.engine->drive();  // Nothing has arrived yet.
  REQUIRE_FALSE(receive->done());
  // A queued receive, never stepped, settles too.
  std::shared_ptr<detail::OpState> queued = f.push(false);
  {
    std::lock_guard<std::mutex> lock(f.script.mutex);
    f.script.headers.push_back(float_header(4, {7.0f, 8.0f, 9.0f, 10.0f}));
    f.script.headers.push_back(float_header(4, {11.0f, 12.0f, 13.0f, 14.0f}));
  }
  f.engine->finish(Status(ErrorCode::ShutDown, "rank 1 shut down"));
  CHECK(receive->wait().ok());
  CHECK(queued->wait().ok());
  // Both receives share `data`: the queued one, matched second, wrote last.
  CHECK(f.data[0] == 11.0f);
  CHECK(f.data[3] == 14.0f);
  CHECK(receive->results().source == 1);
}

TEST_CASE("finish() collects a large receive whose payload follows its header", "[p2p]") {
  Fixture f;
  const auto floats = static_cast<std::int64_t>(P2PEngine::kInlineBytes / sizeof(float)) + 1;
  std::shared_ptr<detail::OpState> receive = f.push(false, floats);
  f.engine->drive();
  {
    std::lock_guard<std::mutex> lock(f.script.mutex);
    f.script.headers.push_back(float_header(floats));
  }
  f.engine->finish(Status(ErrorCode::ShutDown, "rank 1 shut down"));
  CHECK(receive->wait().ok());
  CHECK(f.data[0] == 2.0f);
  CHECK(f.data[static_cast<std::size_t>(floats) - 1] == 2.0f);
  CHECK(f.data[static_cast<std::size_t>(floats)] == 1.0f);  // Past the receive: untouched.
}

TEST_CASE("finish() completes a send that MPI finished, and fails the queued ones", "[p2p]") {
  Fixture f;
  f.script.sends_finish = false;
  std::shared_ptr<detail::OpState> send = f.push(true);
  f.engine->drive();
  REQUIRE_FALSE(send->done());
  std::shared_ptr<detail::OpState> queued = f.push(true);
  f.script.sends_finish = true;
  f.engine->finish(Status(ErrorCode::ShutDown, "rank 1 shut down"));
  CHECK(send->wait().ok());
  CHECK(queued->wait().code() == ErrorCode::ShutDown);
  CHECK(f.script.sends == 1);  // The queued send was never started.
}

TEST_CASE("finish() after a communication error fails receives without looking", "[p2p]") {
  Fixture f;
  std::shared_ptr<detail::OpState> receive = f.push(false);
  f.engine->drive();
  const int probes = f.script.header_probes;
  {
    std::lock_guard<std::mutex> lock(f.script.mutex);
    f.script.headers.push_back(float_header(4, {7.0f, 8.0f, 9.0f, 10.0f}));
  }
  f.engine->finish(Status(ErrorCode::Communication, "the transport failed"));
  CHECK(receive->wait().code() == ErrorCode::Communication);
  CHECK(f.script.header_probes == probes);
  CHECK(f.data[0] == 1.0f);
}

TEST_CASE("After finish() the engine drives nothing and holds no channel", "[p2p]") {
  Fixture f;
  std::shared_ptr<detail::OpState> queued = f.push(true);
  f.engine->finish(Status(ErrorCode::Stalled, "stopped"));
  CHECK(queued->wait().code() == ErrorCode::Stalled);
  CHECK(f.script.destroyed);
  f.engine->drive();
  f.engine->hand_back();
  CHECK(f.script.sends == 0);
  CHECK(f.wakes == 0);
}

}  // namespace
}  // namespace tutti::core

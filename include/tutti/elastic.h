// SPDX-License-Identifier: Apache-2.0
// Elastic training: a job that survives losing a host and grows when one is added, restart-based
// as torchrun's (Open MPI 4 has no ULFM, so a lost process ends its mpirun job): State commits
// what the training loop must keep on every host, scripts/tuttirun relaunches the job on the
// hosts that are up, and run() brings the state back from the last commit.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/data/distributed_sampler.h"
#include "tutti/export.h"
#include "tutti/nn/module.h"
#include "tutti/optim/optimizer.h"

namespace tutti::elastic {

// Thrown by State::commit() on every rank when the launcher asked the job to stop (the
// discovery script's host list changed), after the commit is written: run() turns it into
// kRelaunchExitCode, and the relaunched job restores that very commit, losing no step.
class TUTTI_API HostsUpdated : public std::exception {
 public:
  const char* what() const noexcept override;
};

// Tutti addition: state that State cannot look into (a LibTorch module or optimizer: see
// tutti::libtorch::stateful() in tutti/libtorch.h; any object of the caller's), committed as
// the bytes its own two functions make and read. Both must be set (add() refuses an empty one).
struct Stateful {
  // The object's state as it stands, as bytes: called by commit() on each rank that writes and
  // by sync() on the root. An exception fails that rank's write as a failed file write would
  // (see commit()), or the sync on every rank.
  std::function<std::string()> save;
  // Reads `bytes` (what save() returned, in this launch or an earlier one, at any world size)
  // and checks that they fit the object, changing nothing; returns the function that loads
  // them, which must not throw. Throwing refuses the commit: restore() and sync() then throw
  // Error(InvalidArgument) on every rank, with the message on this one, and nothing registered
  // changes on any rank. restore() and sync() call it on every rank that loads, before any
  // registered object changes, and run what it returned only once every rank has prepared its
  // load.
  std::function<std::function<void()>(std::string_view bytes)> prepare_load;
};

// What a training loop must keep across a restart: named tensors, an optimizer's state, a
// sampler's place in the epoch, integers, bytes and objects of its own, registered once with add()
// as references to the loop's own objects, which commit() reads and restore()/sync() write.
//
// The state is replicated, as data-parallel training keeps it: every rank holds the same
// values (rank 0's after sync()). A commit therefore stores one copy per host: the first rank
// of each host (local_rank() 0) writes its values under TUTTI_ELASTIC_DIR, so that losing any
// host loses no commit, and restore() brings back the newest commit any host can read.
//
// Files: <TUTTI_ELASTIC_DIR>/<name>.<commit>.commit, written aside then renamed (a commit cut
// off mid-write leaves the previous one readable), carrying a CRC-32 of their bytes, the world
// size and the commit number; the newest TUTTI_ELASTIC_KEEP commits are kept. A "%h" in
// TUTTI_ELASTIC_DIR is replaced by the host name, for a file system that hosts share. The
// variables are read when the State is constructed; without TUTTI_ELASTIC_DIR commits are
// agreed on but written nowhere, and restore() finds none.
//
// The collective members must be called by every rank, in the same order. Not thread-safe:
// use a State from the training loop's thread. The registered objects must outlive it.
class TUTTI_API State {
 public:
  // `name` tells the States of one job (and their files) apart: 1 to 200 letters, digits, '_'
  // or '-', one live State per name in a process. Throws Error(InvalidArgument) for another
  // name, a name a live State of this process holds (their commits would overwrite each
  // other's), or a malformed
  // TUTTI_ELASTIC_KEEP / HOROVOD_ELASTIC_KEEP. Installs the SIGUSR2 handler through which the
  // launcher asks the job to stop (see commit()); a handler already installed is still called.
  explicit State(std::string name = "state");
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Registers state under `key` (unique within the State: a second add() of a key, or an empty
  // key, is Error(InvalidArgument)). Each is saved by commit() and overwritten in place by
  // restore() and sync(); nothing is read or written at registration.
  //   parameters: the tensors' values (e.g. model.named_parameters(), or named_buffers() for
  //               BatchNorm's running statistics), copied into the same tensors, so the
  //               optimizer and the model keep sharing them.
  //   optimizer:  its state_dict(), loaded with load_state_dict(). A ZeroRedundancyOptimizer
  //               (over all the ranks; over a smaller set InvalidArgument) is committed in the
  //               unsharded layout, consolidated to each rank that writes (commit() and sync()
  //               then gather its state: collective over its set, which is every rank), and
  //               restored into each rank's shard at any world size; it is left consolidated
  //               to the last of those ranks.
  //   sampler:    its epoch() and position() (see DistributedSampler: a sampler restored at
  //               another world size continues the epoch). A commit of a sampler over another
  //               data set size, seed, shuffle or drop_last is refused by restore().
  //   value, bytes: copied.
  //   object:     Tutti addition: its save() and prepare_load() (see Stateful).
  void add(std::string key, nn::NamedParameters parameters);
  void add(std::string key, optim::Optimizer& optimizer);
  void add(std::string key, data::DistributedSampler& sampler);
  void add(std::string key, std::int64_t& value);
  void add(std::string key, std::vector<std::uint8_t>& bytes);
  void add(std::string key, Stateful object);

  // Called by run(), in registration order, after it restored a commit written at another
  // world size: rescale the learning rate, rebuild what depends on the number of ranks.
  void on_reset(std::function<void()> callback);

  // Collective: saves the registered values as commit commits() + 1 on every host and waits
  // until every host has written it. Then throws HostsUpdated on every rank if any rank
  // received SIGUSR2 (tuttirun sends it through mpirun when the host list changed) since the
  // last commit. A host whose write fails logs a warning; if no host could write it, throws
  // Error(InvalidArgument) on every rank naming the directory, and commits() is unchanged.
  // Errors of the runtime (ShutDown, ...) propagate.
  void commit();

  // Collective: finds the newest commit of this State that any host can read (files that fail
  // their checksum or do not parse are skipped with a warning) and loads it on every rank.
  // Returns false, changing nothing, if there is none. Throws Error(InvalidArgument), changing
  // nothing, if the commit does not match what was registered (another key set, shapes,
  // dtypes, sampler). Also removes what writes of this host that were cut off left behind.
  bool restore();

  // Collective: makes every rank's registered values (and commits()) equal to those of
  // `root_rank` (a global rank; else Error(InvalidArgument) on every rank). A
  // ZeroRedundancyOptimizer's state is the ranks' together, each shard's its owner's: it is
  // consolidated to the root and every rank loads its shard of that, as it was.
  void sync(int root_rank = 0);

  // Commits made in this job, over all its launches: the restored commit's number, plus one
  // per commit() since. 0 before the first.
  std::int64_t commits() const;

  // The world size of the commit restore() loaded last, or 0 if it loaded none. run() calls
  // the reset callbacks when this differs from tutti::size().
  int restored_world_size() const;
  // Calls the on_reset() callbacks, in registration order (run() does this for you).
  void reset();

  const std::string& name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The exit status that asks scripts/tuttirun to relaunch the job (EX_TEMPFAIL).
inline constexpr int kRelaunchExitCode = 75;

// The elastic training loop: restore() (or, with no commit, sync() from rank 0), reset() when
// the commit was written at another world size, then train(state); returns 0 when train
// returns. Returns kRelaunchExitCode (return it from main) when train throws HostsUpdated, or
// when anything throws an Error that stopped Tutti's runtime (ShutDown, Stalled,
// Communication): a peer failed or stalled, and the launcher should relaunch from the last
// commit. Any other exception propagates (a bug in the program would recur after a relaunch).
// Collective.
TUTTI_API int run(State& state, const std::function<void(State&)>& train);

}  // namespace tutti::elastic

// SPDX-License-Identifier: Apache-2.0
// elastic::State: registration, commit, restore and sync (see tutti/elastic.h).
//
// Note [Elastic agreement]
// Every collective member ends with a small allreduce that makes all ranks reach the same
// outcome: commit() agrees that some host wrote the commit and whether any rank was asked to
// stop; restore() agrees on the newest commit and on the rank that has it; restore() and
// sync() agree that every rank could load what the source sent. A rank that fails alone
// (an unreadable file, a refused commit) therefore never leaves the others waiting in the
// next collective: they all throw, or all go on.
//
// Note [ZeRO in a State]
// A ZeroRedundancyOptimizer's state is sharded: each member holds its shard's, and its
// state_dict() exists only on the member it was consolidated to. A commit file holds the whole
// state, as every host's copy must, in the unsharded layout, which fits any world size (its
// load_state_dict() keeps each member's shard of it). So commit() consolidates every ZeRO
// optimizer to each rank that writes, one after the other (a gather of the state per host:
// PyTorch's way to checkpoint one), and that rank encodes right after its consolidation, before
// the next one clears it; sync() consolidates to the root. Loading is local, but a member
// refuses only the tensors it owns, so restore() and sync() agree on the optimizers' loads
// before anything else changes, and put them back on every rank if one refused.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/base/strings.h"
#include "src/common/throw.h"
#include "src/elastic/commit_store.h"
#include "src/elastic/entry.h"
#include "src/elastic/settings.h"
#include "src/elastic/snapshot.h"
#include "src/elastic/stop_request.h"
#include "tutti/collectives.h"
#include "tutti/elastic.h"
#include "tutti/optim/zero.h"
#include "tutti/runtime.h"

namespace tutti::elastic {
namespace {

using detail::str_cat;
using detail::throw_invalid_argument;
using internal::Level;
using internal::log_line;

void check_name(const std::string& name) {
  const bool ok =
      !name.empty() && name.size() <= 200 && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-';
      });
  if (!ok) {
    throw_invalid_argument("elastic::State: name '", name,
                           "' must be 1 to 200 letters, digits, '_' or '-' (it names files)");
  }
}

internal::Entry entry_of(std::string key, internal::EntryKind kind) {
  internal::Entry entry;
  entry.key = std::move(key);
  entry.kind = kind;
  return entry;
}

// Max over the ranks of each value. Collective.
void agree_max(std::vector<std::int64_t>& values, const std::string& name) {
  allreduce(TensorView(values.data(), {static_cast<std::int64_t>(values.size())}), name,
            {.op = ReduceOp::Max});
}

}  // namespace

const char* HostsUpdated::what() const noexcept {
  return "tutti::elastic::HostsUpdated: the launcher asked the job to stop at this commit (the "
         "host list changed)";
}

// Note [One State per name]
// A State's name names its commit files: two live States of one name in a process wrote over
// each other's commits, and the first one's restore() then failed on the second one's keys. So
// a name is claimed for the life of its State, and a second claim is InvalidArgument. (Outside
// the anonymous namespace: State::Impl holds one.)
class NameClaim {
 public:
  explicit NameClaim(const std::string& name) : name_(name) {
    const std::lock_guard<std::mutex> lock(mutex());
    if (!claimed().insert(name_).second) {
      throw_invalid_argument("elastic::State '", name_,
                             "': another State of this name is alive in this process (their "
                             "commits would overwrite each other's); give each State its own name");
    }
  }
  ~NameClaim() {
    const std::lock_guard<std::mutex> lock(mutex());
    claimed().erase(name_);
  }
  NameClaim(const NameClaim&) = delete;
  NameClaim& operator=(const NameClaim&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::set<std::string>& claimed() {
    static std::set<std::string> names;
    return names;
  }
  std::string name_;
};

struct State::Impl {
  Impl(std::string state_name, const internal::Settings& settings)
      : claim(state_name),
        name(std::move(state_name)),
        store(settings.directory, name, settings.keep) {}

  NameClaim claim;  // First: released last, once nothing writes under the name.
  std::string name;
  internal::CommitStore store;
  std::vector<internal::Entry> entries;
  std::vector<std::function<void()>> callbacks;
  std::int64_t commits = 0;
  int restored_world_size = 0;

  void add(internal::Entry entry) {
    if (entry.key.empty()) throw_invalid_argument("elastic::State '", name, "': an empty key");
    for (const internal::Entry& e : entries) {
      if (e.key == entry.key) {
        throw_invalid_argument("elastic::State '", name, "': key '", entry.key,
                               "' was added already");
      }
    }
    entries.push_back(std::move(entry));
  }

  std::string op_name(std::string_view what) const { return str_cat("elastic.", name, ".", what); }

  bool has_zero() const {
    return std::any_of(entries.begin(), entries.end(), [](const internal::Entry& e) {
      return e.kind == internal::EntryKind::Optimizer &&
             dynamic_cast<const optim::ZeroRedundancyOptimizer*>(e.optimizer) != nullptr;
    });
  }
  // Consolidates every ZeRO optimizer's state to global rank `to`. Collective.
  void consolidate_zero_to(int to) {
    for (const internal::Entry& e : entries) {
      if (e.kind != internal::EntryKind::Optimizer) continue;
      if (auto* zero = dynamic_cast<optim::ZeroRedundancyOptimizer*>(e.optimizer))
        zero->consolidate_state_dict(to);
    }
  }
  // Calls `encode` on each rank where `encodes_here` (Note [ZeRO in a State]): where ZeRO
  // optimizers are registered, right after consolidating them to that rank. Collective then.
  void encode_where(bool encodes_here, const std::function<void()>& encode) {
    if (!has_zero()) {
      if (encodes_here) encode();
      return;
    }
    std::vector<std::int64_t> encoders(static_cast<std::size_t>(size()), 0);
    encoders[static_cast<std::size_t>(rank())] = encodes_here ? 1 : 0;
    agree_max(encoders, op_name("encoders"));
    for (int r = 0; r < size(); ++r) {
      if (encoders[static_cast<std::size_t>(r)] == 0) continue;
      consolidate_zero_to(r);
      if (r == rank()) encode();
    }
  }

  // Decodes `bytes` from `source` and loads them on this rank (on `source` too if
  // `source_loads`: it sent a file, not its own values), then agrees with the others (Note
  // [Elastic agreement]). Returns the commit loaded; throws on every rank if any failed.
  internal::Snapshot load_agreed(const std::string& bytes, int source, std::string_view what,
                                 bool source_loads) {
    std::optional<internal::Snapshot> snapshot;
    internal::ObjectLoads objects;
    internal::OptimizerStates replaced;
    std::string why;
    const bool loads = rank() != source || source_loads;
    try {
      snapshot = internal::decode(bytes);
      internal::check_matches(*snapshot, entries);
      if (loads) {
        objects = internal::prepare_objects(*snapshot, entries);  // Changes nothing.
        // Agreed on before the rest changes (Note [ZeRO in a State]).
        replaced = internal::load_optimizers(*snapshot, entries);
      }
    } catch (const std::exception& e) {  // Error, or a user optimizer's own exception.
      why = bytes.empty() ? str_cat("rank ", source, " had nothing to send (its log says why)")
                          : e.what();
    }
    std::vector<std::int64_t> failed = {why.empty() ? 0 : 1};
    agree_max(failed, op_name(str_cat(what, ".loaded")));
    if (failed[0] != 0) {
      replaced.put_back();
      throw_invalid_argument(why.empty() ? str_cat("elastic::State '", name, "': ", what,
                                                   " failed on another rank (its log says why)")
                                         : why);
    }
    if (loads) internal::load_values(*snapshot, entries, objects);
    return std::move(*snapshot);
  }
};

State::State(std::string name) {
  check_name(name);
  impl_ = std::make_unique<Impl>(std::move(name), internal::read_settings());
  internal::install_stop_handler();
}

State::~State() = default;

const std::string& State::name() const { return impl_->name; }

void State::add(std::string key, nn::NamedParameters parameters) {
  std::set<std::string> names;
  for (const auto& [name, variable] : parameters) {
    if (!variable.defined()) {
      throw_invalid_argument("elastic::State::add('", key, "'): '", name,
                             "' is an empty nn::Variable");
    }
    if (!names.insert(name).second) {
      throw_invalid_argument("elastic::State::add('", key, "'): two tensors named '", name, "'");
    }
  }
  internal::Entry entry = entry_of(std::move(key), internal::EntryKind::Parameters);
  entry.parameters = std::move(parameters);
  impl_->add(std::move(entry));
}

void State::add(std::string key, optim::Optimizer& optimizer) {
  // Note [ZeRO in a State]: its state is consolidated to the ranks that write, which must be
  // members of its set; a State's ranks are the job's.
  const auto* zero = dynamic_cast<const optim::ZeroRedundancyOptimizer*>(&optimizer);
  if (zero != nullptr && zero->process_set().size() != size()) {
    throw_invalid_argument("elastic::State::add: '", key,
                           "' is a ZeroRedundancyOptimizer over process set ",
                           zero->process_set().id(), " (", zero->process_set().size(), " of ",
                           size(), " ranks); a State holds one only over all the ranks");
  }
  internal::Entry entry = entry_of(std::move(key), internal::EntryKind::Optimizer);
  entry.optimizer = &optimizer;
  impl_->add(std::move(entry));
}

void State::add(std::string key, data::DistributedSampler& sampler) {
  internal::Entry entry = entry_of(std::move(key), internal::EntryKind::Sampler);
  entry.sampler = &sampler;
  impl_->add(std::move(entry));
}

void State::add(std::string key, std::int64_t& value) {
  internal::Entry entry = entry_of(std::move(key), internal::EntryKind::Int64);
  entry.value = &value;
  impl_->add(std::move(entry));
}

void State::add(std::string key, std::vector<std::uint8_t>& bytes) {
  internal::Entry entry = entry_of(std::move(key), internal::EntryKind::Bytes);
  entry.bytes = &bytes;
  impl_->add(std::move(entry));
}

void State::add(std::string key, Stateful object) {
  if (!object.save || !object.prepare_load) {
    throw_invalid_argument("elastic::State::add('", key, "'): the Stateful's ",
                           object.save ? "prepare_load" : "save", " is an empty function");
  }
  internal::Entry entry = entry_of(std::move(key), internal::EntryKind::Stateful);
  entry.object = std::move(object);
  impl_->add(std::move(entry));
}

void State::on_reset(std::function<void()> callback) {
  if (!callback) throw_invalid_argument("elastic::State::on_reset: an empty callback");
  impl_->callbacks.push_back(std::move(callback));
}

void State::reset() {
  for (const std::function<void()>& callback : impl_->callbacks) callback();
}

std::int64_t State::commits() const { return impl_->commits; }

int State::restored_world_size() const { return impl_->restored_world_size; }

void State::commit() {
  Impl& s = *impl_;
  const std::int64_t number = s.commits + 1;
  std::string problem;
  // [written on some host, a rank was asked to stop, a host's write failed]
  std::vector<std::int64_t> flags = {0, internal::stop_requested() ? 1 : 0, 0};
  const bool writes = s.store.enabled() && local_rank() == 0;
  std::string bytes;
  s.encode_where(writes, [&] {
    try {
      bytes = internal::encode(s.name, number, size(), s.entries);
    } catch (const std::exception& e) {  // Error, or a user optimizer's own exception.
      problem = e.what();
    }
  });
  if (writes) {
    if (problem.empty()) {
      try {
        problem = s.store.write(number, bytes);
      } catch (const std::exception& e) {
        problem = e.what();
      }
    }
    flags[problem.empty() ? 0 : 2] = 1;
  }
  agree_max(flags, s.op_name("commit"));
  if (s.store.enabled() && flags[0] == 0) {
    throw_invalid_argument(
        "elastic::State '", s.name, "': commit ", number, " could not be written on any host",
        problem.empty() ? " (see the first rank of each host)" : str_cat(": ", problem));
  }
  if (!problem.empty()) {
    log_line(Level::Warning, str_cat("commit ", number, " of '", s.name,
                                     "' is missing on this host (other hosts have it): ", problem));
  }
  s.commits = number;
  if (flags[1] != 0) {
    internal::clear_stop_request();
    if (rank() == 0) {
      log_line(Level::Info, str_cat("the launcher asked the job to stop: commit ", number, " of '",
                                    s.name, "' is the one the relaunched job restores"));
    }
    throw HostsUpdated();
  }
}

bool State::restore() {
  Impl& s = *impl_;
  std::optional<internal::CommitStore::Found> found;
  if (s.store.enabled() && local_rank() == 0) {
    const int removed = s.store.remove_leftovers();
    if (removed > 0) {
      log_line(Level::Info, str_cat("removed ", removed, " unfinished commit file(s) of '", s.name,
                                    "' from ", s.store.directory()));
    }
    std::vector<std::string> problems;
    found = s.store.newest(
        [&](std::int64_t commit, std::string_view bytes) -> std::string {
          try {
            const internal::Snapshot snapshot = internal::decode(bytes);
            if (snapshot.name != s.name) return str_cat("written by State '", snapshot.name, "'");
            // A copied or renamed file: loading it would go back to an older state at every
            // relaunch, and pruning by name would keep it over the newer commits.
            if (snapshot.commit != commit) {
              return str_cat("holds commit ", snapshot.commit, ", not the ", commit,
                             " its name says (a copied or renamed file)");
            }
            return "";
          } catch (const std::exception& e) {  // Error, or bad_alloc: the file is skipped.
            return e.what();
          }
        },
        &problems);
    for (const std::string& problem : problems) {
      log_line(Level::Warning, str_cat("skipping a commit: ", problem));
    }
  }
  std::vector<std::int64_t> newest = {found ? found->commit : -1};
  agree_max(newest, s.op_name("restore.newest"));
  if (newest[0] < 0) return false;
  std::vector<std::int64_t> source = {found && found->commit == newest[0] ? -rank() : -INT_MAX};
  agree_max(source, s.op_name("restore.source"));  // The lowest rank that has it.
  const int root = static_cast<int>(-source[0]);
  const std::string bytes = broadcast_object(rank() == root ? found->bytes : std::string(), root,
                                             s.op_name("restore.bytes"));
  const internal::Snapshot snapshot = s.load_agreed(bytes, root, "restore", /*source_loads=*/true);
  s.commits = snapshot.commit;
  s.restored_world_size = snapshot.world_size;
  if (rank() == 0) {
    log_line(Level::Info,
             str_cat("restored commit ", snapshot.commit, " of '", s.name, "' from rank ", root,
                     " (written at ", snapshot.world_size, " ranks; now ", size(), ")"));
  }
  return true;
}

void State::sync(int root_rank) {
  Impl& s = *impl_;
  if (root_rank < 0 || root_rank >= size()) {
    throw_invalid_argument("elastic::State::sync: root rank ", root_rank, " is outside [0, ",
                           size(), ")");
  }
  std::string bytes;
  if (s.has_zero()) s.consolidate_zero_to(root_rank);  // Note [ZeRO in a State].
  if (rank() == root_rank) {
    try {
      bytes = internal::encode(s.name, s.commits, size(), s.entries);
    } catch (const std::exception& e) {  // Error, or a user optimizer's own exception.
      log_line(Level::Warning, str_cat("sync of '", s.name, "': ", e.what()));
      // Sends nothing: every rank then fails the sync (Note [Elastic agreement]).
    }
  }
  bytes = broadcast_object(bytes, root_rank, s.op_name("sync"));
  const internal::Snapshot snapshot =
      s.load_agreed(bytes, root_rank, "sync", /*source_loads=*/false);
  s.commits = snapshot.commit;
}

}  // namespace tutti::elastic

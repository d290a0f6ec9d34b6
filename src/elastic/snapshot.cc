// SPDX-License-Identifier: Apache-2.0
// Encoding, decoding, checking and applying elastic commits: see Note [Commit format].
#include "src/elastic/snapshot.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/base/strings.h"
#include "src/common/throw.h"
#include "tutti/optim/zero.h"
#include "tutti/serialize.h"

namespace tutti::elastic::internal {
namespace {

using detail::str_cat;
using detail::throw_invalid_argument;

constexpr std::size_t kMagicBytes = sizeof(kCommitMagic) - 1;
constexpr int kDataTypeCount = static_cast<int>(DataType::Bool) + 1;
constexpr std::size_t kMaxDims = 64;  // Far above any layer's; a larger count is corruption.

void put_tensor(ByteWriter& w, const std::string& key, const std::string& name,
                const Tensor& tensor) {
  if (tensor.device().kind != Device::Kind::CPU) {
    throw_invalid_argument("elastic: '", key, "' tensor '", name,
                           "' is not on the CPU; State saves CPU tensors only");
  }
  w.put_string(name);
  w.put(static_cast<std::uint8_t>(tensor.dtype()));
  w.put_vector(tensor.shape());
  w.put_string(std::string_view(static_cast<const char*>(tensor.data()), tensor.byte_size()));
}

void put_tensors(ByteWriter& w, const std::string& key,
                 const std::vector<std::pair<std::string, Tensor>>& tensors) {
  w.put<std::uint64_t>(tensors.size());
  for (const auto& [name, tensor] : tensors) put_tensor(w, key, name, tensor);
}

void put_entry(ByteWriter& w, const Entry& e) {
  w.put(static_cast<std::uint8_t>(e.kind));
  w.put_string(e.key);
  switch (e.kind) {
    case EntryKind::Parameters: {
      std::vector<std::pair<std::string, Tensor>> tensors;
      for (const auto& [name, variable] : e.parameters)
        tensors.emplace_back(name, variable.value());
      put_tensors(w, e.key, tensors);
      return;
    }
    case EntryKind::Optimizer: {
      const optim::StateDict state = e.optimizer->state_dict();
      put_tensors(w, e.key, state.tensors);
      w.put<std::uint64_t>(state.scalars.size());
      for (const auto& [name, value] : state.scalars) {
        w.put_string(name);
        w.put(value);
      }
      return;
    }
    case EntryKind::Sampler:
      w.put<std::uint64_t>(e.sampler->epoch());
      w.put<std::uint64_t>(e.sampler->position());
      w.put<std::uint64_t>(e.sampler->dataset_size());
      w.put<std::uint64_t>(e.sampler->seed());
      w.put<std::uint8_t>(e.sampler->shuffle() ? 1 : 0);
      w.put<std::uint8_t>(e.sampler->drop_last() ? 1 : 0);
      return;
    case EntryKind::Int64: w.put(*e.value); return;
    case EntryKind::Bytes: w.put_vector(*e.bytes); return;
    case EntryKind::Stateful: {
      std::string bytes;
      try {
        bytes = e.object.save();
      } catch (const std::exception& error) {
        throw_invalid_argument("elastic: saving '", e.key, "' failed: ", error.what());
      } catch (...) {  // Whatever it is, the collective caller must learn of it (no hang).
        throw_invalid_argument("elastic: saving '", e.key, "' failed (not a std::exception)");
      }
      w.put_string(bytes);
      return;
    }
  }
  throw_invalid_argument("elastic: entry '", e.key, "' of unknown kind ", static_cast<int>(e.kind));
}

// Reads a commit body; every failure is "malformed" (the checksum passed, so the writer was
// not this format's).
class BodyReader {
 public:
  explicit BodyReader(std::string_view body) : r_(body) {}

  template <class T>
  T get() {
    T value{};
    if (!r_.get(&value)) malformed();
    return value;
  }
  std::string get_string() {
    std::string s;
    if (!r_.get_string(&s)) malformed();
    return s;
  }
  std::size_t get_count(std::size_t element_bytes) {
    std::size_t n = 0;
    if (!r_.get_count(&n, element_bytes)) malformed();
    return n;
  }
  SavedTensor get_tensor() {
    SavedTensor t;
    t.name = get_string();
    if (!r_.get_enum(&t.dtype, kDataTypeCount) || !r_.get_vector(&t.shape)) malformed();
    if (t.shape.size() > kMaxDims) malformed();
    std::uint64_t count = 1;
    for (std::int64_t d : t.shape) {
      if (d < 0) malformed();
      const auto extent = static_cast<std::uint64_t>(d);
      if (extent != 0 && count > UINT64_MAX / extent) malformed();
      count *= extent;
    }
    t.data = get_string();
    if (count > t.data.size() || t.data.size() != count * element_size(t.dtype)) malformed();
    return t;
  }
  // Grown as the elements are read, not sized from the count first: a count may claim one
  // element per remaining byte, and each takes far more memory than a byte (a damaged or crafted
  // file of 8 MB asked for 1.5 GB).
  std::vector<SavedTensor> get_tensors() {
    const std::size_t count = get_count(1);
    std::vector<SavedTensor> tensors;
    for (std::size_t i = 0; i < count; ++i) tensors.push_back(get_tensor());
    return tensors;
  }
  SavedEntry get_entry() {
    SavedEntry e;
    if (!r_.get_enum(&e.kind, kEntryKindCount)) malformed();
    e.key = get_string();
    switch (e.kind) {
      case EntryKind::Parameters: e.tensors = get_tensors(); break;
      case EntryKind::Optimizer: {
        e.tensors = get_tensors();
        for (std::size_t n = get_count(1); n > 0; --n) {
          std::string name = get_string();
          e.scalars[name] = get<double>();
        }
        break;
      }
      case EntryKind::Sampler:
        e.epoch = get<std::uint64_t>();
        e.position = get<std::uint64_t>();
        e.dataset_size = get<std::uint64_t>();
        e.seed = get<std::uint64_t>();
        e.shuffle = get<std::uint8_t>() != 0;
        e.drop_last = get<std::uint8_t>() != 0;
        if (e.position > e.dataset_size) malformed();
        break;
      case EntryKind::Int64: e.value = get<std::int64_t>(); break;
      case EntryKind::Bytes:
        if (!r_.get_vector(&e.bytes)) malformed();
        break;
      case EntryKind::Stateful: e.object = get_string(); break;
    }
    return e;
  }
  bool done() const { return r_.done(); }
  [[noreturn]] static void malformed() {
    throw_invalid_argument("malformed (written by another version of Tutti?)");
  }

 private:
  ByteReader r_;
};

[[noreturn]] void mismatch(const Snapshot& s, const std::string& why) {
  throw_invalid_argument("elastic: commit ", s.commit, " of '", s.name,
                         "' does not fit this program's State: ", why);
}

void check_tensors(const Snapshot& s, const SavedEntry& saved, const Entry& e) {
  if (saved.tensors.size() != e.parameters.size()) {
    mismatch(s, str_cat("'", e.key, "' holds ", saved.tensors.size(), " tensors, the program ",
                        e.parameters.size()));
  }
  for (std::size_t i = 0; i < saved.tensors.size(); ++i) {
    const SavedTensor& t = saved.tensors[i];
    const auto& [name, variable] = e.parameters[i];
    const Tensor& live = variable.value();
    if (t.name != name) {
      mismatch(s, str_cat("tensor ", i, " of '", e.key, "' is '", t.name, "' in the commit, '",
                          name, "' in the program"));
    }
    if (t.dtype != live.dtype() || t.shape != live.shape()) {
      mismatch(s,
               str_cat("'", e.key, "' tensor '", name, "' is ", to_string(t.dtype), " ",
                       detail::shape_string(t.shape), " in the commit, ", to_string(live.dtype()),
                       " ", detail::shape_string(live.shape()), " in the program"));
    }
    if (live.device().kind != Device::Kind::CPU) {
      mismatch(s, str_cat("'", e.key, "' tensor '", name, "' is not on the CPU"));
    }
  }
}

void check_sampler(const Snapshot& s, const SavedEntry& saved, const data::DistributedSampler& d) {
  if (saved.dataset_size != d.dataset_size() || saved.seed != d.seed() ||
      saved.shuffle != d.shuffle() || saved.drop_last != d.drop_last()) {
    mismatch(s, str_cat("sampler '", saved.key, "' covers ", saved.dataset_size, " samples (seed ",
                        saved.seed, ", shuffle ", saved.shuffle, ", drop_last ", saved.drop_last,
                        ") in the commit, ", d.dataset_size(), " (seed ", d.seed(), ", shuffle ",
                        d.shuffle(), ", drop_last ", d.drop_last(), ") in the program"));
  }
}

optim::StateDict state_dict_of(const SavedEntry& saved) {
  optim::StateDict state;
  for (const SavedTensor& t : saved.tensors) {
    Tensor tensor(t.dtype, t.shape);
    if (!t.data.empty()) std::memcpy(tensor.data(), t.data.data(), t.data.size());
    state.tensors.emplace_back(t.name, std::move(tensor));
  }
  state.scalars = saved.scalars;
  return state;
}

const SavedEntry& saved_entry(const Snapshot& s, const std::string& key) {
  for (const SavedEntry& e : s.entries) {
    if (e.key == key) return e;
  }
  mismatch(s, str_cat("it holds no '", key, "'"));
}

}  // namespace

std::string_view to_string(EntryKind kind) {
  switch (kind) {
    case EntryKind::Parameters: return "parameters";
    case EntryKind::Optimizer: return "optimizer";
    case EntryKind::Sampler: return "sampler";
    case EntryKind::Int64: return "int64";
    case EntryKind::Bytes: return "bytes";
    case EntryKind::Stateful: return "object";
  }
  return "unknown";
}

std::uint32_t crc32_of(std::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const char* data = bytes.data();
  std::size_t size = bytes.size();
  while (size > 0) {  // zlib's length is a uInt.
    const auto piece = static_cast<uInt>(std::min<std::size_t>(size, std::size_t{1} << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), piece);
    data += piece;
    size -= piece;
  }
  return static_cast<std::uint32_t>(crc);
}

std::string encode(const std::string& name, std::int64_t commit, int world_size,
                   const std::vector<Entry>& entries) {
  ByteWriter w;
  for (std::size_t i = 0; i < kMagicBytes; ++i) w.put(kCommitMagic[i]);
  w.put_string(name);
  w.put(commit);
  w.put<std::int32_t>(world_size);
  w.put<std::uint64_t>(entries.size());
  for (const Entry& e : entries) put_entry(w, e);
  w.put(crc32_of(w.bytes()));
  return w.take();
}

Snapshot decode(std::string_view bytes) {
  if (bytes.size() < kMagicBytes || bytes.substr(0, kMagicBytes) != kCommitMagic) {
    throw_invalid_argument("not a Tutti elastic commit (no ", kCommitMagic, " header)");
  }
  if (bytes.size() < kMagicBytes + sizeof(std::uint32_t)) throw_invalid_argument("truncated");
  std::uint32_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - sizeof stored, sizeof stored);
  const std::string_view covered = bytes.substr(0, bytes.size() - sizeof stored);
  if (crc32_of(covered) != stored) {
    throw_invalid_argument("checksum mismatch: the file is damaged or was cut short");
  }
  BodyReader r(covered.substr(kMagicBytes));
  Snapshot s;
  s.name = r.get_string();
  s.commit = r.get<std::int64_t>();
  s.world_size = r.get<std::int32_t>();
  if (s.commit < 0 || s.world_size < 1) BodyReader::malformed();
  const std::size_t entries = r.get_count(1);
  for (std::size_t i = 0; i < entries; ++i) s.entries.push_back(r.get_entry());  // As above.
  if (!r.done()) BodyReader::malformed();
  return s;
}

void check_matches(const Snapshot& s, const std::vector<Entry>& entries) {
  std::set<std::string> registered;
  for (const Entry& e : entries) registered.insert(e.key);
  for (const SavedEntry& saved : s.entries) {
    if (!registered.contains(saved.key)) {
      mismatch(s, str_cat("it holds '", saved.key, "', which the program did not add()"));
    }
  }
  for (const Entry& e : entries) {
    const SavedEntry& saved = saved_entry(s, e.key);
    if (saved.kind != e.kind) {
      mismatch(s, str_cat("'", e.key, "' is ", to_string(saved.kind), " in the commit, ",
                          to_string(e.kind), " in the program"));
    }
    if (e.kind == EntryKind::Parameters) check_tensors(s, saved, e);
    if (e.kind == EntryKind::Sampler) check_sampler(s, saved, *e.sampler);
  }
}

namespace {

// Where an optimizer's state before a load is saved and put back: a ZeroRedundancyOptimizer's
// own state_dict() exists only on the member it was consolidated to, so its shard's local
// optimizer's (load_state_dict() of the unsharded state replaces only that).
optim::Optimizer& undo_target(optim::Optimizer& optimizer) {
  if (auto* zero = dynamic_cast<optim::ZeroRedundancyOptimizer*>(&optimizer))
    return zero->local_optimizer();
  return optimizer;
}

}  // namespace

void OptimizerStates::put_back() {
  for (auto& [optimizer, state] : before) optimizer->load_state_dict(state);
  before.clear();
}

OptimizerStates load_optimizers(const Snapshot& s, const std::vector<Entry>& entries) {
  OptimizerStates replaced;
  try {
    for (const Entry& e : entries) {
      if (e.kind != EntryKind::Optimizer) continue;
      optim::Optimizer& undo = undo_target(*e.optimizer);
      optim::StateDict before = undo.state_dict();
      e.optimizer->load_state_dict(state_dict_of(saved_entry(s, e.key)));
      replaced.before.emplace_back(&undo, std::move(before));
    }
  } catch (const Error& error) {
    replaced.put_back();
    mismatch(s, error.what());
  }
  return replaced;
}

ObjectLoads prepare_objects(const Snapshot& s, const std::vector<Entry>& entries) {
  ObjectLoads loads;
  for (const Entry& e : entries) {
    if (e.kind != EntryKind::Stateful) continue;
    std::function<void()> load;
    try {
      load = e.object.prepare_load(saved_entry(s, e.key).object);
    } catch (const std::exception& error) {
      mismatch(s, str_cat("'", e.key, "' refused its bytes: ", error.what()));
    } catch (...) {  // As in put_entry().
      mismatch(s, str_cat("'", e.key, "' refused its bytes (not a std::exception)"));
    }
    if (!load) mismatch(s, str_cat("'", e.key, "': prepare_load() returned an empty function"));
    loads.push_back(std::move(load));
  }
  return loads;
}

void load_values(const Snapshot& s, const std::vector<Entry>& entries, const ObjectLoads& objects) {
  for (const Entry& e : entries) {
    const SavedEntry& saved = saved_entry(s, e.key);
    switch (e.kind) {
      case EntryKind::Parameters:
        for (std::size_t i = 0; i < saved.tensors.size(); ++i) {
          const std::string& data = saved.tensors[i].data;
          if (!data.empty())
            std::memcpy(e.parameters[i].second.value().data(), data.data(), data.size());
        }
        break;
      case EntryKind::Optimizer: break;  // load_optimizers().
      case EntryKind::Sampler:
        e.sampler->set_epoch(saved.epoch);
        e.sampler->set_position(static_cast<std::size_t>(saved.position));
        break;
      case EntryKind::Int64: *e.value = saved.value; break;
      case EntryKind::Bytes: *e.bytes = saved.bytes; break;
      case EntryKind::Stateful: break;  // `objects`, below.
    }
  }
  for (const std::function<void()>& load : objects) load();
}

void load_into(const Snapshot& s, const std::vector<Entry>& entries) {
  const ObjectLoads objects = prepare_objects(s, entries);
  load_optimizers(s, entries);
  load_values(s, entries, objects);
}

}  // namespace tutti::elastic::internal

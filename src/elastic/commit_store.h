// SPDX-License-Identifier: Apache-2.0
// The commit files of one elastic::State in one host's directory: atomic writes, the newest
// readable commit, pruning, and the leftovers of writes that were cut off. Local to this
// process: no communication.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tutti::elastic::internal {

// TUTTI_ELASTIC_DIR's value with "%h" replaced by this host's name and "%%" by "%".
std::string expand_directory(std::string_view pattern);

// Files in `directory`:
//   <name>.<commit>.commit                         a commit (decimal number, no padding)
//   .<name>.<commit>.<host>.<pid>.tmp              a commit being written by process <pid>
// Any thread, but one writer per directory and name at a time per host (State writes from
// the host's first rank only).
class CommitStore {
 public:
  // An empty `directory` disables the store: nothing is written, nothing found.
  CommitStore(std::string directory, std::string name, int keep);

  bool enabled() const { return !directory_.empty(); }
  const std::string& directory() const { return directory_; }

  // Writes `bytes` as commit `commit`: creates the directory if needed, writes a temporary
  // file, flushes it to disk, renames it into place and flushes the directory, so that a
  // crash at any point leaves either the previous commits or the new one. Then removes the
  // commits older than the newest `keep`. Returns "" on success, else what failed (the
  // temporary file is removed).
  std::string write(std::int64_t commit, std::string_view bytes) const;

  struct Found {
    std::int64_t commit = 0;
    std::string bytes;
  };
  // The commits present, newest first; if the folder could not be listed (all or part of it;
  // a folder not yet made is fine), why, in `problem` when given ("" otherwise).
  std::vector<std::int64_t> list(std::string* problem = nullptr) const;
  // The newest commit whose bytes `accept` takes, given the commit number of the file's name
  // (it returns "" for good bytes, else why not); each one refused is described in `problems`
  // ("<file>: <why>"), and a folder that could not be listed ("<folder>: cannot list ...").
  std::optional<Found> newest(
      const std::function<std::string(std::int64_t, std::string_view)>& accept,
      std::vector<std::string>* problems) const;
  // Removes this host's temporary files of this name whose writer is no longer running:
  // what a write cut off by a crash left. Returns how many it removed.
  int remove_leftovers() const;

  std::string path_of(std::int64_t commit) const;

 private:
  std::string directory_;
  std::string name_;
  int keep_;
};

}  // namespace tutti::elastic::internal

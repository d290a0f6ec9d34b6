// SPDX-License-Identifier: Apache-2.0
// Commit files on one host: see commit_store.h.
#include "src/elastic/commit_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "src/base/strings.h"

namespace tutti::elastic::internal {
namespace {

namespace fs = std::filesystem;
using detail::str_cat;

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

std::string errno_text() { return std::strerror(errno); }

// The decimal number that is all of `text`, or nothing.
std::optional<std::int64_t> to_number(std::string_view text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 0)
    return std::nullopt;
  return value;
}

// Writes all of `bytes` to `fd`, retrying short writes and interruptions.
bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// Flushes a directory's entries (the rename) to disk.
bool sync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

bool read_file(const std::string& path, std::string* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bytes->clear();
  char chunk[1 << 16];
  bool ok = true;
  while (true) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ok = false;
    if (n <= 0) break;
    bytes->append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return ok;
}

// Calls f(path, middle) for each file in `directory` named <prefix><middle><suffix> with a
// non-empty middle. Returns why the directory could not be read (all or part of it), or "" if
// it could or does not exist (no commit yet: not a problem).
template <typename F>
std::string for_each_file(const fs::path& directory, const std::string& prefix,
                          const std::string& suffix, F f) {
  std::error_code error;
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const std::string file = it->path().filename().string();
    if (file.size() <= prefix.size() + suffix.size() || !file.starts_with(prefix) ||
        !file.ends_with(suffix))
      continue;
    f(it->path(),
      std::string_view(file).substr(prefix.size(), file.size() - prefix.size() - suffix.size()));
  }
  if (!error || error == std::errc::no_such_file_or_directory) return "";
  return str_cat(directory.string(), ": cannot list the folder: ", error.message());
}

}  // namespace

std::string expand_directory(std::string_view pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'h') {
      out += host_name();
      ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == '%') {
      out += '%';
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

CommitStore::CommitStore(std::string directory, std::string name, int keep)
    : directory_(std::move(directory)), name_(std::move(name)), keep_(keep) {}

std::string CommitStore::path_of(std::int64_t commit) const {
  return str_cat(directory_, "/", name_, ".", commit, ".commit");
}

std::string CommitStore::write(std::int64_t commit, std::string_view bytes) const {
  std::error_code error;
  fs::create_directories(directory_, error);
  if (error) return str_cat("cannot create ", directory_, ": ", error.message());
  const std::string tmp =
      str_cat(directory_, "/.", name_, ".", commit, ".", host_name(), ".", ::getpid(), ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return str_cat("cannot create ", tmp, ": ", errno_text());
  // Flushed before the rename: otherwise a crash soon after could leave the new name on a
  // file whose data never reached the disk (the checksum would catch it, the commit be lost).
  bool ok = write_all(fd, bytes) && ::fsync(fd) == 0;
  std::string why = ok ? "" : str_cat("cannot write ", tmp, ": ", errno_text());
  if (::close(fd) != 0 && ok) {
    ok = false;
    why = str_cat("cannot write ", tmp, ": ", errno_text());
  }
  const std::string path = path_of(commit);
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    why = str_cat("cannot rename ", tmp, " to ", path, ": ", errno_text());
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return why;
  }
  // Best effort: the commit is in place; a directory that cannot be flushed (some network
  // file systems) only weakens what a power cut could undo.
  static_cast<void>(sync_directory(directory_));
  const std::vector<std::int64_t> present = list();
  for (std::size_t i = 0; i < present.size(); ++i) {
    if (present[i] <= commit - keep_) ::unlink(path_of(present[i]).c_str());
  }
  return "";
}

std::vector<std::int64_t> CommitStore::list(std::string* problem) const {
  std::vector<std::int64_t> commits;
  if (!enabled()) return commits;
  const std::string why =
      for_each_file(directory_, name_ + ".", ".commit", [&](const fs::path&, std::string_view m) {
        if (std::optional<std::int64_t> commit = to_number(m)) commits.push_back(*commit);
      });
  if (problem != nullptr) *problem = why;
  std::sort(commits.rbegin(), commits.rend());
  return commits;
}

std::optional<CommitStore::Found> CommitStore::newest(
    const std::function<std::string(std::int64_t, std::string_view)>& accept,
    std::vector<std::string>* problems) const {
  std::string unlisted;
  const std::vector<std::int64_t> commits = list(&unlisted);
  // A folder that cannot be listed looks like one without commits: say so, or a job that has
  // commits (permissions, a stale NFS handle) silently starts over.
  if (!unlisted.empty()) problems->push_back(unlisted);
  for (std::int64_t commit : commits) {
    Found found{.commit = commit, .bytes = {}};
    const std::string path = path_of(commit);
    if (!read_file(path, &found.bytes)) {
      problems->push_back(str_cat(path, ": cannot read: ", errno_text()));
      continue;
    }
    const std::string why = accept(commit, found.bytes);
    if (why.empty()) return found;
    problems->push_back(str_cat(path, ": ", why));
  }
  return std::nullopt;
}

int CommitStore::remove_leftovers() const {
  if (!enabled()) return 0;
  int removed = 0;
  const std::string prefix = "." + name_ + ".";
  const std::string suffix = ".tmp";
  const std::string host = host_name();
  for_each_file(directory_, prefix, suffix, [&](const fs::path& path, std::string_view middle) {
    // <commit>.<host>.<pid>; the host name may itself hold dots.
    const std::size_t first = middle.find('.');
    const std::size_t last = middle.rfind('.');
    if (first == std::string_view::npos || first == last) return;
    const std::optional<std::int64_t> pid = to_number(middle.substr(last + 1));
    if (!to_number(middle.substr(0, first)) || !pid ||
        middle.substr(first + 1, last - first - 1) != host)
      return;
    // Another host's writer (a shared file system) or a live one of ours is left alone.
    if (::kill(static_cast<pid_t>(*pid), 0) == 0 || errno != ESRCH) return;
    if (::unlink(path.c_str()) == 0) ++removed;
  });
  return removed;
}

}  // namespace tutti::elastic::internal

// SPDX-License-Identifier: Apache-2.0
// Captures what this process writes to file descriptor 2 (stderr), for tests that check log
// lines (STYLE.md 9.2: no global log sink, so the descriptor itself is redirected).
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <string>

namespace tutti::test {

// While alive, fd 2 points at a temporary file (a file, not a pipe, so a chatty writer cannot
// block on a full pipe). text() stops the capture, restores fd 2 and returns what was written.
// Not thread-safe; other threads' stderr output in the meantime is captured too.
class CaptureStderr {
 public:
  CaptureStderr() {
    char path[] = "/tmp/tutti_stderr_XXXXXX";
    file_ = mkstemp(path);
    if (file_ >= 0) unlink(path);  // Anonymous: gone when closed.
    fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    if (file_ >= 0 && saved_ >= 0) dup2(file_, STDERR_FILENO);
  }
  CaptureStderr(const CaptureStderr&) = delete;
  CaptureStderr& operator=(const CaptureStderr&) = delete;
  ~CaptureStderr() { stop(); }

  // Restores stderr (once) and returns everything captured.
  std::string text() {
    stop();
    return text_;
  }

 private:
  void stop() {
    if (saved_ < 0) return;
    fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    saved_ = -1;
    if (file_ < 0) return;
    lseek(file_, 0, SEEK_SET);
    char buffer[4096];
    for (ssize_t n; (n = read(file_, buffer, sizeof buffer)) > 0;) {
      text_.append(buffer, static_cast<std::size_t>(n));
    }
    close(file_);
    file_ = -1;
  }

  int file_ = -1;
  int saved_ = -1;
  std::string text_;
};

// How many times `needle` occurs in `haystack`.
inline int count_occurrences(const std::string& haystack, const std::string& needle) {
  int count = 0;
  for (std::size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

}  // namespace tutti::test

// SPDX-License-Identifier: Apache-2.0
// What the shared RPC cases have in common (Note [Shared RPC cases] in rpc_cases.h): worker
// names and the verdict.
#include "test/support/rpc_cases.h"

#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>

#include "src/base/strings.h"

namespace tutti::test {
namespace {

std::string code_name(const std::optional<ErrorCode>& code) {
  return code ? std::string(to_string(*code)) : std::string("no error");
}

}  // namespace

std::string worker(int rank) { return "w" + std::to_string(rank); }

void Problems::expect_error(const std::optional<ErrorCode>& got, ErrorCode want,
                            const std::string& what) {
  if (got != want) list.push_back(what + ": got " + code_name(got) + ", want " + code_name(want));
}

void Problems::expect_contains(const std::string& text, std::initializer_list<std::string> parts,
                               const std::string& what) {
  for (const std::string& part : parts) {
    if (text.find(part) == std::string::npos) {
      list.push_back(what + ": \"" + text + "\" lacks \"" + part + "\"");
      return;
    }
  }
}

void Problems::expect_close(double difference, const std::string& what, double tolerance) {
  if (difference <= tolerance) return;
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", difference);
  list.push_back(what + ": off by " + text);
}

std::string Problems::text() const { return ::tutti::detail::join_list(list, "; "); }

}  // namespace tutti::test

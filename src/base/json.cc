// SPDX-License-Identifier: Apache-2.0
#include "src/base/json.h"

namespace tutti::detail {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 if there is none (overlong forms and
// surrogates included), so that a byte-string tensor name cannot make the file invalid.
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // Allowed range of the second byte.
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + length > s.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = i + 2; k < i + length; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    // Runs of plain ASCII, the common case, are appended whole.
    std::size_t end = i;
    for (; end < s.size(); ++end) {
      const auto c = static_cast<unsigned char>(s[end]);
      if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\') break;
    }
    out.append(s, i, end - i);
    if (end == s.size()) break;
    i = end;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t length = utf8_length(s, i);
      out += length == 0 ? std::string_view("\\ufffd") : s.substr(i, length);
      i += length == 0 ? 1 : length;
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        static constexpr char kHex[] = "0123456789abcdef";
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 0xF];
      }
    }
  }
  out += '"';
}

}  // namespace tutti::detail

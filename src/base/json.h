// SPDX-License-Identifier: Apache-2.0
// JSON text for the files Tutti writes (the timeline, flight-recorder dumps).
#pragma once

#include <string>
#include <string_view>

namespace tutti::detail {

// Appends `s` as a JSON string: quoted, escaped, invalid UTF-8 replaced by U+FFFD (a
// byte-string tensor name must not make the file invalid).
void append_json_string(std::string& out, std::string_view s);

}  // namespace tutti::detail

// SPDX-License-Identifier: Apache-2.0
// RequestList and ResponseList to and from bytes, through ByteWriter/ByteReader
// (include/tutti/serialize.h): the machine's native byte order (every rank of a job runs the same
// build on the same architecture), length-prefixed; decoding checks every length against the
// bytes that remain, so truncated or corrupt input is an Internal error, never a read past the
// end.
#pragma once

#include <string>
#include <string_view>

#include "src/common/status.h"
#include "src/core/request.h"

namespace tutti::core {

std::string encode(const RequestList& list);
std::string encode(const ResponseList& list);
Result<RequestList> decode_request_list(std::string_view bytes);
Result<ResponseList> decode_response_list(std::string_view bytes);

}  // namespace tutti::core

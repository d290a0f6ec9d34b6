// SPDX-License-Identifier: Apache-2.0
// Automatic names (Note [Automatic names] in src/core/automatic_name.h): made, recognised and
// their number taken off, against names written out by hand.
#include "src/core/automatic_name.h"

#include <string>

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

TEST_CASE("An automatic name is the op in lower case, .noname. and the count", "[names]") {
  CHECK(automatic_name(Collective::Allreduce, 0) == "allreduce.noname.0");
  CHECK(automatic_name(Collective::Allgather, 17) == "allgather.noname.17");
  CHECK(automatic_name(Collective::Barrier, 18446744073709551615ull) ==
        "barrier.noname.18446744073709551615");
}

TEST_CASE("Only a name ending in .noname. and decimal digits has an automatic number", "[names]") {
  CHECK(automatic_number("allreduce.noname.0") == 0u);
  CHECK(automatic_number("allreduce.noname.42") == 42u);
  CHECK(automatic_number("x.noname.7.noname.9") == 9u);  // The last marker counts.
  CHECK(automatic_number("mine.noname.18446744073709551615") == 18446744073709551615ull);
  CHECK_FALSE(automatic_number("mine.noname.18446744073709551616").has_value());  // Overflows.
  CHECK_FALSE(automatic_number("allreduce.noname.").has_value());
  CHECK_FALSE(automatic_number("allreduce.noname").has_value());
  CHECK_FALSE(automatic_number("allreduce.noname.4a").has_value());
  CHECK_FALSE(automatic_number("allreduce.noname.-4").has_value());
  CHECK_FALSE(automatic_number("broadcast_object.noname").has_value());
  CHECK_FALSE(automatic_number("grad.fc1.weight").has_value());
  CHECK_FALSE(automatic_number("").has_value());
  CHECK(automatic_number(".noname.5") == 5u);  // The marker at the very start.
  CHECK(automatic_number("x.noname.noname.5") == 5u);
  CHECK_FALSE(automatic_number("noname.5").has_value());  // The marker's first '.' missing.
  CHECK_FALSE(automatic_number("grad.12").has_value());   // Digits, no marker.
  CHECK_FALSE(automatic_number("12").has_value());
  // Only ASCII digits, whatever the locale calls a digit (Latin-1's superscript two).
  CHECK_FALSE(automatic_number("x.noname.\xb2").has_value());
}

TEST_CASE("Taking the number off leaves the op and the marker, and other names alone", "[names]") {
  CHECK(without_automatic_number("allreduce.noname.17") == "allreduce.noname");
  CHECK(without_automatic_number("allreduce.noname.") == "allreduce.noname.");
  CHECK(without_automatic_number("allreduce.noname.x1") == "allreduce.noname.x1");
  CHECK(without_automatic_number("grad.fc1") == "grad.fc1");
}

}  // namespace
}  // namespace tutti::core

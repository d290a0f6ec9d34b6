// SPDX-License-Identifier: Apache-2.0
// TUTTI_API marks the declarations libtutti.so exports; everything else is hidden.
#pragma once

#define TUTTI_API __attribute__((visibility("default")))

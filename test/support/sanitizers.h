// SPDX-License-Identifier: Apache-2.0
// TUTTI_THREAD_SANITIZER: defined where ThreadSanitizer instruments the test's code, for the few
// tests that leave out what its runtime cannot do or makes too slow (AddressSanitizer's
// counterpart, TUTTI_ADDRESS_SANITIZER, is src/base/asan.h's).
#pragma once

// gcc and clang spell it differently.
#if defined(__SANITIZE_THREAD__)
#define TUTTI_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TUTTI_THREAD_SANITIZER 1
#endif
#endif

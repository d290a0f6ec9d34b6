// SPDX-License-Identifier: Apache-2.0
// Clang's thread-safety attributes under Tutti's names; empty under other compilers. A clang
// build with -Wthread-safety -Werror (scripts/test) checks every annotated lock.
#pragma once

#if defined(__clang__)
#define TUTTI_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define TUTTI_THREAD_ANNOTATION_(x)
#endif

// On a class: objects of it are locks ("mutex").
#define TUTTI_CAPABILITY(name) TUTTI_THREAD_ANNOTATION_(capability(name))
// On an RAII class: it holds a lock from construction to destruction.
#define TUTTI_SCOPED_CAPABILITY TUTTI_THREAD_ANNOTATION_(scoped_lockable)
// On a data member: read or written only while `lock` is held.
#define TUTTI_GUARDED_BY(lock) TUTTI_THREAD_ANNOTATION_(guarded_by(lock))
// On a pointer member: the pointee is read or written only while `lock` is held.
#define TUTTI_PT_GUARDED_BY(lock) TUTTI_THREAD_ANNOTATION_(pt_guarded_by(lock))
// On a function: the caller holds these locks.
#define TUTTI_REQUIRES(...) TUTTI_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
// On a function: the caller must not hold these locks (the function takes them).
#define TUTTI_EXCLUDES(...) TUTTI_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
// On a function: it takes these locks and returns holding them.
#define TUTTI_ACQUIRE(...) TUTTI_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
// On a function: it takes these locks if it returns `result`, and returns holding them then.
#define TUTTI_TRY_ACQUIRE(...) TUTTI_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
// On a function: it releases these locks, which the caller held.
#define TUTTI_RELEASE(...) TUTTI_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
// On a function: it returns a reference to this lock (for annotations naming it).
#define TUTTI_RETURN_CAPABILITY(lock) TUTTI_THREAD_ANNOTATION_(lock_returned(lock))
// On a function whose locking the analysis cannot follow; say why next to it.
#define TUTTI_NO_THREAD_SAFETY_ANALYSIS TUTTI_THREAD_ANNOTATION_(no_thread_safety_analysis)

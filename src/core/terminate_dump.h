// SPDX-License-Identifier: Apache-2.0
// What a rank leaves behind when std::terminate() ends it: its flight recorder dump and, on
// rank 0, a complete timeline.
//
// Note [An uncaught exception leaves its traces]
// An exception nobody catches (on any thread) ends the process through std::terminate() and
// abort(): no destructor runs and shutdown() never comes. Such a rank left no flight recorder
// dump, so scripts/tutti-trace could only say that its dump was missing, and rank 0's timeline
// stopped at its last written batch (an empty file when the job was short). The handler
// installed by the first init() writes this rank's dump, with the exception's message as the
// reason, and closes the timeline; then it hands over to the handler that was there before
// (std::abort() by default), so the process still ends as it would have. The work runs on a
// thread of its own with a deadline: the thread that called std::terminate() may hold a lock the
// work needs (the runtime's, the recorder's), and a crash must not become a hang.
#pragma once

namespace tutti::core {

// Installs the handler of Note [An uncaught exception leaves its traces] in front of the current
// one. Once per process; an application's handler set later replaces it.
void install_terminate_dump();

}  // namespace tutti::core

// SPDX-License-Identifier: Apache-2.0
// The first exchange of a session: every rank's start-up outcome and rank 0's settings.
//
// Note [Agreed settings]
// Knobs of scope Job (src/common/knobs.def) decide what travels on the wire: ranks with
// different fusion thresholds, cache capacities or stream counts would run different
// collectives, then corrupt memory or hang. So before anything else init() runs this
// handshake over the control plane:
//  1. Every rank sends rank 0 how its own start went (its environment parsed, its settings
//     valid for it) and its text of every Job knob.
//  2. Rank 0 waits for all of them (at most TUTTI_START_TIMEOUT), checks what only it can
//     check (that the timeline file and the autotune log open), and answers every rank with
//     either the first failure, naming the rank, or its own Job knob values. It logs one
//     warning naming the ranks whose values differ.
//  3. Every rank fails init() alike on a failure; otherwise it uses rank 0's values for the
//     Job knobs (a rank whose own differ logs which, and the value it uses) and its own for
//     the others. A rank waits for the answer at most TUTTI_START_TIMEOUT as well.
#pragma once

#include <chrono>

#include "ops/control_plane.h"
#include "src/common/status.h"
#include "src/core/config.h"

namespace tutti::core {

// Collective over the plane's ranks; the thread that owns the plane (init()'s, before the
// communication thread starts). `local` is this rank's own Config, or why it has none;
// `timeout` bounds each wait. Returns the Config to use, or the failure every rank gets.
Result<Config> agree_settings(ops::ControlPlane& plane, const Result<Config>& local,
                              std::chrono::milliseconds timeout);

}  // namespace tutti::core

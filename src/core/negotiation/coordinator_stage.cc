// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/coordinator_stage.h"

#include "src/base/strings.h"

namespace tutti::core {

CoordinatorStage::CoordinatorStage(const Config& config, const ProcessSetTable& sets,
                                   Timeline* timeline, int size)
    : coordinator_(sets, config.cache_capacity,
                   cache_growth_limit(config.cache_capacity, config.cache_capacity_set, size),
                   timeline),
      stalls_(config),
      size_(size) {
  if (config.desync_check) desync_.emplace(sets, config.desync_setting);
}

std::vector<std::int32_t> CoordinatorStage::receive(int global_rank, RequestList list,
                                                    Clock::time_point now) {
  if (list.shutdown) {
    if (global_rank != 0) ++last_messages_;
    // A rank that stopped on an error takes the job down with it: its peers would wait for it
    // forever. The others get ShutDown naming it.
    begin_shutdown(
        Status(ErrorCode::ShutDown,
               list.shutdown_after_error
                   ? detail::str_cat("rank ", global_rank, " stopped: ", list.shutdown_message)
                   : detail::str_cat("rank ", global_rank, " shut down")),
        list.shutdown_after_error);
  }
  if (desync_) {
    if (Status desync = desync_->observe(global_rank, list); !desync.ok()) {
      // The list is not filed: no op at or past the divergence runs anywhere, however the
      // ranks' lists happened to arrive; every rank fails its pending ops with the Mismatch.
      begin_shutdown(desync, /*after_error=*/true);
      return {};
    }
  }
  std::vector<std::int32_t> resend;
  coordinator_.receive(global_rank, std::move(list), now, &resend);
  return resend;
}

void CoordinatorStage::begin_shutdown(const Status& why, bool after_error) {
  if (shutdown_) return;
  shutdown_ = why;
  shutdown_after_error_ = after_error;
}

std::optional<ResponseList> CoordinatorStage::take_list(Clock::time_point now) {
  if (bye_sent_) return std::nullopt;
  if (std::optional<Status> stalled = stalls_.inspect(coordinator_, now)) {
    begin_shutdown(*stalled, /*after_error=*/true);
  }
  if (!shutdown_ && !coordinator_.has_ready()) return std::nullopt;
  ResponseList list = coordinator_.take_ready();
  if (shutdown_) {
    list.shutdown = true;
    list.shutdown_after_error = shutdown_after_error_;
    list.shutdown_code = shutdown_->code();
    list.shutdown_message = std::string(shutdown_->message());
    bye_sent_ = true;
  }
  return list;
}

}  // namespace tutti::core

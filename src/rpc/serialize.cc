// SPDX-License-Identifier: Apache-2.0
#include "src/rpc/serialize.h"

#include <utility>

#include "src/base/strings.h"
#include "src/dist_autograd/dist_engine.h"
#include "src/rpc/agent.h"

namespace tutti::rpc::detail {

using dist_autograd::detail::make_recv;

Status check_message(const Message& message, const Agent& agent) {
  for (std::size_t i = 0; i < message.tensors.size(); ++i) {
    if (!message.tensors[i].defined()) {
      return invalid_argument(
          ::tutti::detail::str_cat("Message::tensors[", i, "] is an empty Variable"));
    }
  }
  for (std::size_t i = 0; i < message.rrefs.size(); ++i) {
    const std::shared_ptr<RRefImpl>& impl = RRefAccess::impl(message.rrefs[i]);
    if (impl == nullptr)
      return invalid_argument(::tutti::detail::str_cat("Message::rrefs[", i, "] is an empty RRef"));
    if (impl->agent.lock().get() != &agent) {
      return invalid_argument(::tutti::detail::str_cat(
          "Message::rrefs[", i,
          "] belongs to an RPC group that has shut down (or to another worker)"));
    }
  }
  return Status();
}

WirePayload Agent::to_wire(const Message& message, int destination) {
  WirePayload payload;
  payload.tensors.reserve(message.tensors.size());
  for (const nn::Variable& v : message.tensors) {
    payload.tensors.push_back(WireTensor{.requires_grad = v.requires_grad(), .value = v.value()});
  }
  payload.rrefs.reserve(message.rrefs.size());
  for (const RRef& r : message.rrefs)
    payload.rrefs.push_back(rrefs_.fork(*RRefAccess::impl(r), destination));
  payload.bytes = message.bytes;
  return payload;
}

Message Agent::from_wire(WirePayload payload, int source,
                         const std::shared_ptr<DistContext>& context,
                         std::int64_t autograd_message_id) {
  Message message;
  message.tensors.reserve(payload.tensors.size());
  for (std::size_t i = 0; i < payload.tensors.size(); ++i) {
    WireTensor& t = payload.tensors[i];
    if (t.requires_grad && context != nullptr && autograd_message_id >= 0) {
      message.tensors.push_back(
          make_recv(context->id(), source, autograd_message_id, i, std::move(t.value)));
    } else {
      message.tensors.emplace_back(std::move(t.value), t.requires_grad);
    }
  }
  message.rrefs.reserve(payload.rrefs.size());
  for (const WireRRef& r : payload.rrefs) message.rrefs.push_back(rrefs_.accept(r, source));
  message.bytes = std::move(payload.bytes);
  return message;
}

}  // namespace tutti::rpc::detail

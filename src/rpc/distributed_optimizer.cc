// SPDX-License-Identifier: Apache-2.0
// rpc::DistributedOptimizer and register_optimizer(): a trainer asks every owner of the
// parameters to build a local optimizer over its values, then to step it with the gradients a
// distributed autograd context accumulated there (torch.distributed.optim's _LocalOptimizer).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/base/strings.h"
#include "src/common/mutex.h"
#include "src/common/thread_annotations.h"
#include "src/rpc/agent.h"
#include "src/rpc/optimizer_host.h"
#include "src/rpc/rpc_runtime.h"
#include "src/rpc/serialize.h"
#include "tutti/optim/adam.h"
#include "tutti/optim/sgd.h"

namespace tutti::rpc {
namespace detail {
namespace {

using ::tutti::detail::str_cat;

// The options of a built-in optimizer: `defaults` lists every accepted name.
std::map<std::string, double> with_defaults(const std::string& optimizer,
                                            const std::map<std::string, double>& given,
                                            std::map<std::string, double> defaults) {
  for (const auto& [key, value] : given) {
    auto it = defaults.find(key);
    if (it == defaults.end()) {
      std::vector<std::string> known;
      for (const auto& [name, unused] : defaults) known.push_back(name);
      throw Error(ErrorCode::InvalidArgument,
                  str_cat("unknown option '", key, "' for optimizer '", optimizer, "' (it takes ",
                          ::tutti::detail::join_list(known), ")"));
    }
    it->second = value;
  }
  return defaults;
}

std::unique_ptr<optim::Optimizer> make_sgd(std::vector<nn::Variable> parameters,
                                           const std::map<std::string, double>& given) {
  const optim::SGDOptions d;
  auto o = with_defaults("sgd", given,
                         {{"lr", d.lr},
                          {"momentum", d.momentum},
                          {"dampening", d.dampening},
                          {"weight_decay", d.weight_decay},
                          {"nesterov", d.nesterov ? 1 : 0}});
  if (o["nesterov"] != 0 && o["nesterov"] != 1) {  // A flag: 0.5 is a mistake, not "true".
    throw Error(
        ErrorCode::InvalidArgument,
        str_cat("option 'nesterov' of optimizer 'sgd' must be 0 or 1, got ", o["nesterov"]));
  }
  return std::make_unique<optim::SGD>(std::move(parameters),
                                      optim::SGDOptions{.lr = o["lr"],
                                                        .momentum = o["momentum"],
                                                        .dampening = o["dampening"],
                                                        .weight_decay = o["weight_decay"],
                                                        .nesterov = o["nesterov"] == 1});
}

template <class Rule, class Options>
std::unique_ptr<optim::Optimizer> make_adam(const std::string& name,
                                            std::vector<nn::Variable> parameters,
                                            const std::map<std::string, double>& given) {
  const Options d;
  auto o = with_defaults(name, given,
                         {{"lr", d.lr},
                          {"beta1", d.beta1},
                          {"beta2", d.beta2},
                          {"eps", d.eps},
                          {"weight_decay", d.weight_decay}});
  return std::make_unique<Rule>(std::move(parameters), Options{.lr = o["lr"],
                                                               .beta1 = o["beta1"],
                                                               .beta2 = o["beta2"],
                                                               .eps = o["eps"],
                                                               .weight_decay = o["weight_decay"]});
}

struct Registry {
  tutti::detail::Mutex mutex;
  std::map<std::string, OptimizerFactory> factories TUTTI_GUARDED_BY(mutex);
};

Registry& registry() {
  static Registry* r = [] {  // Never destroyed: may be used during static teardown.
    auto* reg = new Registry();
    const tutti::detail::MutexLock lock(reg->mutex);  // Uncontended; for the analysis.
    reg->factories["sgd"] = make_sgd;
    reg->factories["adam"] = [](std::vector<nn::Variable> p,
                                const std::map<std::string, double>& o) {
      return make_adam<optim::Adam, optim::AdamOptions>("adam", std::move(p), o);
    };
    reg->factories["adamw"] = [](std::vector<nn::Variable> p,
                                 const std::map<std::string, double>& o) {
      return make_adam<optim::AdamW, optim::AdamWOptions>("adamw", std::move(p), o);
    };
    return reg;
  }();
  return *r;
}

// A local optimizer on an owner.
struct Hosted {
  std::unique_ptr<optim::Optimizer> optimizer;
};

// The owner's optimizers, by id. Any thread.
class OptimizerHost {
 public:
  // Held by every step on this worker: several trainers' optimizers may share parameters (and
  // their grad()), as with PyTorch's _LocalOptimizer.global_lock. (What it guards is tensor
  // data, which TUTTI_GUARDED_BY cannot name.)
  tutti::detail::Mutex step_mutex;

  void add(std::uint64_t id, std::shared_ptr<Hosted> hosted) {
    const tutti::detail::MutexLock lock(mutex_);
    optimizers_[id] = std::move(hosted);
  }
  std::shared_ptr<Hosted> find(std::uint64_t id) {
    const tutti::detail::MutexLock lock(mutex_);
    auto it = optimizers_.find(id);
    return it == optimizers_.end() ? nullptr : it->second;
  }
  std::shared_ptr<Hosted> remove(std::uint64_t id) {
    const tutti::detail::MutexLock lock(mutex_);
    auto it = optimizers_.find(id);
    if (it == optimizers_.end()) return nullptr;
    std::shared_ptr<Hosted> hosted = std::move(it->second);
    optimizers_.erase(it);
    return hosted;
  }

 private:
  tutti::detail::Mutex mutex_;
  std::map<std::uint64_t, std::shared_ptr<Hosted>> optimizers_ TUTTI_GUARDED_BY(mutex_);
};

std::string create_meta(const std::string& optimizer,
                        const std::map<std::string, double>& options) {
  ByteWriter w;
  w.put_string(optimizer);
  w.put<std::uint64_t>(options.size());
  for (const auto& [key, value] : options) {
    w.put_string(key);
    w.put(value);
  }
  return w.take();
}

std::string ids_meta(std::uint64_t a, std::int64_t b) {
  ByteWriter w;
  w.put(a);
  w.put(b);
  return w.take();
}

// "tutti.optim.create": the RRefs in the message are this owner's values.
Message create(Agent& agent, OptimizerHost& host, Incoming& request) {
  ByteReader meta(request.meta);
  std::string name;
  std::size_t count = 0;
  std::map<std::string, double> options;
  meta.get_string(&name);
  meta.get_count(&count, 16);
  for (std::size_t i = 0; i < count; ++i) {
    std::string key;
    double value = 0;
    meta.get_string(&key);
    meta.get(&value);
    options[key] = value;
  }
  if (!meta.done()) throw Error(ErrorCode::Internal, "corrupt optimizer creation request");
  const std::string where = str_cat("DistributedOptimizer on worker '", agent.name(), "': ");
  Result<OptimizerFactory> factory = find_optimizer_factory(name);
  if (!factory.ok())
    throw Error(ErrorCode::InvalidArgument, where + std::string(factory.status().message()));
  std::vector<nn::Variable> parameters;
  for (const RRef& ref : request.args.rrefs) {
    const std::shared_ptr<RRefImpl>& impl = RRefAccess::impl(ref);
    if (impl->owned == nullptr)
      throw Error(ErrorCode::Internal, where + "got an RRef it does not own");
    if (!impl->owned->value->wait_until(Clock::now() + agent.default_timeout())) {
      throw Error(ErrorCode::Timeout,
                  where + "an RRef's value did not appear within the RPC timeout");
    }
    const Result<Message>& value = impl->owned->value->result();
    if (!value.ok())
      throw Error(value.status().code(), where + std::string(value.status().message()));
    for (const nn::Variable& p : value.value().tensors) parameters.push_back(p);
  }
  auto hosted = std::make_shared<Hosted>();
  try {
    hosted->optimizer = factory.value()(std::move(parameters), options);
  } catch (const Error& e) {
    throw Error(e.code(), where + e.what());
  }
  if (hosted->optimizer == nullptr)
    throw Error(ErrorCode::InvalidArgument, where + "the factory of '" + name + "' returned null");
  const auto id = static_cast<std::uint64_t>(make_global_id(agent.rank()));
  host.add(id, std::move(hosted));
  ByteWriter out;
  out.put(id);
  return Message{.tensors = {}, .rrefs = {}, .bytes = out.take()};
}

// "tutti.optim.step": the context's gradients into grad(), then one step of the parameters they
// are for. A parameter the context has no gradient for (the backward pass did not reach it, or
// the context never reached this worker) is left out of the step, value and optimizer state, as
// PyTorch's functional optimizers skip a None gradient: stepped with zeros, momentum, weight
// decay and Adam's moments would move it.
Message step(Agent& agent, OptimizerHost& host, Incoming& request) {
  ByteReader meta(request.meta);
  std::uint64_t id = 0;
  std::int64_t context_id = -1;
  meta.get(&id);
  meta.get(&context_id);
  if (!meta.done()) throw Error(ErrorCode::Internal, "corrupt optimizer step request");
  std::shared_ptr<Hosted> hosted = host.find(id);
  if (hosted == nullptr) {
    throw Error(ErrorCode::InvalidArgument,
                str_cat("DistributedOptimizer: worker '", agent.name(),
                        "' has no such optimizer (destroyed, or from an earlier init_rpc())"));
  }
  std::shared_ptr<DistContext> context = agent.contexts().find(context_id);
  const tutti::detail::MutexLock lock(host.step_mutex);
  const std::vector<nn::Variable>& parameters = hosted->optimizer->parameters();
  std::vector<bool> stepped(parameters.size(), false);
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const nn::Variable& p = parameters[i];
    if (!p.requires_grad() || context == nullptr) continue;
    Tensor gradient = context->gradient(nn::detail::node_of(p).get());
    if (gradient.data() == nullptr) continue;
    std::span<const float> g = gradient.span<float>();
    std::copy(g.begin(), g.end(), p.grad().span<float>().begin());
    stepped[i] = true;
  }
  try {
    hosted->optimizer->step_only(stepped);
  } catch (const Error& e) {
    throw Error(e.code(),
                str_cat("DistributedOptimizer on worker '", agent.name(), "': ", e.what()));
  }
  return Message{};
}

}  // namespace

Result<OptimizerFactory> find_optimizer_factory(const std::string& name) {
  Registry& r = registry();
  const tutti::detail::MutexLock lock(r.mutex);
  auto it = r.factories.find(name);
  if (it != r.factories.end()) return it->second;
  std::vector<std::string> known;
  for (const auto& [key, unused] : r.factories) known.push_back(key);
  return invalid_argument(str_cat("unknown optimizer '", name,
                                  "' (registered: ", ::tutti::detail::join_list(known), ")"));
}

void register_optimizer_handlers(Agent& agent) {
  auto host = std::make_shared<OptimizerHost>();
  agent.add_handler("tutti.optim.create", Place::Pool, [&agent, host](Incoming& request) {
    return FutureState::ready(create(agent, *host, request));
  });
  agent.add_handler("tutti.optim.step", Place::Pool, [&agent, host](Incoming& request) {
    return FutureState::ready(step(agent, *host, request));
  });
  agent.add_handler("tutti.optim.destroy", Place::Pool, [host](Incoming& request) {
    ByteReader meta(request.meta);
    std::uint64_t id = 0;
    meta.get(&id);
    if (meta.done()) host->remove(id);
    return FutureState::ready(Message{});
  });
}

}  // namespace detail

void register_optimizer(const std::string& name, OptimizerFactory factory) {
  if (name.empty() || !factory) {
    throw Error(ErrorCode::InvalidArgument, "register_optimizer() needs a name and a factory");
  }
  detail::Registry& r = detail::registry();
  const tutti::detail::MutexLock lock(r.mutex);
  r.factories[name] = std::move(factory);
}

DistributedOptimizer::DistributedOptimizer(const std::string& optimizer,
                                           std::map<std::string, double> options,
                                           std::vector<RRef> parameters) {
  std::shared_ptr<detail::Agent> agent = detail::current_agent().value_or_throw();
  detail::find_optimizer_factory(optimizer).status().throw_if_error();
  if (parameters.empty()) {
    throw Error(ErrorCode::InvalidArgument,
                "DistributedOptimizer: no parameters (the list of RRefs is empty)");
  }
  Message all{.tensors = {}, .rrefs = parameters, .bytes = {}};
  detail::check_message(all, *agent).throw_if_error();
  std::vector<int> owners;  // In order of first appearance.
  std::map<int, Message> groups;
  for (const RRef& ref : parameters) {
    const int owner = ref.owner().id;
    if (!groups.contains(owner)) owners.push_back(owner);
    groups[owner].rrefs.push_back(ref);
  }
  const std::string meta = detail::create_meta(optimizer, options);
  std::vector<std::shared_ptr<detail::FutureState>> futures;
  for (int owner : owners) {
    futures.push_back(agent->call(owner, "tutti.optim.create", std::move(groups[owner]),
                                  agent->default_timeout(), -1, meta));
  }
  Status failure;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    const Result<Message>& result = futures[i]->wait();
    // A view of the reply itself: `ok ? bytes : std::string()` would be a temporary copy that
    // dies before the reads (ASan found that).
    detail::ByteReader reader(result.ok() ? std::string_view(result.value().bytes)
                                          : std::string_view());
    std::uint64_t id = 0;
    if (result.ok() && reader.get(&id) && reader.done()) {
      remotes_.push_back(Remote{.owner = owners[i], .id = id});
    } else if (failure.ok()) {
      failure = result.ok() ? Status(ErrorCode::Internal, "corrupt optimizer creation response")
                            : result.status();
    }
  }
  if (!failure.ok()) {  // Drop the optimizers that were made: no destructor runs after a throw.
    for (const Remote& r : remotes_) {
      static_cast<void>(agent->call(r.owner, "tutti.optim.destroy", {}, agent->default_timeout(),
                                    -1, detail::ids_meta(r.id, 0)));
    }
    failure.throw_if_error();
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  Result<std::shared_ptr<detail::Agent>> agent = detail::current_agent();
  if (!agent.ok()) return;
  for (const Remote& r : remotes_) {
    static_cast<void>(agent.value()->call(r.owner, "tutti.optim.destroy", {},
                                          agent.value()->default_timeout(), -1,
                                          detail::ids_meta(r.id, 0)));
  }
}

void DistributedOptimizer::step(std::int64_t context_id) {
  std::shared_ptr<detail::Agent> agent = detail::current_agent().value_or_throw();
  // An owner the context never reached rightly steps nothing, so the id is checked here, where
  // it must be known (PyTorch's step() retrieves the context first too): a released or made-up
  // id would otherwise step nothing anywhere, silently.
  if (agent->contexts().find(context_id) == nullptr) {
    throw Error(
        ErrorCode::InvalidArgument,
        ::tutti::detail::str_cat("DistributedOptimizer::step: no distributed autograd context ",
                                 context_id, " on worker '", agent->name(),
                                 "' (it ended, or was never created); step inside its Context"));
  }
  std::vector<std::shared_ptr<detail::FutureState>> futures;
  for (const Remote& r : remotes_) {
    futures.push_back(agent->call(r.owner, "tutti.optim.step", {}, agent->default_timeout(), -1,
                                  detail::ids_meta(r.id, context_id)));
  }
  detail::when_all(futures)->wait().status().throw_if_error();
}

}  // namespace tutti::rpc

// SPDX-License-Identifier: Apache-2.0
// A LibTorch optimizer's archive (src/libtorch/state_bytes.h), and a LibTorch module and
// optimizer as elastic::State entries (tutti::libtorch::stateful()).
//
// Note [A module's bytes]
// "libtorch.module/1", then per tensor (the parameters, then the buffers, in the module's
// order): name, DataType, shape, bytes; a ByteWriter body (tutti/serialize.h), inside a commit
// that carries its own checksum. Tutti's tensor layout rather than LibTorch's archive, because
// an archive's load replaces each tensor's storage (set_) whatever its shape: the check below
// needs the saved shapes before anything changes, and loading with copy_() keeps every tensor
// (and the storage an optimizer or a hook holds) where it is.
#include "src/libtorch/state_bytes.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/base/strings.h"
#include "src/common/throw.h"
#include "src/libtorch/dtypes.h"
#include "tutti/libtorch.h"
#include "tutti/serialize.h"

namespace tutti::libtorch::internal {

std::string save_optimizer(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive state;
  optimizer.save(state);
  archive.write("state", state);
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    torch::serialize::OutputArchive group;
    optimizer.param_groups()[g].options().serialize(group);
    archive.write("group/" + std::to_string(g), group);
  }
  archive.write("groups",
                torch::tensor(static_cast<std::int64_t>(optimizer.param_groups().size())));
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_optimizer(torch::optim::Optimizer& optimizer, std::string_view bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  torch::Tensor groups;
  archive.read("groups", groups);
  if (groups.item<std::int64_t>() != static_cast<std::int64_t>(optimizer.param_groups().size())) {
    detail::throw_invalid_argument("the saved optimizer has ", groups.item<std::int64_t>(),
                                   " parameter groups, this one ", optimizer.param_groups().size());
  }
  torch::serialize::InputArchive state;
  archive.read("state", state);
  optimizer.state().clear();
  optimizer.load(state);
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    torch::serialize::InputArchive group;
    archive.read("group/" + std::to_string(g), group);
    optimizer.param_groups()[g].options().serialize(group);
  }
}

}  // namespace tutti::libtorch::internal

namespace tutti::libtorch {
namespace {

using detail::str_cat;
using detail::throw_invalid_argument;

constexpr std::string_view kModuleTag = "libtorch.module/1";
constexpr int kDataTypeCount = static_cast<int>(DataType::Bool) + 1;

// The module's tensors in the order they are saved (Note [A module's bytes]).
std::vector<std::pair<std::string, torch::Tensor>> tensors_of(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : module.named_parameters()) {
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers()) {
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

struct SavedTensor {
  std::string name;
  DataType dtype = DataType::Float32;
  Shape shape;
  std::string data;
};

std::string save_module(const torch::nn::Module& module) {
  ByteWriter w;
  w.put_string(kModuleTag);
  const auto tensors = tensors_of(module);
  w.put<std::uint64_t>(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const std::optional<DataType> dtype = internal::tutti_type(tensor.scalar_type());
    if (!dtype) {
      throw_invalid_argument("'", name, "' is ", c10::toString(tensor.scalar_type()),
                             ", a dtype Tutti does not have");
    }
    const torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
    w.put_string(name);
    w.put(static_cast<std::uint8_t>(*dtype));
    w.put_vector(Shape(cpu.sizes().begin(), cpu.sizes().end()));
    w.put_string(std::string_view(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes()));
  }
  return w.take();
}

std::vector<SavedTensor> read_module(std::string_view bytes) {
  ByteReader r(bytes);
  std::string tag;
  std::size_t count = 0;
  if (!r.get_string(&tag) || tag != kModuleTag || !r.get_count(&count, 1)) {
    throw_invalid_argument("not the state of a LibTorch module (saved by another entry?)");
  }
  std::vector<SavedTensor> saved;
  for (std::size_t i = 0; i < count; ++i) {  // Grown as read: the count may be corrupt.
    SavedTensor t;
    if (!r.get_string(&t.name) || !r.get_enum(&t.dtype, kDataTypeCount) ||
        !r.get_vector(&t.shape) || !r.get_string(&t.data)) {
      throw_invalid_argument("a LibTorch module's state cut short at tensor ", i);
    }
    std::int64_t elements = 1;
    for (std::int64_t d : t.shape) elements = d < 0 ? -1 : elements * d;
    if (elements < 0 || t.data.size() != static_cast<std::size_t>(elements) * element_size(t.dtype))
      throw_invalid_argument("tensor '", t.name, "' holds the wrong number of bytes");
    saved.push_back(std::move(t));
  }
  if (!r.done()) throw_invalid_argument("bytes after a LibTorch module's state");
  return saved;
}

// Throws naming the first way `saved` differs from `live`.
void check_fits(const std::vector<SavedTensor>& saved,
                const std::vector<std::pair<std::string, torch::Tensor>>& live) {
  if (saved.size() != live.size()) {
    throw_invalid_argument(saved.size(), " tensors in the commit, ", live.size(), " in the module");
  }
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const SavedTensor& t = saved[i];
    const auto& [name, tensor] = live[i];
    if (t.name != name) {
      throw_invalid_argument("tensor ", i, " is '", t.name, "' in the commit, '", name,
                             "' in the module");
    }
    const Shape shape(tensor.sizes().begin(), tensor.sizes().end());
    const std::optional<DataType> dtype = internal::tutti_type(tensor.scalar_type());
    if (dtype != t.dtype || shape != t.shape) {
      throw_invalid_argument("'", name, "' is ", to_string(t.dtype), " ",
                             detail::shape_string(t.shape), " in the commit, ",
                             dtype ? to_string(*dtype) : c10::toString(tensor.scalar_type()), " ",
                             detail::shape_string(shape), " in the module");
    }
  }
}

}  // namespace

elastic::Stateful stateful(torch::nn::Module& module) {
  torch::nn::Module* m = &module;
  return {.save = [m] { return save_module(*m); },
          .prepare_load = [m](std::string_view bytes) -> std::function<void()> {
            auto saved = std::make_shared<const std::vector<SavedTensor>>(read_module(bytes));
            auto live = tensors_of(*m);
            check_fits(*saved, live);
            return [saved, live = std::move(live)] {
              const torch::NoGradGuard no_grad;
              for (std::size_t i = 0; i < live.size(); ++i) {
                const SavedTensor& t = (*saved)[i];
                if (t.data.empty()) continue;
                // from_blob wants a mutable pointer; copy_() only reads it.
                void* data = const_cast<char*>(t.data.data());
                live[i].second.copy_(torch::from_blob(
                    data, t.shape, torch::TensorOptions().dtype(*internal::torch_type(t.dtype))));
              }
            };
          }};
}

// Note [An optimizer's load, tried]
// LibTorch's load of an optimizer may throw half-way (a group of another size after the first
// group's state was replaced), and there is no way to load into a copy: it checks by loading.
// So prepare_load() saves the state as it stands, loads the commit's, and loads the saved state
// back, also when the first load threw; what it returns loads the commit's again, a load that
// has just succeeded.
elastic::Stateful stateful(torch::optim::Optimizer& optimizer) {
  torch::optim::Optimizer* o = &optimizer;
  return {.save = [o] { return internal::save_optimizer(*o); },
          .prepare_load = [o](std::string_view bytes) -> std::function<void()> {
            const std::string before = internal::save_optimizer(*o);
            try {
              internal::load_optimizer(*o, bytes);
            } catch (const c10::Error& e) {
              internal::load_optimizer(*o, before);
              throw_invalid_argument(e.what_without_backtrace());  // Not LibTorch's stack.
            } catch (...) {
              internal::load_optimizer(*o, before);
              throw;
            }
            internal::load_optimizer(*o, before);
            return [o, saved = std::string(bytes)] { internal::load_optimizer(*o, saved); };
          }};
}

}  // namespace tutti::libtorch

// SPDX-License-Identifier: Apache-2.0
// fashion_mnist's checkpoint file: see fashion_mnist_checkpoint.h.
#include "fashion_mnist_checkpoint.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fashion_mnist {
namespace {

namespace nn = tutti::nn;
namespace optim = tutti::optim;
using tutti::Tensor;

constexpr char kMagic[] = "TUTTICK2";     // Checkpoint header and trailer (8 bytes).
constexpr char kOldMagic[] = "TUTTICK1";  // The format before the checksum: refused.

// Checkpoint file, native byte order: "TUTTICK2", int64 epochs done; float32 tensors as
// {uint32 name length, name, uint32 dims, int64 shape[dims], data} named "param.<name>",
// "buffer.<name>" (BatchNorm statistics) and "optim.<state key>", then an empty name; the
// optimizer's scalars as {name, float64}, then an empty name; "TUTTICK2" again; last, the
// uint32 CRC-32 (zlib's) of every byte before it, so that a damaged file is refused.
std::vector<std::pair<std::string, Tensor>> model_tensors(const nn::Module& model) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, p] : model.named_parameters()) tensors.emplace_back("param." + name, p.value());
  for (auto& [name, b] : model.named_buffers()) tensors.emplace_back("buffer." + name, b.value());
  return tensors;
}

std::uint32_t checksum(const char* data, std::size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {  // zlib's length is a uInt.
    const auto piece = static_cast<uInt>(std::min<std::size_t>(size, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), piece);
    data += piece;
    size -= piece;
  }
  return static_cast<std::uint32_t>(crc);
}

}  // namespace

void save_checkpoint(const std::string& path, std::int64_t epochs, const nn::Module& model,
                     const optim::Optimizer& optimizer) {
  const optim::StateDict state = optimizer.state_dict();
  std::vector<std::pair<std::string, Tensor>> tensors = model_tensors(model);
  for (auto& [key, t] : state.tensors) tensors.emplace_back("optim." + key, t);
  std::string bytes;  // The file, built in memory for its checksum.
  auto put = [&bytes](const void* data, std::size_t size) {
    bytes.append(static_cast<const char*>(data), size);
  };
  auto put_name = [&](const std::string& name) {
    const auto length = static_cast<std::uint32_t>(name.size());
    put(&length, sizeof length);
    put(name.data(), length);
  };
  put(kMagic, 8);
  put(&epochs, sizeof epochs);
  for (auto& [name, t] : tensors) {
    if (t.dtype() != tutti::DataType::Float32) throw std::runtime_error(name + " is not float32");
    const auto dims = static_cast<std::uint32_t>(t.dim());
    put_name(name);
    put(&dims, sizeof dims);
    put(t.shape().data(), dims * sizeof(std::int64_t));
    put(t.data(), t.byte_size());
  }
  put_name("");
  for (auto& [name, value] : state.scalars) {
    put_name(name);
    put(&value, sizeof value);
  }
  put_name("");
  put(kMagic, 8);
  const std::uint32_t crc = checksum(bytes.data(), bytes.size());
  put(&crc, sizeof crc);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  const bool written = std::ferror(f) == 0 && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot write checkpoint " + path + ": " + std::strerror(errno));
  }
}

std::int64_t load_checkpoint(const std::string& path, nn::Module& model,
                             optim::Optimizer& optimizer, std::int64_t max_epochs) {
  auto fail = [&](const std::string& why) -> void {
    throw std::runtime_error("bad checkpoint " + path + ": " + why);
  };
  std::string bytes;
  {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (f == nullptr) fail(std::strerror(errno));
    char chunk[1 << 16];
    for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f.get())) > 0;) {
      bytes.append(chunk, n);
    }
    if (std::ferror(f.get())) fail(std::strerror(errno));
  }
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kOldMagic, 8) == 0) {
    fail("written in the old format TUTTICK1, which has no checksum; delete it to train anew");
  }
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    fail("not a Tutti checkpoint");
  }
  if (bytes.size() < 8 + 8 + 8 + sizeof(std::uint32_t)) fail("truncated");
  std::uint32_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - sizeof stored, sizeof stored);
  bytes.resize(bytes.size() - sizeof stored);
  if (checksum(bytes.data(), bytes.size()) != stored) {
    fail("checksum mismatch: the file is damaged");
  }
  std::size_t offset = 0;
  auto get = [&](void* data, std::size_t size) {
    if (size > bytes.size() - offset) fail("truncated");
    std::memcpy(data, bytes.data() + offset, size);
    offset += size;
  };
  auto get_name = [&] {
    std::uint32_t length = 0;
    get(&length, sizeof length);
    if (length > 4096) fail("bad name length");
    std::string name(length, '\0');
    get(name.data(), length);
    return name;
  };
  char magic[8] = {};
  std::int64_t epochs = 0;
  get(magic, 8);
  get(&epochs, sizeof epochs);
  if (epochs < 0 || epochs > max_epochs) {
    fail("epoch count " + std::to_string(epochs) + " outside 0 ... " + std::to_string(max_epochs) +
         " (--epochs)");
  }
  std::map<std::string, Tensor> tensors;
  optim::StateDict state;
  for (std::string name = get_name(); !name.empty(); name = get_name()) {
    std::uint32_t dims = 0;
    get(&dims, sizeof dims);
    if (dims > 8) fail("bad rank for " + name);
    tutti::Shape shape(dims);
    get(shape.data(), dims * sizeof(std::int64_t));
    std::int64_t count = 1;
    for (std::int64_t d : shape) {
      if (d < 0 || d > (1 << 28) || (count *= d) > (1 << 28)) fail("bad shape for " + name);
    }
    Tensor t(tutti::DataType::Float32, shape);
    get(t.data(), t.byte_size());
    if (name.starts_with("optim."))
      state.tensors.emplace_back(name.substr(6), t);
    else
      tensors[name] = t;
  }
  for (std::string name = get_name(); !name.empty(); name = get_name()) {
    get(&state.scalars[name], sizeof(double));
  }
  get(magic, 8);
  if (std::memcmp(magic, kMagic, 8) != 0 || offset != bytes.size()) fail("bad trailer");
  // Copy into the model's own tensors, which the optimizer shares.
  const std::vector<std::pair<std::string, Tensor>> targets = model_tensors(model);
  if (targets.size() != tensors.size()) fail("another model (see --model)");
  for (auto& [name, target] : targets) {
    auto it = tensors.find(name);
    if (it == tensors.end() || it->second.shape() != target.shape()) {
      fail("no " + name + " of the model's shape (another --model?)");
    }
    std::memcpy(target.data(), it->second.data(), target.byte_size());
  }
  optimizer.load_state_dict(state);
  return epochs;
}

}  // namespace fashion_mnist

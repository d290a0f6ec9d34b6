// SPDX-License-Identifier: Apache-2.0
// MNIST / Fashion-MNIST idx reader. Every file goes through zlib's gz* functions, which read
// gzip files and, transparently, plain ones, so both spellings share one code path.
#include "tutti/data/mnist_idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tutti/error.h"
#include "tutti/tensor.h"

namespace tutti::data {
namespace {

// idx magic numbers: two zero bytes, the element type (0x08 = unsigned byte), the rank.
constexpr std::uint32_t kImagesMagic = 0x00000803;
constexpr std::uint32_t kLabelsMagic = 0x00000801;
constexpr std::size_t kChunkBytes = std::size_t{1} << 20;

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::InvalidArgument, "load_mnist_idx: " + message);
}

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// The first existing spelling of `stem` in `directory` (see the header for the order).
std::string find_file(const std::string& directory, const std::string& stem,
                      const std::string& dotted) {
  const std::array<std::string, 3> names = {stem, stem + ".gz", dotted};
  for (const std::string& name : names) {
    const std::filesystem::path path = std::filesystem::path(directory) / name;
    std::error_code ignored;  // An unreadable directory reads as "missing" below.
    if (std::filesystem::is_regular_file(path, ignored)) return path.string();
  }
  fail("missing file '" + (std::filesystem::path(directory) / stem).string() + "' (also tried '" +
       names[1] + "' and '" + names[2] + "')");
}

// An open idx file: reads whole byte ranges and reports errors with the file's path.
class IdxFile {
 public:
  explicit IdxFile(std::string path) : path_(std::move(path)), file_(gzopen(path_.c_str(), "rb")) {
    if (!file_) fail("cannot open '" + path_ + "'");
  }

  const std::string& path() const { return path_; }

  // Appends up to `count` bytes to `out`; returns how many were read (fewer at end of file).
  std::size_t read(std::size_t count, std::vector<unsigned char>& out) {
    std::size_t total = 0;
    while (total < count) {
      const std::size_t want = std::min(count - total, kChunkBytes);
      const std::size_t old_size = out.size();
      out.resize(old_size + want);  // Grows with the data actually present, not the header.
      const int got = gzread(file_.get(), out.data() + old_size, static_cast<unsigned>(want));
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(file_.get(), &code);
        fail("cannot read '" + path_ + "': " + (message != nullptr ? message : "zlib error"));
      }
      out.resize(old_size + static_cast<std::size_t>(got));
      total += static_cast<std::size_t>(got);
      if (static_cast<std::size_t>(got) < want) break;
    }
    return total;
  }

  std::uint32_t read_u32(const char* what) {
    std::vector<unsigned char> bytes;
    if (read(4, bytes) != 4) fail("'" + path_ + "' is truncated: no " + what + " in its header");
    return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
           (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
  }

 private:
  std::string path_;
  GzFile file_;
};

std::string hex(std::uint32_t value) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string text = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) text += kDigits[(value >> shift) & 0xfu];
  return text;
}

void check_magic(IdxFile& file, std::uint32_t expected, const char* kind) {
  const std::uint32_t magic = file.read_u32("magic number");
  if (magic != expected) {
    fail("'" + file.path() + "' is not an idx " + kind + " file: magic number " + hex(magic) +
         ", expected " + hex(expected));
  }
}

// Reads `count` payload bytes or fails naming what the header promised.
std::vector<unsigned char> read_payload(IdxFile& file, std::size_t count, const std::string& what) {
  std::vector<unsigned char> bytes;
  const std::size_t got = file.read(count, bytes);
  if (got != count) {
    fail("'" + file.path() + "' is truncated: its header declares " + what + " (" +
         std::to_string(count) + " bytes) but only " + std::to_string(got) + " bytes follow");
  }
  return bytes;
}

}  // namespace

ImageDataset load_mnist_idx(const std::string& directory, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  IdxFile images_file(
      find_file(directory, prefix + "-images-idx3-ubyte", prefix + "-images.idx3-ubyte"));
  IdxFile labels_file(
      find_file(directory, prefix + "-labels-idx1-ubyte", prefix + "-labels.idx1-ubyte"));

  check_magic(images_file, kImagesMagic, "image");
  const std::uint32_t count = images_file.read_u32("image count");
  const std::uint32_t rows = images_file.read_u32("row count");
  const std::uint32_t cols = images_file.read_u32("column count");
  check_magic(labels_file, kLabelsMagic, "label");
  const std::uint32_t label_count = labels_file.read_u32("label count");
  if (count != label_count) {
    fail("'" + images_file.path() + "' holds " + std::to_string(count) + " images but '" +
         labels_file.path() + "' holds " + std::to_string(label_count) + " labels");
  }

  // Three 32-bit factors fit in 96 bits; refuse what does not fit a tensor before reading. The
  // image size alone too: 0 images of 2^32-1 x 2^32-1 made a tensor whose rows * cols, as a
  // model's input, overflows int64.
  constexpr std::uint64_t kMost = std::numeric_limits<std::int64_t>::max() / 4;
  const std::uint64_t pixels = std::uint64_t{rows} * cols;
  if (pixels > kMost || (pixels != 0 && count > kMost / pixels)) {
    fail("'" + images_file.path() + "' declares an impossible size: " + std::to_string(count) +
         " images of " + std::to_string(rows) + "x" + std::to_string(cols));
  }
  const std::vector<unsigned char> pixel_bytes = read_payload(
      images_file, static_cast<std::size_t>(count * pixels),
      std::to_string(count) + " images of " + std::to_string(rows) + "x" + std::to_string(cols));
  const std::vector<unsigned char> label_bytes =
      read_payload(labels_file, count, std::to_string(count) + " labels");

  ImageDataset dataset{
      Tensor(DataType::Float32, {static_cast<std::int64_t>(count), 1,
                                 static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols)}),
      Tensor(DataType::Int64, {static_cast<std::int64_t>(count)})};
  float* image_out = static_cast<float*>(dataset.images.data());
  for (std::size_t i = 0; i < pixel_bytes.size(); ++i) {
    image_out[i] = static_cast<float>(pixel_bytes[i]) / 255.0f;
  }
  auto* label_out = static_cast<std::int64_t*>(dataset.labels.data());
  for (std::size_t i = 0; i < label_bytes.size(); ++i) label_out[i] = label_bytes[i];
  return dataset;
}

}  // namespace tutti::data

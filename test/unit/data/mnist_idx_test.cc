// SPDX-License-Identifier: Apache-2.0
// load_mnist_idx on small generated idx files (plain and gzipped, and broken in each way the
// loader must report), and on the real Fashion-MNIST when the Debian package is installed.
#include "tutti/data/mnist_idx.h"

#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tutti/error.h"

namespace tutti::data {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tutti_mnist_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;  // Best effort; never fail a test in a destructor.
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void put_u32(std::vector<unsigned char>& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<unsigned char>(value >> shift));
}

std::vector<unsigned char> idx_images(std::uint32_t n, std::uint32_t rows, std::uint32_t cols,
                                      std::uint32_t magic = 0x803) {
  std::vector<unsigned char> bytes;
  put_u32(bytes, magic);
  put_u32(bytes, n);
  put_u32(bytes, rows);
  put_u32(bytes, cols);
  for (std::uint32_t i = 0; i < n * rows * cols; ++i)
    bytes.push_back(static_cast<unsigned char>(i * 7 % 256));
  return bytes;
}

std::vector<unsigned char> idx_labels(std::uint32_t n, std::uint32_t magic = 0x801) {
  std::vector<unsigned char> bytes;
  put_u32(bytes, magic);
  put_u32(bytes, n);
  for (std::uint32_t i = 0; i < n; ++i) bytes.push_back(static_cast<unsigned char>(i % 10));
  return bytes;
}

void write_file(const fs::path& path, const std::vector<unsigned char>& bytes, bool gzip) {
  if (gzip) {
    gzFile file = gzopen((path.string() + ".gz").c_str(), "wb");
    REQUIRE(file != nullptr);
    REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) ==
            static_cast<int>(bytes.size()));
    REQUIRE(gzclose(file) == Z_OK);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
  }
}

// The InvalidArgument message of load_mnist_idx, or "" if it did not throw that.
std::string load_error(const fs::path& dir, bool train) {
  try {
    load_mnist_idx(dir.string(), train);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::InvalidArgument) return e.what();
    return std::string("wrong code: ") + e.what();
  }
  return "";
}

TEST_CASE("load_mnist_idx reads plain and gzipped idx files", "[mnist]") {
  const bool gzip = GENERATE(false, true);
  const bool train = GENERATE(false, true);
  TempDir dir;
  const std::string prefix = train ? "train" : "t10k";
  write_file(dir.path() / (prefix + "-images-idx3-ubyte"), idx_images(5, 28, 28), gzip);
  write_file(dir.path() / (prefix + "-labels-idx1-ubyte"), idx_labels(5), gzip);

  const ImageDataset ds = load_mnist_idx(dir.path().string(), train);
  CHECK(ds.images.dtype() == DataType::Float32);
  CHECK(ds.images.shape() == Shape{5, 1, 28, 28});
  CHECK(ds.labels.dtype() == DataType::Int64);
  CHECK(ds.labels.shape() == Shape{5});
  const auto pixels = ds.images.span<float>();
  bool pixels_ok = true;
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    pixels_ok = pixels_ok && pixels[i] == static_cast<float>(i * 7 % 256) / 255.0f;
  }
  CHECK(pixels_ok);
  CHECK(pixels[0] == 0.0f);
  CHECK(pixels[73] == 1.0f);  // 73 * 7 % 256 = 255.
  const auto labels = ds.labels.span<std::int64_t>();
  CHECK(labels[0] == 0);
  CHECK(labels[4] == 4);
}

TEST_CASE("load_mnist_idx names the missing file", "[mnist]") {
  TempDir dir;
  std::string message = load_error(dir.path(), true);
  CHECK_THAT(message,
             Catch::Contains("missing file") && Catch::Contains("train-images-idx3-ubyte"));
  write_file(dir.path() / "t10k-images-idx3-ubyte", idx_images(2, 28, 28), true);
  message = load_error(dir.path(), false);
  CHECK_THAT(message, Catch::Contains("t10k-labels-idx1-ubyte"));
  CHECK(load_error(dir.path() / "no_such_dir", false).find("missing file") != std::string::npos);
}

TEST_CASE("load_mnist_idx rejects a bad magic number, naming the file", "[mnist]") {
  TempDir dir;
  write_file(dir.path() / "train-images-idx3-ubyte", idx_images(3, 28, 28, 0x801), false);
  write_file(dir.path() / "train-labels-idx1-ubyte", idx_labels(3), false);
  CHECK_THAT(load_error(dir.path(), true), Catch::Contains("train-images-idx3-ubyte") &&
                                               Catch::Contains("magic number 0x00000801"));
  write_file(dir.path() / "train-images-idx3-ubyte", idx_images(3, 28, 28), false);
  write_file(dir.path() / "train-labels-idx1-ubyte", idx_labels(3, 0x12345678), false);
  CHECK_THAT(load_error(dir.path(), true),
             Catch::Contains("train-labels-idx1-ubyte") && Catch::Contains("0x12345678"));
}

TEST_CASE("load_mnist_idx rejects truncated files", "[mnist]") {
  const bool gzip = GENERATE(false, true);
  TempDir dir;
  std::vector<unsigned char> images = idx_images(4, 28, 28);
  images.resize(images.size() - 1);
  write_file(dir.path() / "train-images-idx3-ubyte", images, gzip);
  write_file(dir.path() / "train-labels-idx1-ubyte", idx_labels(4), gzip);
  CHECK_THAT(load_error(dir.path(), true),
             Catch::Contains("train-images-idx3-ubyte") && Catch::Contains("truncated"));

  write_file(dir.path() / "train-images-idx3-ubyte", idx_images(4, 28, 28), gzip);
  std::vector<unsigned char> labels = idx_labels(4);
  labels.resize(6);  // Cut inside the header.
  write_file(dir.path() / "train-labels-idx1-ubyte", labels, gzip);
  CHECK_THAT(load_error(dir.path(), true),
             Catch::Contains("train-labels-idx1-ubyte") && Catch::Contains("truncated"));
}

TEST_CASE("load_mnist_idx rejects image and label counts that differ", "[mnist]") {
  TempDir dir;
  write_file(dir.path() / "t10k-images-idx3-ubyte", idx_images(4, 28, 28), false);
  write_file(dir.path() / "t10k-labels-idx1-ubyte", idx_labels(3), false);
  CHECK_THAT(load_error(dir.path(), false),
             Catch::Contains("4 images") && Catch::Contains("3 labels"));
}

TEST_CASE("load_mnist_idx rejects sizes no tensor holds, with or without images", "[mnist]") {
  const std::uint32_t count = GENERATE(0u, 1u);
  TempDir dir;
  std::vector<unsigned char> header;  // No pixels follow: the size must be refused first.
  put_u32(header, 0x803);
  put_u32(header, count);
  put_u32(header, 0xFFFFFFFFu);
  put_u32(header, 0xFFFFFFFFu);
  write_file(dir.path() / "train-images-idx3-ubyte", header, false);
  write_file(dir.path() / "train-labels-idx1-ubyte", idx_labels(count), false);
  CHECK_THAT(load_error(dir.path(), true),
             Catch::Contains("impossible size") && Catch::Contains("4294967295x4294967295"));
}

TEST_CASE("load_mnist_idx rejects a corrupt gzip stream", "[mnist]") {
  TempDir dir;
  // A gzip header followed by garbage: zlib reports a data error (or a short read).
  std::vector<unsigned char> bytes = {0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 0x03};
  for (int i = 0; i < 64; ++i) bytes.push_back(static_cast<unsigned char>(0xff - i));
  write_file(dir.path() / "train-images-idx3-ubyte.gz", bytes, false);
  write_file(dir.path() / "train-labels-idx1-ubyte", idx_labels(3), false);
  CHECK_THAT(load_error(dir.path(), true), Catch::Contains("train-images-idx3-ubyte.gz"));
}

TEST_CASE("load_mnist_idx loads the installed Fashion-MNIST", "[mnist][fashion]") {
  const fs::path dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir / "train-images-idx3-ubyte.gz") &&
      !fs::exists(dir / "train-images-idx3-ubyte")) {
    WARN("dataset-fashion-mnist is not installed; skipping");
    return;
  }
  const bool train = GENERATE(true, false);
  const ImageDataset ds = load_mnist_idx(dir.string(), train);
  const std::int64_t n = train ? 60000 : 10000;
  CHECK(ds.images.shape() == Shape{n, 1, 28, 28});
  CHECK(ds.labels.shape() == Shape{n});
  std::vector<std::int64_t> per_class(10, 0);
  bool labels_ok = true;
  for (std::int64_t label : ds.labels.span<std::int64_t>()) {
    labels_ok = labels_ok && label >= 0 && label <= 9;
    if (label >= 0 && label <= 9) ++per_class[static_cast<std::size_t>(label)];
  }
  CHECK(labels_ok);
  for (std::int64_t c : per_class) CHECK(c == n / 10);  // Fashion-MNIST is balanced.
  float lo = 1, hi = 0;
  for (float v : ds.images.span<float>()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
}

}  // namespace
}  // namespace tutti::data

// SPDX-License-Identifier: Apache-2.0
// Loader for the MNIST and Fashion-MNIST data sets in their idx file format, plain or gzipped.
#pragma once

#include <string>

#include "tutti/export.h"
#include "tutti/tensor.h"

namespace tutti::data {

// An in-memory image classification data set.
struct ImageDataset {
  Tensor images;  // Float32 [n, 1, rows, cols] (28 x 28 for MNIST), pixel byte / 255 in [0, 1].
  Tensor labels;  // Int64 [n], the class of each image (0..9 for MNIST).
};

// Reads the training set (`train` = true: train-images-idx3-ubyte and train-labels-idx1-ubyte)
// or the test set (t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte) from `directory`. For
// each file the plain name is tried first, then the name with ".gz" (read through zlib), then
// the "train-images.idx3-ubyte" spelling some mirrors use; this is how the MNIST site, the
// Fashion-MNIST repository and Debian's dataset-fashion-mnist package
// (/usr/share/datasets/fashion-mnist) ship them.
//
// Local, blocking, thread-safe; needs no runtime. Every rank of a job may call it (each reads
// the files itself); combine it with DistributedSampler to pick each rank's share.
//
// Throws Error(InvalidArgument), with a message naming the file, if a file is missing or
// unreadable, is not valid gzip, has the wrong magic number (0x00000803 for images, 0x00000801
// for labels), is shorter than its header says, or if the image and label files disagree on
// the number of samples. Bytes after the declared data are ignored.
TUTTI_API ImageDataset load_mnist_idx(const std::string& directory, bool train);

}  // namespace tutti::data

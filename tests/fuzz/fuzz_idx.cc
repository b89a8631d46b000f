// libFuzzer target: the IDX dataset reader (IdxDataset in runtime/data/dataset.h), plain and gzip files.
//
// Input: byte 0 is flags, the rest is the content of one IDX file.
//   bit 0   0: the content is the images file, read with a valid labels file of 3 labels;
//           1: the content is the labels file, read with a valid images file of 3 images of 28x28.
//   bit 1   write the fuzzed file as <name>.gz and open <name> (the reader's ".gz" fallback); the content decides
//           whether it is gzip (zlib reads plain files too).
// On success every sample is read back (at most 8): labels in [0, 10), features finite. ampdist::Error is the
// expected outcome of bad input; anything else (another exception, a crash, a sanitizer report, a hang, a huge
// allocation) is a finding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "runtime/core/error.h"
#include "runtime/data/dataset.h"

namespace {

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

struct Files {
  std::string dir, valid_images, valid_labels;
};

const Files& files() {
  static const Files f = [] {
    Files r;
    r.dir = ampdist_fuzz::scratch_dir("idx");
    r.valid_images = r.dir + "/valid-images-idx3-ubyte";
    r.valid_labels = r.dir + "/valid-labels-idx1-ubyte";
    std::string img = be32(0x00000803) + be32(3) + be32(28) + be32(28);
    for (int i = 0; i < 3 * 28 * 28; ++i) img += static_cast<char>((i * 7) & 0xFF);
    ampdist_fuzz::write_file(r.valid_images, img);
    ampdist_fuzz::write_file(r.valid_labels, be32(0x00000801) + be32(3) + std::string("\x00\x01\x09", 3));
    return r;
  }();
  return f;
}

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_idx: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ampdist_fuzz::quiet_protobuf();
  files();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const bool labels_mode = flags & 1, gz_fallback = flags & 2;
  const Files& f = files();
  const std::string name = f.dir + (labels_mode ? "/fuzz-labels-idx1-ubyte" : "/fuzz-images-idx3-ubyte");
  std::error_code ec;
  std::filesystem::remove(name, ec);
  std::filesystem::remove(name + ".gz", ec);
  ampdist_fuzz::write_file(gz_fallback ? name + ".gz" : name,
                           std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));

  try {
    ampdist::IdxDataset ds(labels_mode ? f.valid_images : name, labels_mode ? name : f.valid_labels, 0.2860f,
                           0.3530f);
    if (ds.size() <= 0 || ds.feature_dim() <= 0) finding("a dataset without samples or features was accepted");
    std::vector<float> x(static_cast<size_t>(ds.feature_dim()));
    for (int64_t i = 0; i < std::min<int64_t>(ds.size(), 8); ++i) {
      int32_t label = -1;
      ds.get(i, x.data(), &label);
      if (label < 0 || label >= ds.classes()) finding("get() returned a label outside [0, classes)");
      for (float v : x)
        if (!std::isfinite(v)) finding("get() returned a non-finite feature");
    }
    try {
      int32_t label;
      ds.get(ds.size(), x.data(), &label);
      finding("get(size()) did not throw");
    } catch (const ampdist::Error&) {
    }
  } catch (const ampdist::Error&) {
  }
  return 0;
}

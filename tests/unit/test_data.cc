// Datasets (IDX files, synthetic clusters, in-memory) and the prefetching Loader.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/data/sampler.h"

namespace ampdist {
namespace {

namespace fs = std::filesystem;

const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

// Normalisation of the IdxDatasetConfig defaults (Fashion-MNIST training-set mean and std).
float normalised(int pixel) { return (pixel / 255.0f - 0.2860f) / 0.3530f; }

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("ampdist_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

std::vector<uint8_t> idx_images(uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols, size_t pixel_bytes) {
  std::vector<uint8_t> b;
  put_be32(b, magic);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  for (size_t i = 0; i < pixel_bytes; ++i) b.push_back(static_cast<uint8_t>(i * 7 % 256));
  return b;
}

std::vector<uint8_t> idx_labels(uint32_t magic, uint32_t n, std::vector<uint8_t> labels) {
  std::vector<uint8_t> b;
  put_be32(b, magic);
  put_be32(b, n);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

void write_plain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void write_gzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// A valid pair: 3 images of 2x3, labels {4, 0, 9}.
struct SmallIdx {
  std::vector<uint8_t> images = idx_images(0x803, 3, 2, 3, 18);
  std::vector<uint8_t> labels = idx_labels(0x801, 3, {4, 0, 9});
};

// Constructs IdxDataset(images, labels) and expects a bad-input Error whose message names `path` and contains
// every one of `words`.
void expect_idx_error(const std::string& images, const std::string& labels, const std::string& path,
                      const std::vector<std::string>& words) {
  try {
    IdxDataset d(images, labels, 0.2860f, 0.3530f);
    ADD_FAILURE() << "no exception; expected one naming " << path;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << what;
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << "message does not start with the file: " << what;
    for (const std::string& w : words) EXPECT_NE(what.find(w), std::string::npos) << "no '" << w << "' in: " << what;
  }
}

// ---- IdxDataset on the real Fashion-MNIST files ----------------------------------------------------------

TEST(IdxDataset, ReadsFashionMnist) {
  if (!fs::is_directory(kFashionDir)) GTEST_SKIP() << kFashionDir << " not installed (dataset-fashion-mnist)";
  const std::string d = kFashionDir;
  // Paths without ".gz": the loader falls back to the compressed files the package installs.
  IdxDataset train(d + "/train-images-idx3-ubyte", d + "/train-labels-idx1-ubyte", 0.2860f, 0.3530f);
  IdxDataset test(d + "/t10k-images-idx3-ubyte", d + "/t10k-labels-idx1-ubyte", 0.2860f, 0.3530f);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.feature_dim(), 784);
  EXPECT_EQ(test.feature_dim(), 784);
  EXPECT_EQ(train.classes(), 10);

  // Values read from the files with Python's gzip module (see the report): train sample 0 is an ankle boot
  // (label 9) with pixel 100 (row 3, col 16) = 73, pixel 417 = 255 and pixel 0 = 0.
  std::vector<float> x(784);
  int32_t y = -1;
  train.get(0, x.data(), &y);
  EXPECT_EQ(y, 9);
  EXPECT_FLOAT_EQ(x[100], normalised(73));
  EXPECT_FLOAT_EQ(x[417], normalised(255));
  EXPECT_FLOAT_EQ(x[0], normalised(0));
  EXPECT_NEAR(x[100], 0.00077765f, 1e-6f);  // (73/255 - 0.2860) / 0.3530, in double
  EXPECT_NEAR(x[417], 2.0226629f, 1e-5f);    // (255/255 - 0.2860) / 0.3530
  train.get(59999, x.data(), &y);
  EXPECT_EQ(y, 5);
  EXPECT_FLOAT_EQ(x[239], normalised(71));
  test.get(0, x.data(), &y);
  EXPECT_EQ(y, 9);
  EXPECT_FLOAT_EQ(x[219], normalised(7));
  test.get(9999, x.data(), &y);
  EXPECT_EQ(y, 5);

  // Fashion-MNIST's training set is balanced: 6000 of each class.
  std::vector<int> count(10, 0);
  for (int64_t i = 0; i < train.size(); ++i) {
    train.get(i, x.data(), &y);
    ++count.at(y);
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(count[c], 6000) << "class " << c;
}

TEST(LoadDatasets, FashionMnistByDefault) {
  if (!fs::is_directory(kFashionDir)) GTEST_SKIP() << kFashionDir << " not installed (dataset-fashion-mnist)";
  DataConfig cfg;
  cfg.mutable_idx();  // every field at its default: dir, mean, std
  DatasetPair p = load_datasets(cfg, 1);
  ASSERT_NE(p.train, nullptr);
  ASSERT_NE(p.test, nullptr);
  EXPECT_EQ(p.train->size(), 60000);
  EXPECT_EQ(p.test->size(), 10000);
  std::vector<float> x(784);
  int32_t y = -1;
  p.train->get(0, x.data(), &y);
  EXPECT_EQ(y, 9);
  EXPECT_FLOAT_EQ(x[100], normalised(73));
}

// ---- IdxDataset on small files written here ---------------------------------------------------------------

TEST(IdxDataset, ReadsPlainAndGzipFiles) {
  TempDir dir;
  SmallIdx s;
  write_plain(dir.file("img"), s.images);
  write_plain(dir.file("lab"), s.labels);
  write_gzip(dir.file("zimg.gz"), s.images);
  write_gzip(dir.file("zlab.gz"), s.labels);
  IdxDataset plain(dir.file("img"), dir.file("lab"), 0.5f, 0.25f);
  IdxDataset gz(dir.file("zimg"), dir.file("zlab.gz"), 0.5f, 0.25f);  // without and with the suffix
  for (const IdxDataset* d : {&plain, &gz}) {
    ASSERT_EQ(d->size(), 3);
    ASSERT_EQ(d->feature_dim(), 6);
    const int32_t want_labels[3] = {4, 0, 9};
    for (int64_t i = 0; i < 3; ++i) {
      std::vector<float> x(6);
      int32_t y = -1;
      d->get(i, x.data(), &y);
      EXPECT_EQ(y, want_labels[i]);
      for (int j = 0; j < 6; ++j) {
        int pixel = static_cast<int>((i * 6 + j) * 7 % 256);  // what idx_images wrote
        EXPECT_FLOAT_EQ(x[j], (pixel / 255.0f - 0.5f) / 0.25f) << "sample " << i << " pixel " << j;
      }
    }
  }
}

TEST(IdxDataset, MissingFile) {
  TempDir dir;
  SmallIdx s;
  write_plain(dir.file("lab"), s.labels);
  expect_idx_error(dir.file("img"), dir.file("lab"), dir.file("img"), {"no such file", dir.file("img") + ".gz"});
  write_plain(dir.file("img"), s.images);
  expect_idx_error(dir.file("img"), dir.file("nolabels"), dir.file("nolabels"), {"no such file"});
}

TEST(IdxDataset, WrongMagic) {
  TempDir dir;
  SmallIdx s;
  // A labels file where the images belong: the magic says which.
  write_plain(dir.file("img"), idx_images(0x801, 3, 2, 3, 18));
  write_plain(dir.file("lab"), s.labels);
  expect_idx_error(dir.file("img"), dir.file("lab"), dir.file("img"), {"magic", "0x00000801", "0x00000803"});
  write_plain(dir.file("img2"), s.images);
  write_plain(dir.file("lab2"), idx_labels(0x12345678, 3, {1, 2, 3}));
  expect_idx_error(dir.file("img2"), dir.file("lab2"), dir.file("lab2"), {"magic", "0x12345678", "0x00000801"});
}

TEST(IdxDataset, GzippedWrongMagic) {
  TempDir dir;
  SmallIdx s;
  write_gzip(dir.file("img.gz"), idx_images(0x00000804, 3, 2, 3, 18));
  write_plain(dir.file("lab"), s.labels);
  // Named without ".gz": the error names the file actually read.
  expect_idx_error(dir.file("img"), dir.file("lab"), dir.file("img.gz"), {"magic", "0x00000804"});
}

TEST(IdxDataset, TruncatedImages) {
  TempDir dir;
  SmallIdx s;
  write_plain(dir.file("img"), idx_images(0x803, 3, 28, 28, 100));
  write_plain(dir.file("lab"), s.labels);
  expect_idx_error(dir.file("img"), dir.file("lab"), dir.file("img"),
                   {"truncated", "3 images of 28x28 = 2352 bytes", "only 100"});
  // The same in a gzip file.
  write_gzip(dir.file("zimg.gz"), idx_images(0x803, 3, 28, 28, 2351));
  expect_idx_error(dir.file("zimg.gz"), dir.file("lab"), dir.file("zimg.gz"), {"truncated", "only 2351"});
}

TEST(IdxDataset, TruncatedHeader) {
  TempDir dir;
  SmallIdx s;
  std::vector<uint8_t> header(s.images.begin(), s.images.begin() + 10);
  write_plain(dir.file("img"), header);
  write_plain(dir.file("lab"), s.labels);
  expect_idx_error(dir.file("img"), dir.file("lab"), dir.file("img"), {"truncated", "16 bytes", "only 10"});
  write_plain(dir.file("empty"), {});
  expect_idx_error(dir.file("empty"), dir.file("lab"), dir.file("empty"), {"truncated"});
}

TEST(IdxDataset, TruncatedLabels) {
  TempDir dir;
  SmallIdx s;
  write_plain(dir.file("img"), s.images);
  write_plain(dir.file("lab"), idx_labels(0x801, 3, {1, 2}));
  expect_idx_error(dir.file("img"), dir.file("lab"), dir.file("lab"), {"truncated", "3 labels", "only 2"});
}

TEST(IdxDataset, CountMismatch) {
  TempDir dir;
  SmallIdx s;
  write_plain(dir.file("img"), s.images);
  write_plain(dir.file("lab"), idx_labels(0x801, 4, {1, 2, 3, 4}));
  expect_idx_error(dir.file("img"), dir.file("lab"), dir.file("lab"),
                   {"count mismatch", "4 labels", dir.file("img") + " has 3 images"});
}

TEST(IdxDataset, LabelOutOfRange) {
  TempDir dir;
  SmallIdx s;
  write_plain(dir.file("img"), s.images);
  write_plain(dir.file("lab"), idx_labels(0x801, 3, {1, 10, 3}));
  expect_idx_error(dir.file("img"), dir.file("lab"), dir.file("lab"), {"label 10", "sample 1", "[0, 10)"});
}

TEST(IdxDataset, BadDimensions) {
  TempDir dir;
  SmallIdx s;
  write_plain(dir.file("lab"), s.labels);
  write_plain(dir.file("zero_n"), idx_images(0x803, 0, 2, 3, 0));
  expect_idx_error(dir.file("zero_n"), dir.file("lab"), dir.file("zero_n"), {"0 images"});
  write_plain(dir.file("zero_rows"), idx_images(0x803, 3, 0, 3, 0));
  expect_idx_error(dir.file("zero_rows"), dir.file("lab"), dir.file("zero_rows"), {"0x3"});
  write_plain(dir.file("huge"), idx_images(0x803, 3, 5000, 3, 10));
  expect_idx_error(dir.file("huge"), dir.file("lab"), dir.file("huge"), {"5000x3", "4096"});
}

// ---- load_datasets -----------------------------------------------------------------------------------------

void expect_load_error(const DataConfig& cfg, const std::vector<std::string>& words) {
  try {
    load_datasets(cfg, 1);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    for (const std::string& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "no '" << w << "' in: " << e.what();
  }
}

TEST(LoadDatasets, MissingDirectory) {
  TempDir dir;
  DataConfig cfg;
  cfg.mutable_idx()->set_dir(dir.file("nowhere"));
  expect_load_error(cfg, {dir.file("nowhere") + ": ", "data.idx.dir", "no such directory"});
}

TEST(LoadDatasets, DirectoryWithoutFiles) {
  TempDir dir;
  DataConfig cfg;
  cfg.mutable_idx()->set_dir(dir.str());
  expect_load_error(cfg, {dir.file("train-images-idx3-ubyte") + ": ", "no such file"});
}

TEST(LoadDatasets, NoKind) {
  DataConfig cfg;
  expect_load_error(cfg, {"data: set idx { ... } or synthetic { ... }"});
}

TEST(LoadDatasets, BadSyntheticField) {
  DataConfig cfg;
  cfg.mutable_synthetic()->set_features(0);
  expect_load_error(cfg, {"data.synthetic.features"});
}

// ---- SyntheticDataset --------------------------------------------------------------------------------------

std::vector<float> sample(const Dataset& d, int64_t i, int32_t* label) {
  std::vector<float> x(static_cast<size_t>(d.feature_dim()));
  d.get(i, x.data(), label);
  return x;
}

TEST(SyntheticDataset, Deterministic) {
  SyntheticDataset a(256, 17, 5, 1.0f, 42, 0), b(256, 17, 5, 1.0f, 42, 0);
  for (int64_t i : {0, 1, 100, 255}) {
    int32_t ya = -1, yb = -2;
    std::vector<float> xa = sample(a, i, &ya), xb = sample(b, i, &yb);
    EXPECT_EQ(ya, yb);
    EXPECT_EQ(xa, xb) << "sample " << i;  // bitwise: same seed, same numbers
    EXPECT_EQ(sample(a, i, &ya), xa) << "a second read of sample " << i << " differs";
  }
}

TEST(SyntheticDataset, KeptSamplesAreTheDrawnOnes) {
  // 16 x 65536 features (4 MiB) are drawn when the set is made and then copied; 1100 x 65536 (275 MiB) are over
  // kCacheBytes and drawn on every read. A sample depends on (seed, split, index) only, so both sets hold the same
  // first 16, whichever thread reads them.
  constexpr int64_t kDim = 65536;
  static_assert(1100 * kDim * 4 > SyntheticDataset::kCacheBytes && 16 * kDim * 4 <= SyntheticDataset::kCacheBytes);
  SyntheticDataset kept(16, kDim, 5, 1.0f, 42, 0), drawn(1100, kDim, 5, 1.0f, 42, 0);
  std::vector<std::vector<float>> first(16);
  std::vector<int32_t> labels(16);
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t)
    readers.emplace_back([&, t] {
      for (int64_t i = t; i < 16; i += 2) {
        int32_t y = -1;
        std::vector<float> x = sample(kept, i, &y);
        if (t < 2) first[static_cast<size_t>(i)] = std::move(x), labels[static_cast<size_t>(i)] = y;
      }
    });
  for (std::thread& r : readers) r.join();
  for (int64_t i = 0; i < 16; ++i) {
    int32_t y_kept = -1, y_drawn = -2;
    const std::vector<float> again = sample(kept, i, &y_kept), fresh = sample(drawn, i, &y_drawn);
    EXPECT_EQ(again, fresh) << "sample " << i;  // bitwise
    EXPECT_EQ(first[static_cast<size_t>(i)], fresh) << "sample " << i;
    EXPECT_EQ(y_kept, y_drawn);
    EXPECT_EQ(labels[static_cast<size_t>(i)], y_drawn);
  }
}

TEST(SyntheticDataset, SplitAndSeedChangeSamples) {
  SyntheticDataset train(64, 8, 4, 1.0f, 42, 0), test(64, 8, 4, 1.0f, 42, 1), other(64, 8, 4, 1.0f, 43, 0);
  int32_t y;
  EXPECT_NE(sample(train, 0, &y), sample(test, 0, &y));
  EXPECT_NE(sample(train, 0, &y), sample(other, 0, &y));
  EXPECT_NE(sample(train, 0, &y), sample(train, 1, &y));
}

TEST(SyntheticDataset, NoiseZeroGivesTheCentres) {
  // With no noise every sample is its class centre: equal within a class, different across classes.
  SyntheticDataset d(200, 6, 3, 0.0f, 9, 0);
  std::vector<std::vector<float>> centre(3);
  for (int64_t i = 0; i < d.size(); ++i) {
    int32_t y = -1;
    std::vector<float> x = sample(d, i, &y);
    ASSERT_GE(y, 0);
    ASSERT_LT(y, 3);
    if (centre[y].empty()) centre[y] = x;
    EXPECT_EQ(x, centre[y]) << "sample " << i;
  }
  for (int c = 0; c < 3; ++c) ASSERT_FALSE(centre[c].empty()) << "class " << c << " never drawn in 200 samples";
  EXPECT_NE(centre[0], centre[1]);
  EXPECT_NE(centre[1], centre[2]);
}

TEST(SyntheticDataset, LabelsInRangeAndBalanced) {
  SyntheticDataset d(4096, 32, 10, 1.0f, 7, 0);
  EXPECT_EQ(d.size(), 4096);
  EXPECT_EQ(d.feature_dim(), 32);
  EXPECT_EQ(d.classes(), 10);
  std::vector<int> count(10, 0);
  for (int64_t i = 0; i < d.size(); ++i) {
    int32_t y = -1;
    sample(d, i, &y);
    ASSERT_GE(y, 0);
    ASSERT_LT(y, 10);
    ++count[y];
  }
  // Each count is Binomial(4096, 0.1): mean 409.6, sd 19.2. [310, 510] is about 5 sd either way, loose enough for
  // any seed, tight enough to catch a label draw that skips or doubles a class (0 or ~820).
  for (int c = 0; c < 10; ++c) {
    EXPECT_GE(count[c], 310) << "class " << c;
    EXPECT_LE(count[c], 510) << "class " << c;
  }
}

TEST(SyntheticDataset, TrainAndTestShareClassCentres) {
  // load_datasets builds train (split 0) and test (split 1) from the same centres: the class means of the train
  // set classify the test set (nearest mean). Shared centres ~8 apart against noise 1 give ~100%; centres that
  // depended on the split would give chance, 10%.
  DataConfig cfg;
  cfg.mutable_synthetic();  // 4096 train, 1024 test, 32 features, 10 classes, noise 1
  DatasetPair p = load_datasets(cfg, 5);
  ASSERT_EQ(p.train->size(), 4096);
  ASSERT_EQ(p.test->size(), 1024);
  const int64_t dim = p.train->feature_dim();
  ASSERT_EQ(dim, 32);
  std::vector<std::vector<double>> mean(10, std::vector<double>(dim, 0.0));
  std::vector<int> count(10, 0);
  for (int64_t i = 0; i < p.train->size(); ++i) {
    int32_t y;
    std::vector<float> x = sample(*p.train, i, &y);
    for (int64_t j = 0; j < dim; ++j) mean[y][j] += x[j];
    ++count[y];
  }
  for (int c = 0; c < 10; ++c)
    for (int64_t j = 0; j < dim; ++j) mean[c][j] /= count[c];
  int correct = 0;
  for (int64_t i = 0; i < p.test->size(); ++i) {
    int32_t y;
    std::vector<float> x = sample(*p.test, i, &y);
    int best = -1;
    double best_d = 1e300;
    for (int c = 0; c < 10; ++c) {
      double d = 0;
      for (int64_t j = 0; j < dim; ++j) d += (x[j] - mean[c][j]) * (x[j] - mean[c][j]);
      if (d < best_d) best_d = d, best = c;
    }
    correct += best == y;
  }
  EXPECT_GE(correct, 1024 * 95 / 100);
}

// ---- InMemoryDataset ---------------------------------------------------------------------------------------

TEST(InMemoryDataset, ValidatesSizes) {
  EXPECT_THROW(InMemoryDataset({1, 2, 3}, {0, 1}, 2, 2), Error);  // 3 features for 2 samples of 2
  EXPECT_THROW(InMemoryDataset({1, 2, 3, 4}, {0, 2}, 2, 2), Error);  // label 2 of 2 classes
  try {
    InMemoryDataset d({1, 2, 3}, {0, 1}, 2, 2);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
  }
  InMemoryDataset d({1, 2, 3, 4}, {1, 0}, 2, 2);
  int32_t y = -1;
  EXPECT_EQ(sample(d, 1, &y), (std::vector<float>{3, 4}));
  EXPECT_EQ(y, 0);
}

// ---- Loader ------------------------------------------------------------------------------------------------

// Sample i has features {i, 1000 + i} and label i % 7.
std::shared_ptr<InMemoryDataset> counting_dataset(int64_t n) {
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(static_cast<float>(1000 + i));
    y.push_back(static_cast<int32_t>(i % 7));
  }
  return std::make_shared<InMemoryDataset>(std::move(x), std::move(y), 2, 7);
}

SamplerOptions loader_options(int64_t n, int64_t g, int world, int rank, int accum, bool drop_last) {
  return {.dataset_size = n, .global_batch_size = g, .world_size = world, .rank = rank, .accumulation_steps = accum,
          .drop_last = drop_last, .shuffle = true, .seed = 77};
}

TEST(Loader, DeliversTheSamplersIndicesAcrossEpochs) {
  // N = 21, G = 8, W = 2, A = 2 (M = 2), rank 1: steps of 8, 8 and 5 samples. In the tail step micro-batch 0 is
  // positions 0-3 (rank 1 gets 2-3) and micro-batch 1 is position 4 only (rank 0's): rank 1's is empty.
  const SamplerOptions o = loader_options(21, 8, 2, 1, 2, /*drop_last=*/false);
  DistributedSampler reference(o);
  ASSERT_EQ(reference.steps_per_epoch(), 3);
  Loader loader(counting_dataset(21), DistributedSampler(o), 2, /*prefetch_steps=*/2, /*epoch=*/0,
                /*step_in_epoch=*/1);
  int64_t epoch = 0, step = 1;
  std::vector<int64_t> want;
  int empty_micro = 0;
  for (int call = 0; call < 10; ++call) {  // epoch 0 steps 1-2, epochs 1-2, epoch 3 step 0 and 1
    const StepBatch& b = loader.next();
    SCOPED_TRACE("call " + std::to_string(call));
    ASSERT_EQ(b.epoch, epoch);
    ASSERT_EQ(b.step_in_epoch, step);
    EXPECT_EQ(b.global_samples, step < 2 ? 8 : 5);
    ASSERT_EQ(b.micro.size(), 2u);
    for (int k = 0; k < 2; ++k) {
      reference.indices(epoch, step, k, want);
      const MicroBatch& mb = b.micro[k];
      ASSERT_EQ(mb.size(), static_cast<int64_t>(want.size()));
      EXPECT_EQ(mb.size(), step == 2 ? (k == 0 ? 2 : 0) : 2);
      ASSERT_EQ(mb.x.shape(), (Shape{mb.size(), 2}));
      EXPECT_EQ(mb.x.dtype(), DType::kFloat32);
      const float* x = mb.x.data_as<float>();
      for (int64_t i = 0; i < mb.size(); ++i) {
        EXPECT_EQ(x[2 * i], static_cast<float>(want[i]));
        EXPECT_EQ(x[2 * i + 1], static_cast<float>(1000 + want[i]));
        EXPECT_EQ(mb.y[i], want[i] % 7);
      }
      empty_micro += mb.size() == 0;
    }
    if (++step == 3) step = 0, ++epoch;
  }
  EXPECT_EQ(empty_micro, 3);  // one per tail step: epochs 0, 1, 2
}

TEST(Loader, ResumePastTheEpochEndStartsTheNextEpoch) {
  const SamplerOptions o = loader_options(21, 8, 2, 0, 2, /*drop_last=*/true);  // 2 steps per epoch
  Loader loader(counting_dataset(21), DistributedSampler(o), 2, 1, /*epoch=*/4, /*step_in_epoch=*/2);
  const StepBatch& b = loader.next();
  EXPECT_EQ(b.epoch, 5);
  EXPECT_EQ(b.step_in_epoch, 0);
}

TEST(Loader, ReusesItsBuffers) {
  // K = prefetch_steps + 1 slots of A micro-batches each: over many full steps the tensors returned live in
  // exactly K * A buffers (Tensor::ensure reuses them).
  const SamplerOptions o = loader_options(64, 8, 1, 0, 2, /*drop_last=*/true);
  Loader loader(counting_dataset(64), DistributedSampler(o), 2, /*prefetch_steps=*/2);
  std::set<const void*> buffers;
  for (int call = 0; call < 30; ++call) {
    const StepBatch& b = loader.next();
    for (const MicroBatch& mb : b.micro) buffers.insert(mb.x.data());
  }
  EXPECT_EQ(buffers.size(), 3u * 2u);
}

// Throws on one sample, like a corrupt record.
class FailingDataset : public Dataset {
 public:
  FailingDataset(int64_t n, int64_t bad) : n_(n), bad_(bad) {}
  int64_t size() const override { return n_; }
  int64_t feature_dim() const override { return 1; }
  int32_t classes() const override { return 2; }
  void get(int64_t index, float* features, int32_t* label) const override {
    if (index == bad_) throw BadInput("failing dataset", "sample " + std::to_string(index) + " is corrupt");
    features[0] = static_cast<float>(index);
    *label = 0;
  }

 private:
  int64_t n_, bad_;
};

TEST(Loader, RethrowsTheProducersException) {
  // No shuffle, G = 2: step s reads samples 2s and 2s+1, so sample 5 fails in step 2. Steps 0 and 1 arrive
  // first; the error surfaces at step 2, and again on every later call.
  SamplerOptions o = loader_options(10, 2, 1, 0, 1, /*drop_last=*/true);
  o.shuffle = false;
  Loader loader(std::make_shared<FailingDataset>(10, 5), DistributedSampler(o), 1, /*prefetch_steps=*/3);
  EXPECT_EQ(loader.next().step_in_epoch, 0);
  EXPECT_EQ(loader.next().step_in_epoch, 1);
  for (int i = 0; i < 2; ++i) {
    try {
      loader.next();
      ADD_FAILURE() << "no exception at step 2";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(e.what()).find("sample 5 is corrupt"), std::string::npos) << e.what();
    }
  }
}

TEST(Loader, DestroyMidStreamDoesNotHang) {
  const SamplerOptions o = loader_options(64, 8, 1, 0, 2, /*drop_last=*/true);
  {
    Loader loader(counting_dataset(64), DistributedSampler(o), 2, 2);
    loader.next();
  }  // the producer is blocked on a full ring or filling a slot: the destructor stops and joins it
  {
    Loader loader(counting_dataset(64), DistributedSampler(o), 2, 0);  // prefetch < 1 is treated as 1
    EXPECT_EQ(loader.next().step_in_epoch, 0);
    EXPECT_EQ(loader.next().step_in_epoch, 1);
  }
  { Loader never_read(counting_dataset(64), DistributedSampler(o), 2, 4); }
}

}  // namespace
}  // namespace ampdist

// Datasets: indexable collections of (features, label) samples, held in host memory.
//
// A sample is `feature_dim()` FP32 features (already normalised) and an int32 class label in [0, classes()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampdist/config.pb.h"

namespace ampdist {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t feature_dim() const = 0;
  virtual int32_t classes() const = 0;
  // The shape of one sample: {feature_dim()} for feature vectors, {C, H, W} for images (whose features are the
  // image's pixels in C, H, W order, so that a batch [N, feature_dim()] is the image batch [N, C, H, W]).
  virtual std::vector<int64_t> sample_shape() const { return {feature_dim()}; }
  // Writes sample `index` (0 <= index < size()) to features[0 .. feature_dim()) and *label.
  virtual void get(int64_t index, float* features, int32_t* label) const = 0;
};

// Samples given explicitly: features [n, dim] row-major, labels [n].
class InMemoryDataset : public Dataset {
 public:
  InMemoryDataset(std::vector<float> features, std::vector<int32_t> labels, int64_t feature_dim, int32_t classes);
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int64_t feature_dim() const override { return dim_; }
  int32_t classes() const override { return classes_; }
  void get(int64_t index, float* features, int32_t* label) const override;

 private:
  std::vector<float> features_;
  std::vector<int32_t> labels_;
  int64_t dim_;
  int32_t classes_;
};

// Images and labels in the IDX format of MNIST and Fashion-MNIST (LeCun et al.): big-endian magic 0x00000803
// (uint8 images [n, rows, cols]) and 0x00000801 (uint8 labels [n]), optionally gzip-compressed. Pixels are kept as
// uint8 (1 byte per feature) and normalised on access: (x / 255 - mean) / std.
class IdxDataset : public Dataset {
 public:
  // Reads `images_path` and `labels_path` (each tried as given and with ".gz" appended). Throws Error (bad input)
  // naming the file for a missing file, a wrong magic number, a truncated file, a count mismatch between the two
  // files, or a label >= 10... (any label above 255 is impossible; labels must be < the number of classes, 10).
  IdxDataset(const std::string& images_path, const std::string& labels_path, float mean, float std);
  int64_t size() const override { return n_; }
  int64_t feature_dim() const override { return rows_ * cols_; }
  int32_t classes() const override { return 10; }
  std::vector<int64_t> sample_shape() const override { return {1, rows_, cols_}; }  // [1, 28, 28]
  void get(int64_t index, float* features, int32_t* label) const override;

 private:
  int64_t n_ = 0, rows_ = 0, cols_ = 0;
  float mean_, inv_std_;
  std::vector<uint8_t> pixels_, labels_;
};

// Gaussian class clusters from the counter-based RNG: class c has a centre drawn once from (seed, c); a sample is
// its class centre plus `noise` * N(0, 1) per feature (Box-Muller). Deterministic for (seed, index).
class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(int64_t samples, int64_t features, int32_t classes, float noise, uint64_t seed, uint32_t split);
  int64_t size() const override { return n_; }
  int64_t feature_dim() const override { return dim_; }
  int32_t classes() const override { return classes_; }
  std::vector<int64_t> sample_shape() const override { return image_shape_.empty() ? std::vector<int64_t>{dim_} : image_shape_; }
  // Images of this [C, H, W] shape (C * H * W must equal the feature count).
  void set_image_shape(std::vector<int64_t> chw) { image_shape_ = std::move(chw); }
  // A sample is a pure function of (seed, split, index). A set of at most kCacheBytes of features is drawn whole
  // when it is constructed, and get() then copies: a benchmark's loader otherwise draws millions of normals per step
  // on the cores that train (5% of a ResNet-18 bf16 step on 2 cores, perf). Larger sets are drawn on every read.
  void get(int64_t index, float* features, int32_t* label) const override;
  static constexpr int64_t kCacheBytes = int64_t{256} << 20;

 private:
  void draw(int64_t index, float* features, int32_t* label) const;
  std::vector<int64_t> image_shape_;
  int64_t n_, dim_;
  int32_t classes_;
  float noise_;
  uint64_t seed_;
  uint32_t split_;
  std::vector<float> centres_;
  // The drawn set (empty when it is larger than kCacheBytes): features [n, dim] and labels [n].
  std::vector<float> cache_;
  std::vector<int32_t> cache_labels_;
};

struct DatasetPair {
  std::shared_ptr<Dataset> train, test;
};
// The train and test sets named by data { idx {...} } or data { synthetic {...} }. Throws Error (bad input).
DatasetPair load_datasets(const DataConfig& cfg, uint64_t seed);

}  // namespace ampdist

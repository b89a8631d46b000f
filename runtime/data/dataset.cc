#include "runtime/data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numbers>

#include "runtime/core/error.h"
#include "runtime/core/rng.h"

namespace ampdist {

// ---- InMemoryDataset ------------------------------------------------------------------------------------------

InMemoryDataset::InMemoryDataset(std::vector<float> features, std::vector<int32_t> labels, int64_t feature_dim,
                                 int32_t classes)
    : features_(std::move(features)), labels_(std::move(labels)), dim_(feature_dim), classes_(classes) {
  const std::string where = "in-memory dataset";
  if (dim_ <= 0) throw BadInput(where, "feature_dim must be > 0, got " + std::to_string(dim_));
  if (classes_ <= 0) throw BadInput(where, "classes must be > 0, got " + std::to_string(classes_));
  if (features_.size() != labels_.size() * static_cast<size_t>(dim_))
    throw BadInput(where, std::to_string(features_.size()) + " features do not make " +
                              std::to_string(labels_.size()) + " samples of " + std::to_string(dim_) +
                              " (expected " + std::to_string(labels_.size() * static_cast<size_t>(dim_)) + ")");
  for (size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] < 0 || labels_[i] >= classes_)
      throw BadInput(where, "label " + std::to_string(labels_[i]) + " of sample " + std::to_string(i) +
                                " is outside [0, " + std::to_string(classes_) + ")");
}

void InMemoryDataset::get(int64_t index, float* features, int32_t* label) const {
  AMPDIST_CHECK(index >= 0 && index < size(), "sample " + std::to_string(index) + " of " + std::to_string(size()));
  const float* src = features_.data() + index * dim_;
  std::copy(src, src + dim_, features);
  *label = labels_[static_cast<size_t>(index)];
}

// ---- IdxDataset -----------------------------------------------------------------------------------------------

namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr int64_t kMaxSide = 4096;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// An IDX file opened through zlib, which reads gzip and plain files alike. `path` is the file actually opened
// (the given name or the name + ".gz"), so every message names the file the user has to look at.
class IdxFile {
 public:
  explicit IdxFile(const std::string& given) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::exists(given, ec)) {
      path = given;
    } else if (fs::exists(given + ".gz", ec)) {
      path = given + ".gz";
    } else {
      throw BadInput(given, "no such file (also tried " + given + ".gz)");
    }
    if (fs::is_directory(path, ec)) throw BadInput(path, "is a directory, expected an IDX file");
    f_ = gzopen(path.c_str(), "rb");
    if (!f_) throw BadInput(path, "cannot open: " + std::string(std::strerror(errno)));
  }
  ~IdxFile() {
    if (f_) gzclose(f_);
  }
  IdxFile(const IdxFile&) = delete;
  IdxFile& operator=(const IdxFile&) = delete;

  // Appends up to `max` bytes to `out`, growing it as data arrives: a corrupt header that claims a huge count
  // costs no more memory than the file really holds. Returns the number of bytes read (less than `max` at EOF).
  size_t read_up_to(size_t max, std::vector<uint8_t>& out) {
    size_t start = out.size(), got = 0;
    size_t chunk = 1 << 20;
    while (got < max) {
      size_t want = std::min(max - got, chunk);
      out.resize(start + got + want);
      int r = gzread(f_, out.data() + start + got, static_cast<unsigned>(want));
      if (r < 0) {
        int errnum = 0;
        const char* msg = gzerror(f_, &errnum);
        throw BadInput(path, std::string("read error (corrupt or truncated gzip stream?): ") +
                                 (errnum == Z_ERRNO ? std::strerror(errno) : msg));
      }
      got += static_cast<size_t>(r);
      if (static_cast<size_t>(r) < want) break;  // end of file
      chunk = std::min<size_t>(chunk * 2, size_t{1} << 30);
    }
    out.resize(start + got);
    return got;
  }

  std::string path;

 private:
  gzFile f_ = nullptr;
};

// Reads the magic and `dims` big-endian dimensions; checks the magic against `expected`.
std::vector<int64_t> read_header(IdxFile& f, uint32_t expected, const char* what, int dims) {
  std::vector<uint8_t> h;
  size_t need = 4 * static_cast<size_t>(1 + dims);
  size_t got = f.read_up_to(need, h);
  if (got < 4) throw BadInput(f.path, "truncated: " + std::to_string(got) + " bytes, too short for an IDX header");
  uint32_t magic = be32(h.data());
  if (magic != expected)
    throw BadInput(f.path, "bad IDX magic " + hex32(magic) + ", expected " + hex32(expected) + " (" + what + ")");
  if (got < need)
    throw BadInput(f.path, "truncated: the IDX header needs " + std::to_string(need) + " bytes, file has only " +
                               std::to_string(got));
  std::vector<int64_t> d(dims);
  for (int i = 0; i < dims; ++i) d[i] = be32(h.data() + 4 * (1 + i));
  return d;
}

}  // namespace

IdxDataset::IdxDataset(const std::string& images_path, const std::string& labels_path, float mean, float std)
    : mean_(mean), inv_std_(1.0f / std) {
  if (!(std > 0.0f) || !std::isfinite(std) || !std::isfinite(mean))
    throw BadInput(images_path, "normalisation needs a finite mean and std > 0, got mean " + std::to_string(mean) +
                                    ", std " + std::to_string(std));
  std::string images_file;
  {
    IdxFile f(images_path);
    images_file = f.path;
    std::vector<int64_t> d = read_header(f, kIdxImagesMagic, "uint8 images", 3);
    n_ = d[0];
    rows_ = d[1];
    cols_ = d[2];
    if (n_ <= 0) throw BadInput(f.path, "header says 0 images");
    if (rows_ <= 0 || rows_ > kMaxSide || cols_ <= 0 || cols_ > kMaxSide)
      throw BadInput(f.path, "header says images of " + std::to_string(rows_) + "x" + std::to_string(cols_) +
                                 " (rows and cols must be in [1, " + std::to_string(kMaxSide) + "])");
    size_t want = static_cast<size_t>(n_ * rows_ * cols_);
    size_t got = f.read_up_to(want, pixels_);
    if (got < want)
      throw BadInput(f.path, "truncated: header says " + std::to_string(n_) + " images of " +
                                 std::to_string(rows_) + "x" + std::to_string(cols_) + " = " + std::to_string(want) +
                                 " bytes, file has only " + std::to_string(got));
  }
  {
    IdxFile f(labels_path);
    std::vector<int64_t> d = read_header(f, kIdxLabelsMagic, "uint8 labels", 1);
    int64_t n = d[0];
    if (n <= 0) throw BadInput(f.path, "header says 0 labels");
    if (n != n_)
      throw BadInput(f.path, "count mismatch: " + std::to_string(n) + " labels, but " + images_file + " has " +
                                 std::to_string(n_) + " images");
    size_t got = f.read_up_to(static_cast<size_t>(n), labels_);
    if (got < static_cast<size_t>(n))
      throw BadInput(f.path, "truncated: header says " + std::to_string(n) + " labels = " + std::to_string(n) +
                                 " bytes, file has only " + std::to_string(got));
    for (size_t i = 0; i < labels_.size(); ++i)
      if (labels_[i] >= classes())
        throw BadInput(f.path, "label " + std::to_string(labels_[i]) + " of sample " + std::to_string(i) +
                                   " is out of range [0, " + std::to_string(classes()) + ")");
  }
  pixels_.shrink_to_fit();
  labels_.shrink_to_fit();
}

void IdxDataset::get(int64_t index, float* features, int32_t* label) const {
  AMPDIST_CHECK(index >= 0 && index < n_, "sample " + std::to_string(index) + " of " + std::to_string(n_));
  const int64_t dim = rows_ * cols_;
  const uint8_t* src = pixels_.data() + index * dim;
  for (int64_t j = 0; j < dim; ++j) features[j] = (static_cast<float>(src[j]) / 255.0f - mean_) * inv_std_;
  *label = labels_[static_cast<size_t>(index)];
}

// ---- SyntheticDataset -----------------------------------------------------------------------------------------
//
// Streams (all RngPurpose::kSynthetic, keyed by the seed):
//   centre of class c:  coords {kCentreStream, c, 0}; draws 0.. are Box-Muller pairs, one N(0, 1) per feature.
//   sample i of split:  coords {split, low 32 bits of i, high bits of i}; draw 0 is the label (uniform over the
//                       classes), draws 1.. are Box-Muller pairs for the noise.
// Centres do not depend on the split, so a train set (split 0) and a test set (split 1) share their classes.
// Centre entries ~ N(0, 1): with d features two centres are about sqrt(2d) apart (8 for the default 32), against
// `noise` per feature, so the default is easy for a linear model and a larger noise makes it harder.

namespace {

constexpr uint32_t kCentreStream = 0xFFFFFFFFu;

// out[0 .. n) = N(0, 1) from draws first, first+1, ... of `s` (Box-Muller: two uniforms give two normals).
void normals(const RngStream& s, uint64_t first, int64_t n, float* out) {
  constexpr float kTwoPi = 2.0f * std::numbers::pi_v<float>;
  for (int64_t j = 0; j < n; j += 2) {
    uint64_t k = first + static_cast<uint64_t>(j);
    float u1 = s.uniform(k), u2 = s.uniform(k + 1);
    float r = std::sqrt(-2.0f * std::log(1.0f - u1));  // 1 - u1 in (0, 1]: log is finite
    out[j] = r * std::cos(kTwoPi * u2);
    if (j + 1 < n) out[j + 1] = r * std::sin(kTwoPi * u2);
  }
}

}  // namespace

SyntheticDataset::SyntheticDataset(int64_t samples, int64_t features, int32_t classes, float noise, uint64_t seed,
                                   uint32_t split)
    : n_(samples), dim_(features), classes_(classes), noise_(noise), seed_(seed), split_(split) {
  const std::string where = "synthetic dataset";
  if (n_ <= 0) throw BadInput(where, "samples must be > 0, got " + std::to_string(n_));
  if (n_ >= (int64_t{1} << 56)) throw BadInput(where, "samples must be < 2^56, got " + std::to_string(n_));
  if (dim_ <= 0) throw BadInput(where, "features must be > 0, got " + std::to_string(dim_));
  if (classes_ < 2) throw BadInput(where, "classes must be >= 2, got " + std::to_string(classes_));
  if (!(noise_ >= 0.0f) || !std::isfinite(noise_))
    throw BadInput(where, "noise must be finite and >= 0, got " + std::to_string(noise_));
  AMPDIST_CHECK(split_ != kCentreStream, "split 0xFFFFFFFF is the centres' stream");
  centres_.resize(static_cast<size_t>(classes_) * static_cast<size_t>(dim_));
  for (int32_t c = 0; c < classes_; ++c) {
    RngStream s{seed_, {kCentreStream, static_cast<uint32_t>(c), 0}, RngPurpose::kSynthetic};
    normals(s, 0, dim_, centres_.data() + static_cast<size_t>(c) * dim_);
  }
  if (n_ <= kCacheBytes / static_cast<int64_t>(sizeof(float)) / dim_) {
    cache_.resize(static_cast<size_t>(n_ * dim_));
    cache_labels_.resize(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) draw(i, cache_.data() + i * dim_, &cache_labels_[static_cast<size_t>(i)]);
  }
}

void SyntheticDataset::get(int64_t index, float* features, int32_t* label) const {
  AMPDIST_CHECK(index >= 0 && index < n_, "sample " + std::to_string(index) + " of " + std::to_string(n_));
  if (cache_.empty()) return draw(index, features, label);
  std::memcpy(features, cache_.data() + index * dim_, static_cast<size_t>(dim_) * sizeof(float));
  *label = cache_labels_[static_cast<size_t>(index)];
}

void SyntheticDataset::draw(int64_t index, float* features, int32_t* label) const {
  uint64_t i = static_cast<uint64_t>(index);
  RngStream s{seed_, {split_, static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32)}, RngPurpose::kSynthetic};
  int32_t c = static_cast<int32_t>((uint64_t{s.bits(0)} * static_cast<uint64_t>(classes_)) >> 32);
  *label = c;
  normals(s, 1, dim_, features);
  const float* centre = centres_.data() + static_cast<size_t>(c) * dim_;
  for (int64_t j = 0; j < dim_; ++j) features[j] = centre[j] + noise_ * features[j];
}

// ---- load_datasets --------------------------------------------------------------------------------------------

DatasetPair load_datasets(const DataConfig& cfg, uint64_t seed) {
  DatasetPair p;
  switch (cfg.kind_case()) {
    case DataConfig::kIdx: {
      const IdxDatasetConfig& c = cfg.idx();
      const std::string& dir = c.dir();
      std::error_code ec;
      if (!std::filesystem::exists(dir, ec))
        throw BadInput(dir, "data.idx.dir: no such directory (install Debian's dataset-fashion-mnist or set "
                            "data.idx.dir)");
      if (!std::filesystem::is_directory(dir, ec)) throw BadInput(dir, "data.idx.dir: not a directory");
      if (!(c.std() > 0.0f) || !std::isfinite(c.std()))
        throw BadInput("config", "data.idx.std must be > 0, got " + std::to_string(c.std()));
      if (!std::isfinite(c.mean()))
        throw BadInput("config", "data.idx.mean must be finite, got " + std::to_string(c.mean()));
      p.train = std::make_shared<IdxDataset>(dir + "/train-images-idx3-ubyte", dir + "/train-labels-idx1-ubyte",
                                             c.mean(), c.std());
      p.test = std::make_shared<IdxDataset>(dir + "/t10k-images-idx3-ubyte", dir + "/t10k-labels-idx1-ubyte",
                                            c.mean(), c.std());
      return p;
    }
    case DataConfig::kSynthetic: {
      const SyntheticDatasetConfig& c = cfg.synthetic();
      if (c.train_samples() <= 0)
        throw BadInput("config", "data.synthetic.train_samples must be > 0, got " + std::to_string(c.train_samples()));
      if (c.test_samples() <= 0)
        throw BadInput("config", "data.synthetic.test_samples must be > 0, got " + std::to_string(c.test_samples()));
      int64_t features = c.features();
      if (c.image_shape_size() > 0) {
        int64_t n = 1;
        for (int64_t d : c.image_shape()) {
          if (d <= 0 || d > (int64_t{1} << 16) || c.image_shape_size() != 3)
            throw BadInput("config", "data.synthetic.image_shape must be [C, H, W] with sizes in [1, 65536]");
          n *= d;
        }
        if (c.has_features() && c.features() != n)
          throw BadInput("config", "data.synthetic.features (" + std::to_string(c.features()) +
                                       ") differs from the product of data.synthetic.image_shape (" +
                                       std::to_string(n) + ")");
        features = n;
      }
      if (features <= 0)
        throw BadInput("config", "data.synthetic.features must be > 0, got " + std::to_string(c.features()));
      if (c.classes() < 2)
        throw BadInput("config", "data.synthetic.classes must be >= 2, got " + std::to_string(c.classes()));
      if (!(c.noise() >= 0.0f) || !std::isfinite(c.noise()))
        throw BadInput("config", "data.synthetic.noise must be finite and >= 0, got " + std::to_string(c.noise()));
      auto train = std::make_shared<SyntheticDataset>(c.train_samples(), features, c.classes(), c.noise(), seed, 0);
      auto test = std::make_shared<SyntheticDataset>(c.test_samples(), features, c.classes(), c.noise(), seed, 1);
      if (c.image_shape_size() > 0) {
        const std::vector<int64_t> chw(c.image_shape().begin(), c.image_shape().end());
        train->set_image_shape(chw);
        test->set_image_shape(chw);
      }
      p.train = train;
      p.test = test;
      return p;
    }
    case DataConfig::kTokens:
    case DataConfig::kText:  // token data for language models: load_token_datasets (token_data.h)
    case DataConfig::KIND_NOT_SET:
      break;
  }
  throw BadInput("config", "data: set idx { ... } or synthetic { ... }");
}

}  // namespace ampdist

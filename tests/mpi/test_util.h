// Helpers for the multi-rank tests: tiny models, explicit batches, and cross-rank comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <memory>
#include <string>
#include <vector>

#include "runtime/ampdist.h"

namespace ampdist::testing {

// Collective timeout for tests: a rank that diverges (a bug) stops the test run in a minute instead of hanging.
constexpr double kTimeoutS = 60.0;

// Loss = sum of every output element (a per-sample loss that is linear in the output, e.g. w * x): its gradient
// with respect to each output element is exactly grad_scale. Works on either device (on the GPU it has no device
// path, so the trainer reads the scale on the host).
class SumLoss : public Criterion {
 public:
  double forward(const Tensor& out, std::span<const int32_t>) override {
    out_ = out;
    double s = 0.0;
    for (int64_t i = 0; i < out.numel(); ++i) s += out.item(i);
    return s;
  }
  const Tensor& backward(float grad_scale) override {
    Tensor f = Tensor::empty(out_.shape(), DType::kFloat32);
    for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] = grad_scale;
    grad_.ensure(out_.shape(), out_.dtype(), out_.device());
    kernels::cast(out_.device() == Device::kCPU ? f : f.to(out_.device()), grad_);
    return grad_;
  }

 private:
  Tensor out_, grad_;
};

inline RunConfig config(const std::string& text) { return parse_config_text(text, "test config"); }

// Adds a fault.inject_nonfinite entry: `value` written into `target` (the rank's reduced gradient by default) of rank
// `rank` at step `step`. Returns it for the fields a test sets beyond these (element, layer).
inline NonFiniteInjection* inject_nonfinite(RunConfig& cfg, int64_t step, int rank, NonFiniteValue value = POS_INF,
                                            InjectTarget target = GRADIENT) {
  NonFiniteInjection* f = cfg.mutable_fault()->add_inject_nonfinite();
  f->set_step(step);
  f->set_rank(rank);
  f->set_target(target);
  f->set_value(value);
  return f;
}

// A micro-batch of `rows` FP32 samples (each a vector of features) with label 0.
inline MicroBatch batch(const std::vector<std::vector<float>>& rows, int64_t features) {
  MicroBatch b;
  b.x = Tensor::empty({static_cast<int64_t>(rows.size()), features}, DType::kFloat32);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(b.x.data_as<float>() + i * features, rows[i].data(), features * sizeof(float));
  b.y.assign(rows.size(), 0);
  return b;
}

// A trainer over a single Linear layer without bias (in -> out), for the explicit-step scenarios.
inline std::unique_ptr<Trainer> linear_trainer(const RunConfig& cfg, Communicator& comm, int64_t in, int64_t out,
                                               std::unique_ptr<Criterion> loss = std::make_unique<SumLoss>()) {
  const Autocast ac = make_autocast(cfg, comm.device());
  auto model = std::make_unique<Linear>("w", in, out, /*bias=*/false, ac);
  return std::make_unique<Trainer>(cfg, comm, ac, std::move(model), std::move(loss), nullptr, nullptr);
}

// The bytes of a tensor on either device.
inline std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = t.device() == Device::kCPU ? t : t.to(Device::kCPU);
  const auto* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

// True when `value` is the same on every rank.
inline bool same_on_all_ranks(Communicator& comm, uint64_t value) {
  const std::vector<uint64_t> all = comm.allgather_u64(value, "test gather");
  for (uint64_t v : all)
    if (v != all[0]) return false;
  return true;
}

// A fresh directory under the system temp dir with the same name on every rank (rank 0's random draw), removed
// when the object goes out of scope (by rank 0, after a barrier).
class SharedTempDir {
 public:
  explicit SharedTempDir(Communicator& comm) : comm_(comm) {
    const uint64_t id = comm.allgather_u64(std::random_device{}() * 0x100000000ull + std::random_device{}(), "tmp")[0];
    path_ = (std::filesystem::temp_directory_path() / ("ampdist_test_" + std::to_string(id))).string();
    if (comm.rank() == 0) std::filesystem::create_directories(path_);
    comm.barrier("tmp dir");
  }
  ~SharedTempDir() {
    comm_.barrier("tmp dir cleanup");
    if (comm_.rank() == 0) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }

 private:
  Communicator& comm_;
  std::string path_;
};

inline uint64_t float_bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

inline bool all_finite(const Tensor& t) {
  const float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

}  // namespace ampdist::testing

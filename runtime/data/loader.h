// Loader: this rank's micro-batches for each optimizer step, prepared ahead by a background thread.
//
// The thread fills up to `prefetch_steps` steps ahead into preallocated slots (no allocation once every slot has
// held a full step). An exception on the thread (e.g. a bad sample) is rethrown by next().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/data/dataset.h"
#include "runtime/data/sampler.h"

namespace ampdist {

struct MicroBatch {
  Tensor x;                // [m, feature_dim] FP32, m <= micro-batch size (0 possible in a tail step)
  std::vector<int32_t> y;  // [m] labels
  int64_t size() const { return static_cast<int64_t>(y.size()); }
};

struct StepBatch {
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  int64_t global_samples = 0;     // samples of this step over all ranks and micro-batches
  std::vector<MicroBatch> micro;  // accumulation_steps entries
};

class Loader {
 public:
  // Reads `dataset` in the order `sampler` gives, starting at (epoch, step_in_epoch), with `micro_batches`
  // micro-batches per step. Starts the prefetch thread.
  Loader(std::shared_ptr<const Dataset> dataset, DistributedSampler sampler, int micro_batches,
         int prefetch_steps, int64_t epoch = 0, int64_t step_in_epoch = 0);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next step, valid until the following call. Steps run through epochs without end.
  const StepBatch& next();
  const DistributedSampler& sampler() const { return sampler_; }

 private:
  void run();
  void fill(StepBatch& b, int64_t epoch, int64_t step);

  std::shared_ptr<const Dataset> dataset_;
  DistributedSampler sampler_;
  int micro_batches_;
  std::vector<StepBatch> slots_;
  size_t head_ = 0;       // next slot the consumer takes
  size_t filled_ = 0;     // slots ready
  bool holding_ = false;  // the consumer holds slot head_-1 until its next call
  int64_t next_epoch_, next_step_;
  std::vector<int64_t> indices_;  // the prefetch thread's scratch
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace ampdist

// Evaluator: a model's accuracy and mean loss over a whole test set, each rank taking a contiguous slice of it
// (shard_counts), counts and loss sums added over ranks. Every rank calls run() at the same point (collective).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "runtime/core/tensor.h"
#include "runtime/data/dataset.h"
#include "runtime/nn/module.h"

namespace ampdist {

struct EvalResult {
  int64_t correct = 0, samples = 0;  // summed over ranks, exact
  double loss = 0.0;                 // mean per-sample loss over all ranks
  double accuracy() const { return samples ? static_cast<double>(correct) / samples : 0.0; }
};

class Evaluator {
 public:
  // test: the test set; batch_size: samples per forward on this rank (data.eval_batch_size or the micro-batch);
  // device: where the model runs (its input is copied there unless the model reads host input).
  Evaluator(std::shared_ptr<const Dataset> test, Communicator& comm, Device device, int64_t batch_size);
  // The model in evaluation mode with its working weights current (the caller's job). Collective.
  EvalResult run(Module& model, Criterion& criterion);

 private:
  std::shared_ptr<const Dataset> test_;
  Communicator& comm_;
  Device device_;
  int64_t batch_size_;
  Tensor x_, x_dev_;          // one batch of inputs on the host, and on the GPU
  std::vector<int32_t> y_;
};

}  // namespace ampdist

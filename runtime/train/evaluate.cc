// Evaluation over the whole test set, each rank taking a contiguous slice; counts and losses summed over ranks.
#include <algorithm>

#include "runtime/train/memory_estimate.h"
#include "runtime/train/trainer.h"

namespace ampdist {

EvalResult Trainer::evaluate() {
  EvalResult e;
  if (!test_) return e;
  masters_->ensure_working();
  model_->set_mode(false, iteration_);
  const std::vector<int64_t> counts = shard_counts(test_->size(), comm_.world_size());
  int64_t begin = 0;
  for (int r = 0; r < comm_.rank(); ++r) begin += counts[r];
  const int64_t end = begin + counts[comm_.rank()];
  const int64_t bs = eval_batch_size(cfg_, comm_.world_size());
  const int64_t dim = test_->feature_dim();
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t b = begin; b < end; b += bs) {
    const int64_t n = std::min(bs, end - b);
    eval_x_.ensure({n, dim}, DType::kFloat32);
    eval_y_.resize(n);
    float* x = eval_x_.data_as<float>();
    for (int64_t i = 0; i < n; ++i) test_->get(b + i, x + i * dim, &eval_y_[i]);
    const Tensor* xin = &eval_x_;
    if (device_ == Device::kCUDA && !model_->takes_host_input()) {
      eval_x_dev_.ensure(eval_x_.shape(), eval_x_.dtype(), Device::kCUDA);
      eval_x_.copy_to(eval_x_dev_);
      xin = &eval_x_dev_;
    }
    loss_sum += criterion_->forward(model_->forward(*xin), eval_y_);
    correct += criterion_->correct();
  }
  int64_t c[2] = {correct, end - begin};
  comm_.allreduce_i64(c, ReduceOp::kSum, "evaluation count all-reduce");
  double l[1] = {loss_sum};
  comm_.allreduce_f64(l, ReduceOp::kSum, "evaluation loss all-reduce");
  e.correct = c[0];
  e.samples = c[1];
  e.loss = e.samples ? l[0] / static_cast<double>(e.samples) : 0.0;
  return e;
}

}  // namespace ampdist

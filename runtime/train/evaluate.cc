#include "runtime/train/evaluate.h"

#include <algorithm>

#include "runtime/core/flat_layout.h"  // shard_counts

namespace ampdist {

Evaluator::Evaluator(std::shared_ptr<const Dataset> test, Communicator& comm, Device device, int64_t batch_size)
    : test_(std::move(test)), comm_(comm), device_(device), batch_size_(std::max<int64_t>(batch_size, 1)) {}

EvalResult Evaluator::run(Module& model, Criterion& criterion) {
  const std::vector<int64_t> counts = shard_counts(test_->size(), comm_.world_size());
  int64_t begin = 0;
  for (int r = 0; r < comm_.rank(); ++r) begin += counts[r];
  const int64_t end = begin + counts[comm_.rank()];
  const int64_t dim = test_->feature_dim();
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t b = begin; b < end; b += batch_size_) {
    const int64_t n = std::min(batch_size_, end - b);
    x_.ensure({n, dim}, DType::kFloat32);
    y_.resize(n);
    float* x = x_.data_as<float>();
    for (int64_t i = 0; i < n; ++i) test_->get(b + i, x + i * dim, &y_[i]);
    const Tensor* xin = &x_;
    if (device_ == Device::kCUDA && !model.takes_host_input()) {
      x_dev_.ensure(x_.shape(), x_.dtype(), Device::kCUDA);
      x_.copy_to(x_dev_);
      xin = &x_dev_;
    }
    loss_sum += criterion.forward(model.forward(*xin), y_);
    correct += criterion.correct();
  }
  int64_t c[2] = {correct, end - begin};
  comm_.allreduce_i64(c, ReduceOp::kSum, "evaluation count all-reduce");
  double l[1] = {loss_sum};
  comm_.allreduce_f64(l, ReduceOp::kSum, "evaluation loss all-reduce");
  EvalResult e;
  e.correct = c[0];
  e.samples = c[1];
  e.loss = e.samples ? l[0] / static_cast<double>(e.samples) : 0.0;
  return e;
}

}  // namespace ampdist

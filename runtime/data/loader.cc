#include "runtime/data/loader.h"

#include <algorithm>
#include <string>

#include "runtime/core/error.h"

namespace ampdist {

// The ring: slots_[head_ .. head_ + filled_) (mod K) are ready in order; slot head_ - 1 is the consumer's while
// holding_; the producer fills slot head_ + filled_ whenever filled_ + holding_ < K, so it never touches a slot
// that is ready or held. Slot contents are written by the producer without the lock: ownership passes through
// filled_/holding_, which only change under mu_.

Loader::Loader(std::shared_ptr<const Dataset> dataset, DistributedSampler sampler, int micro_batches,
               int prefetch_steps, int64_t epoch, int64_t step_in_epoch)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), micro_batches_(micro_batches) {
  AMPDIST_CHECK(dataset_ != nullptr, "Loader needs a dataset");
  AMPDIST_CHECK(micro_batches_ == sampler_.options().accumulation_steps,
                "micro_batches = " + std::to_string(micro_batches_) + ", sampler built for " +
                    std::to_string(sampler_.options().accumulation_steps) + " accumulation steps");
  AMPDIST_CHECK(dataset_->size() == sampler_.options().dataset_size,
                "dataset of " + std::to_string(dataset_->size()) + " samples, sampler built for " +
                    std::to_string(sampler_.options().dataset_size));
  AMPDIST_CHECK(epoch >= 0 && step_in_epoch >= 0,
                "start at epoch " + std::to_string(epoch) + ", step " + std::to_string(step_in_epoch));
  // A resume position at or past the end of an epoch continues in the next one.
  const int64_t steps = sampler_.steps_per_epoch();
  next_epoch_ = epoch + step_in_epoch / steps;
  next_step_ = step_in_epoch % steps;
  slots_.resize(static_cast<size_t>(std::max(prefetch_steps, 1)) + 1);
  for (StepBatch& b : slots_) b.micro.resize(static_cast<size_t>(micro_batches_));
  indices_.reserve(static_cast<size_t>(sampler_.micro_batch_size()));
  thread_ = std::thread([this] { run(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

const StepBatch& Loader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (holding_) {
    holding_ = false;  // the previous step's slot goes back to the producer
    cv_.notify_all();
  }
  // Ready steps are handed out before an error, so the exception surfaces at the step that failed.
  cv_.wait(lock, [this] { return filled_ > 0 || error_ || stop_; });
  if (filled_ == 0) {
    if (error_) std::rethrow_exception(error_);
    throw Error("Loader::next called while the loader is being destroyed");
  }
  const size_t slot = head_;
  head_ = (head_ + 1) % slots_.size();
  --filled_;
  holding_ = true;
  cv_.notify_all();
  return slots_[slot];
}

void Loader::run() {
  const size_t k = slots_.size();
  for (;;) {
    size_t slot;
    int64_t epoch, step;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || filled_ + (holding_ ? 1 : 0) < k; });
      if (stop_) return;
      slot = (head_ + filled_) % k;
      epoch = next_epoch_;
      step = next_step_;
    }
    try {
      fill(slots_[slot], epoch, step);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (++next_step_ == sampler_.steps_per_epoch()) {
        next_step_ = 0;
        ++next_epoch_;
      }
      ++filled_;
    }
    cv_.notify_all();
  }
}

void Loader::fill(StepBatch& b, int64_t epoch, int64_t step) {
  const int64_t dim = dataset_->feature_dim();
  b.epoch = epoch;
  b.step_in_epoch = step;
  b.global_samples = sampler_.global_samples(step);
  Shape shape{0, dim};
  for (int k = 0; k < micro_batches_; ++k) {
    MicroBatch& mb = b.micro[static_cast<size_t>(k)];
    sampler_.indices(epoch, step, k, indices_);
    const int64_t m = static_cast<int64_t>(indices_.size());
    shape[0] = m;
    mb.x.ensure(shape, DType::kFloat32);
    mb.y.resize(static_cast<size_t>(m));
    float* x = mb.x.data_as<float>();
    for (int64_t i = 0; i < m; ++i) dataset_->get(indices_[static_cast<size_t>(i)], x + i * dim, &mb.y[i]);
  }
}

}  // namespace ampdist

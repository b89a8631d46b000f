#include "runtime/dist/reducer.h"

#include <algorithm>

#include "runtime/kernels/kernels.h"

namespace ampdist {

std::vector<BucketLayout> plan_buckets(const FlatLayout& layout, int64_t bucket_cap_bytes, int64_t elem_bytes) {
  std::vector<BucketLayout> buckets;
  int64_t bytes = 0;
  for (size_t i = layout.size(); i-- > 0;) {
    const FlatEntry& p = layout[i];
    const int64_t pbytes = p.numel() * elem_bytes;
    if (buckets.empty() || (bytes > 0 && bytes + pbytes > bucket_cap_bytes)) {
      buckets.push_back(BucketLayout{p.offset + p.numel(), p.offset + p.numel(), {}});
      bytes = 0;
    }
    BucketLayout& b = buckets.back();
    if (p.offset + p.numel() != b.begin) throw Error("plan_buckets: tensors are not laid out back to back");
    b.begin = p.offset;
    b.params.push_back(static_cast<int>(i));
    bytes += pbytes;
  }
  return buckets;
}

Reducer::Reducer(Communicator& comm, Tensor grads, const FlatLayout& layout, int64_t bucket_cap_bytes,
                 DType reduce_dtype, const ShardPlan& plan)
    : comm_(comm),
      grads_(std::move(grads)),
      reduce_dtype_(reduce_dtype),
      mode_(plan.sharded() ? Mode::kReduceScatter : Mode::kAllreduce) {
  if (plan.sharded() && plan.world_size() != comm_.world_size())
    throw Error("Reducer: a shard plan for a world of " + std::to_string(plan.world_size()) + " on a world of " +
                std::to_string(comm_.world_size()));
  const std::vector<int64_t> slice_counts = plan.slice_counts(layout.numel());
  buckets_ = plan_buckets(layout, bucket_cap_bytes, static_cast<int64_t>(dtype_size(reduce_dtype)));
  for (const FlatEntry& e : layout.entries()) tensor_names_.push_back(e.name);
  bucket_of_param_.assign(layout.size(), -1);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int p : buckets_[b].params) bucket_of_param_.at(p) = static_cast<int>(b);
  pending_.assign(buckets_.size(), 0);
  works_.resize(buckets_.size());
  staging_.resize(buckets_.size());
  counts_.resize(buckets_.size());
  const int rank = comm_.rank();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    names_.push_back("bucket " + std::to_string(b) + (mode_ == Mode::kAllreduce ? " all-reduce" : " reduce-scatter"));
    const int64_t n = buckets_[b].end - buckets_[b].begin;
    if (mode_ == Mode::kReduceScatter) {  // the bucket's overlap with each rank's slice, in rank order
      counts_[b].assign(comm_.world_size(), 0);
      int64_t sb = 0;
      for (int r = 0; r < comm_.world_size(); ++r) {
        const int64_t lo = std::max(sb, buckets_[b].begin), hi = std::min(sb + slice_counts[r], buckets_[b].end);
        counts_[b][r] = std::max<int64_t>(0, hi - lo);
        sb += slice_counts[r];
      }
    }
    if (mode_ == Mode::kAllreduce) {
      if (reduce_dtype_ != DType::kFloat32) staging_[b] = Tensor::zeros({n}, reduce_dtype_, grads_.device());
    } else {
      // 16-bit: the bucket's 16-bit copy followed by the received shard, in one allocation.
      const int64_t extra = reduce_dtype_ != DType::kFloat32 ? n : 0;
      staging_[b] = Tensor::zeros({extra + counts_[b][rank]}, reduce_dtype_, grads_.device());
      int64_t displ = 0;
      for (int r = 0; r < rank; ++r) displ += counts_[b][r];
      owned_.push_back({buckets_[b].begin + displ, counts_[b][rank]});
    }
  }
  if (mode_ == Mode::kAllreduce) owned_.push_back({0, grads_.numel()});
}

void Reducer::begin_backward(bool final_micro_batch) {
  final_ = final_micro_batch;
  if (!final_) return;
  next_launch_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = static_cast<int>(buckets_[b].params.size());
}

void Reducer::mark_ready(int index) {
  if (!final_) return;
  const int b = bucket_of_param_.at(index);
  if (--pending_[b] < 0)
    throw Error("Reducer: gradient of " + tensor_names_.at(index) + " marked ready twice in one backward");
  while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0) launch(next_launch_++);
}

void Reducer::launch(size_t b) {
  const BucketLayout& bucket = buckets_[b];
  const int64_t n = bucket.end - bucket.begin;
  Tensor g = Tensor::view(grads_.data_as<float>() + bucket.begin, {n}, DType::kFloat32, grads_.device());
  const std::string& what = names_[b];
  if (mode_ == Mode::kAllreduce) {
    if (reduce_dtype_ == DType::kFloat32) {
      works_[b] = comm_.allreduce_async(g.data(), n, DType::kFloat32, ReduceOp::kSum, what);
    } else {
      kernels::cast(g, staging_[b]);
      works_[b] = comm_.allreduce_async(staging_[b].data(), n, reduce_dtype_, ReduceOp::kSum, what);
    }
  } else {
    // OpenMPI's non-blocking reduce-scatter (libnbc) holds a temporary of twice the bucket until it completes: with
    // every bucket in flight at once that is twice the whole gradient, more than sharding saves. At most
    // kReduceScatterInFlight are in flight; the oldest is completed before another starts (on the GPU the wait only
    // orders streams).
    if (b >= kReduceScatterInFlight && works_[b - kReduceScatterInFlight]) {
      works_[b - kReduceScatterInFlight]->wait();
      works_[b - kReduceScatterInFlight].reset();
    }
    const size_t esize = dtype_size(reduce_dtype_);
    const void* send = g.data();
    char* recv = static_cast<char*>(staging_[b].data());
    if (reduce_dtype_ != DType::kFloat32) {
      Tensor copy16 = staging_[b].rows(0, n);
      kernels::cast(g, copy16);
      send = copy16.data();
      recv += n * esize;
    }
    works_[b] = comm_.reduce_scatter_async(send, recv, counts_[b], reduce_dtype_, what);
  }
  ++launches_;
}

void Reducer::wait() {
  if (!final_) throw Error("Reducer::wait() after a non-final micro-batch");
  while (next_launch_ < buckets_.size()) launch(next_launch_++);
  const int rank = comm_.rank();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (works_[b]) works_[b]->wait();  // reduce-scatter mode may have completed it already, before a later launch
    works_[b].reset();
    const BucketLayout& bucket = buckets_[b];
    const int64_t n = bucket.end - bucket.begin;
    if (mode_ == Mode::kAllreduce) {
      if (reduce_dtype_ != DType::kFloat32) {
        Tensor g = Tensor::view(grads_.data_as<float>() + bucket.begin, {n}, DType::kFloat32, grads_.device());
        kernels::cast(staging_[b], g);
      }
    } else {
      const GradSpan& own = owned_[b];
      Tensor dst = Tensor::view(grads_.data_as<float>() + own.begin, {own.count}, DType::kFloat32, grads_.device());
      const int64_t skip = reduce_dtype_ != DType::kFloat32 ? n : 0;
      kernels::cast(staging_[b].rows(skip, skip + counts_[b][rank]), dst);
    }
  }
  final_ = false;
}

}  // namespace ampdist

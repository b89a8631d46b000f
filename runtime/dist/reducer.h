// Reducer: gradient buckets and their reduction across ranks, overlapped with backward (PyTorch DDP's design).
//
// Buckets are contiguous ranges of the flat FP32 gradient buffer, filled in reverse registration order (the order
// backward produces gradients) up to `bucket_cap_bytes` of the reduce dtype each; a parameter larger than the cap
// gets a bucket of its own. During the last micro-batch of a step, a bucket's collective is launched as soon as all
// its parameters' gradients are final, in bucket order (identical on every rank); earlier micro-batches only
// accumulate locally. wait() completes them all.
//
// Reduce dtype FP32: the bucket is summed in place. fp16/bf16: it is cast to a 16-bit staging buffer, summed with
// rounding after every addition, and cast back.
//
// Modes: kAllreduce leaves the whole summed gradient on every rank. kReduceScatter (ZeRO stage 1) leaves on each
// rank only the summed gradient of its slice of the flat space (the slices of the sharded master weights): each
// bucket is reduce-scattered with counts = its overlap with each rank's slice, so the pieces a rank receives tile its
// slice exactly (owned()).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "runtime/core/flat_layout.h"
#include "runtime/core/tensor.h"
#include "runtime/dist/shard_plan.h"

namespace ampdist {

struct BucketLayout {
  int64_t begin = 0, end = 0;  // element range [begin, end) of the flat gradient buffer
  std::vector<int> params;     // tensor indices of the layout, in the order backward makes them ready
};

// A bucket plan over the tensors of a flat layout (registration order, back to back). elem_bytes: bytes per element
// of the reduce dtype.
std::vector<BucketLayout> plan_buckets(const FlatLayout& layout, int64_t bucket_cap_bytes, int64_t elem_bytes);

struct GradSpan {
  int64_t begin = 0, count = 0;
};

class Reducer {
 public:
  // Reduce-scatter mode: collectives in flight at once (see Reducer::launch).
  static constexpr size_t kReduceScatterInFlight = 2;

  enum class Mode { kAllreduce, kReduceScatter };

  // grads: the flat FP32 gradient buffer [layout.numel()]. plan: kAllreduce unsharded; kReduceScatter onto the
  // plan's slices of the flat space when sharded. Throws Error when the plan's world is not the communicator's.
  Reducer(Communicator& comm, Tensor grads, const FlatLayout& layout, int64_t bucket_cap_bytes, DType reduce_dtype,
          const ShardPlan& plan = {});

  const std::vector<BucketLayout>& buckets() const { return buckets_; }
  Mode mode() const { return mode_; }

  // Before each micro-batch's backward. final: the step's last micro-batch, whose gradients are reduced.
  void begin_backward(bool final_micro_batch);
  // Tensor `index` of the layout has its final gradient for this micro-batch (a parameter's, through
  // GradContext::on_grad_ready).
  void mark_ready(int index);
  // Launches any bucket not launched yet and waits for all. Must follow a final micro-batch's backward.
  void wait();
  // The ranges of the flat gradient buffer this rank holds fully reduced after wait(): [0, numel) in allreduce
  // mode; in reduce-scatter mode the pieces of its slice, one per bucket (some may be empty).
  const std::vector<GradSpan>& owned() const { return owned_; }

  // Bucket collectives launched so far (tests check one set per optimizer step).
  int64_t launches() const { return launches_; }

 private:
  void launch(size_t b);

  Communicator& comm_;
  Tensor grads_;
  DType reduce_dtype_;
  Mode mode_;
  std::vector<BucketLayout> buckets_;
  std::vector<int> bucket_of_param_;
  std::vector<int> pending_;  // params not yet ready, per bucket
  std::vector<std::unique_ptr<Work>> works_;
  std::vector<Tensor> staging_;  // per bucket: 16-bit copy (allreduce) or received shard (reduce-scatter)
  std::vector<std::vector<int64_t>> counts_;  // per bucket: shard counts (reduce-scatter)
  std::vector<GradSpan> owned_;
  std::vector<std::string> names_;  // per bucket, for timeout messages
  std::vector<std::string> tensor_names_;          // per tensor, for errors
  size_t next_launch_ = 0;
  bool final_ = false;
  int64_t launches_ = 0;
};

}  // namespace ampdist

// MasterWeights: every parameter of a model in flat buffers: the FP32 master weights, their working copy and the
// gradients.
//
// Tensors are laid out back to back in registration order (core/flat_layout.h):
//   master  FP32          the weights the optimizer updates (what checkpoints save): the whole flat space, or with a
//                         slice (ZeRO stage 1) only this rank's contiguous slice of it
//   working [numel] dtype the fp16/bf16 copy forward and backward read; in an unsharded FP32 run the master buffer
//                         itself, in a sharded FP32 run a full FP32 copy
//   grads   [numel] FP32  gradients (weight-gradient GEMMs write here; the reducer's buckets are ranges of it)
//   fp32    FP32          sharded 16-bit runs only: full FP32 copies of the tensors an FP32 op reads (LayerNorm gains,
//                         embeddings, layers forced to FP32), back to back in layout order
// Flat buffers make every per-step pass one loop: one cast, one unscale + check, one optimizer update. A model's
// parameters get views into these buffers from nn/ (bind_parameters), which also fills them from the parameters'
// initialisation rules.
//
// Sharded (ZeRO stage 1, Rajbhandari et al. 2020): the working copy and the FP32 copies are full on every rank; after
// an applied step each rank writes its slice of them from its master slice (update_working_slice) and the trainer
// all-gathers them (slice_counts, fp32_counts): the all-gather is a collective, which this class does not own.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/core/flat_layout.h"
#include "runtime/core/tensor.h"

namespace ampdist {

// Whose slice of the flat space this rank's master weights hold: world 0 = the whole space (unsharded); otherwise rank
// `rank` of `world` holds the contiguous slice shard_counts(numel, world)[rank] (slices in rank order, balanced to
// one element), the same slicing as a checkpoint's shards.
struct MasterSlice {
  int rank = 0;
  int world = 0;
};

class MasterWeights {
 public:
  // Allocates the buffers for `layout` on `device` (zeros). fp32_reads[i]: tensor i is read by an FP32 op (only
  // consulted when sharded with a 16-bit working dtype; empty: none).
  MasterWeights(FlatLayout layout, DType working_dtype, Device device = Device::kCPU, MasterSlice slice = {},
                std::vector<bool> fp32_reads = {});

  // Fills every buffer from a generator of the full master values: gen(tensor index, first element, count, out)
  // writes elements [first, first + count) of that tensor. Runs in chunks of at most 64 Ki elements (no buffer of
  // the full flat size on the host), then the working copy is current on this rank in full.
  void fill(const std::function<void(size_t, int64_t, int64_t, float*)>& gen);
  // Unsharded: master -> working copy, one pass, round to nearest even (no-op in an FP32 run). Sharded: a no-op, the
  // working copy is kept current by update_working_slice and the all-gather.
  void cast_to_working();
  // The training step's form of cast_to_working: skips the pass when the working copy is known to hold the master
  // weights' rounding, which it is after cast_to_working or after an optimizer update that wrote both
  // (fused_working_out, then mark_working_current). Any non-const access to master() (a checkpoint load, a test
  // writing weights) forgets that, so the next call casts again.
  void ensure_working();
  // The working copy an optimizer update should write alongside the master weights (Optimizer::step's `working`):
  // unsharded 16-bit runs only, else null (FP32: working is master; sharded: update_working_slice writes the slice).
  Tensor* fused_working_out();
  // Records that an update given fused_working_out() has run, so that the working copy is current again. The caller
  // holds the step's order: nothing else wrote master since the update.
  void mark_working_current() { working_current_ = fused_working_out() != nullptr; }
  // Sharded: writes this rank's slice of the working copy and of the FP32 copies from the master slice.
  void update_working_slice();

  bool sharded() const { return sharded_; }
  int64_t slice_begin() const { return slice_.begin; }
  int64_t slice_count() const { return master_.numel(); }
  DType working_dtype() const { return working_dtype_; }
  Device device() const { return device_; }
  int64_t numel() const { return layout_.numel(); }
  const FlatLayout& layout() const { return layout_; }
  Tensor& master() {
    working_current_ = false;  // the caller may write through it (ensure_working)
    return master_;
  }
  const Tensor& master() const { return master_; }
  Tensor& working() { return working_; }
  const Tensor& working() const { return working_; }
  Tensor& fp32_copy() { return fp32_; }
  Tensor& grads() { return grads_; }
  const Tensor& grads() const { return grads_; }
  // The gradient of this rank's slice (the whole buffer when unsharded).
  Tensor grad_slice();
  // Per rank, the elements of the flat space (sharded) and of the FP32 copies each rank writes before the
  // all-gather; empty when unsharded.
  const std::vector<int64_t>& slice_counts() const { return slice_counts_; }
  const std::vector<int64_t>& fp32_counts() const { return fp32_counts_; }

  // Views of tensor i, shaped as the tensor: its working copy, its gradient, and the full FP32 values an FP32 op
  // reads (the master when unsharded; the working copy in a sharded FP32 run; its FP32 copy in a sharded 16-bit run,
  // or an empty tensor when it has none).
  Tensor working_view(size_t i);
  Tensor grad_view(size_t i);
  Tensor fp32_view(size_t i);

  // XXH3-64 of the master buffer's bytes (this rank's slice when sharded; a device buffer is copied to the host
  // first, which synchronises). Trainer::master_hash is the whole run's.
  uint64_t hash() const;
  // XXH3-64 of the working copy, equal on every rank (sharded runs compare it across ranks).
  uint64_t working_hash() const;

 private:
  FlatLayout layout_;
  DType working_dtype_;
  Device device_;
  bool sharded_ = false;
  struct {
    int64_t begin = 0, count = 0;
  } slice_;
  Tensor master_, working_, grads_, fp32_;
  std::vector<int64_t> fp32_offset_;  // per tensor: offset in fp32_, or -1
  std::vector<int64_t> slice_counts_, fp32_counts_;
  bool working_current_ = false;  // unsharded 16-bit: the working copy is the rounding of master_ (ensure_working)
};

}  // namespace ampdist

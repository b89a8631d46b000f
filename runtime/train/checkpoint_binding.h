// CheckpointBinding: the tensors a trainer's checkpoint holds, bound once at set-up: the FP32 master weights (this
// rank's slice when sharded), the optimizer's moments, and the model buffers (BatchNorm running statistics), with
// the manifest's index of each. On the GPU the flat buffers travel through host copies kept here between a
// checkpoint_state() and the restore() that follows a load (load_checkpoint fills the host copies).
//
// The Trainer fills the run's own fields of the manifest (step, epoch, run id, scaler snapshot, optimizer step
// count, master weights hash; train/train_state.cc) and hands the rest to this class.
#pragma once

#include <vector>

#include "ampdist/checkpoint.pb.h"
#include "runtime/amp/master_weights.h"
#include "runtime/amp/scaler_rule.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/nn/module.h"
#include "runtime/optim/optimizer.h"

namespace ampdist {

class CheckpointBinding {
 public:
  // buffers may be null (a model without buffers). All three outlive this object. device: where the step runs.
  CheckpointBinding(MasterWeights& masters, Optimizer& optimizer, ModelBuffers* buffers, Device device)
      : masters_(masters), optimizer_(optimizer), buffers_(buffers), device_(device) {}

  // `meta` with the tensor index, the model buffers' index and values, and the optimizer kind added, and the flat
  // buffers ("master" first, then the optimizer's moments) as views: the state itself on the CPU or with
  // `device_buffers` (AsyncCheckpointer copies its shard from the device), else host copies of the device state
  // (a device -> host copy that waits for the queued steps).
  CheckpointState state(Manifest meta, bool device_buffers);

  // The manifest's model buffers into the model, refused (Error kBadInput, nothing changed) when their index differs
  // from this model's; then, on the GPU, the host copies that load_checkpoint filled into the device state.
  void restore(const Manifest& m);

 private:
  MasterWeights& masters_;
  Optimizer& optimizer_;
  ModelBuffers* buffers_;
  Device device_;
  Tensor host_master_;  // host copies for checkpoints of GPU runs
  std::vector<Tensor> host_optim_;
};

// The loss scaler's state as the manifest stores it, and back (every field, so a resume continues bit for bit).
void write_scaler_state(const LossScalerState& s, ScalerStateProto& out);
LossScalerState read_scaler_state(const ScalerStateProto& in);

}  // namespace ampdist

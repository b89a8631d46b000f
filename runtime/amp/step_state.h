// StepState: everything one optimizer step decides, kept where the step runs, and the one-thread functions that
// decide it.
//
// The training step (train/step.cc) never asks the host what happened: the unscale pass writes found_inf and the
// sum of squares here, the consensus writes the agreed flags here, finish_step (optim/step_gate.h) turns them into
// the optimizer's gate and the scaler update here, and the optimizer kernels read the gate from here. On the CPU backend this struct is
// host memory and the functions below are direct calls; on the GPU it is device memory and each function runs as a
// one-thread kernel (StepStateBuffer), so the CPU tests run the control flow the GPU runs. The host copies the
// struct back only when the loop needs values (log, checkpoint, evaluation, the last step).
//
// A skipped step changes nothing but the scaler: the gate's apply is 0, so weights, moments, the optimizer's step
// count, the schedule position and weight decay stay as they were.
#pragma once

#include <cstdint>

#include "runtime/amp/scaler_rule.h"
#include "runtime/core/host_device.h"
#include "runtime/kernels/update_gate.h"

namespace ampdist {

// A status beyond ScalerStatus: the consensus saw different scales or growth trackers on different ranks (a bug).
constexpr int32_t kStateDisagree = 3;

struct StepState {
  // ---- across steps
  LossScalerState scaler;
  int64_t optimizer_steps = 0;  // applied updates (AdamW's t before this step; the schedule position)
  int64_t scaler_updates = 0;   // loss-scaler updates so far: one per optimizer step
  int32_t status = 0;           // ScalerStatus or kStateDisagree; sticky: once set, every later step is a no-op
  int32_t stop = 0;             // sticky: some rank asked to stop (SIGTERM/SIGUSR1)
  // ---- this step, this rank
  float inv_scale = 1.0f;   // what the unscale pass multiplies by: 1/S (times the DROP_RANK mean correction)
  float found_inf = 0.0f;   // 1 when this rank's reduced gradient holds inf/NaN (the unscale pass ORs into it)
  double sum_sq = 0.0;      // sum of squares of this rank's unscaled gradient
  double step_loss = 0.0;   // sum of per-sample losses of this step's micro-batches on this rank
  float local_bad = 0.0f;   // DROP_RANK: this rank's own gradient is non-finite before the reduction
  float drop_counts[2] = {0.0f, 0.0f};  // DROP_RANK: [ranks, samples] dropped, summed over ranks
  // ---- this step, agreed over ranks (written by Consensus)
  int32_t agreed_found_inf = 0, agreed_stop = 0, disagree = 0;
  // ---- what finish_step decided
  StepGate gate;
  // ---- what the host reads (since the previous read where it says so)
  int32_t last_skipped = 0;   // the agreed flag of the last step
  float last_scale = 1.0f;    // the scale the last step ran with
  float last_lr = 0.0f;       // the learning rate it applied (0 when skipped)
  double grad_norm = 0.0;     // its global norm before clipping (NaN when skipped)
  double loss_sum = 0.0;      // sum over steps since the last read of step_loss / the step's global samples
  int64_t dropped_rank_steps = 0;  // DROP_RANK: ranks dropped, summed over the steps since the last read
  int64_t dropped_samples = 0;     // and their samples
};

// Before the first micro-batch: clears this step's per-rank values; the unscale factor is 1/S.
AMPDIST_HOST_DEVICE void begin_step(StepState& st) {
  st.found_inf = 0.0f;
  st.sum_sq = 0.0;
  st.step_loss = 0.0;
  st.local_bad = 0.0f;
  st.inv_scale = 1.0f / st.scaler.scale;
}

// DROP_RANK, before the count all-reduce: this rank's contribution [dropped?, its samples if dropped].
AMPDIST_HOST_DEVICE void drop_fill(StepState& st, int64_t local_samples) {
  const bool bad = st.local_bad > 0.0f;
  st.drop_counts[0] = bad ? 1.0f : 0.0f;
  st.drop_counts[1] = bad ? static_cast<float>(local_samples) : 0.0f;
}

// DROP_RANK, after the count all-reduce: every rank's loss was divided by the step's global sample count, so the
// mean over the kept samples is the sum times global / kept; no sample kept skips the step.
AMPDIST_HOST_DEVICE void drop_apply(StepState& st, int64_t global_samples) {
  const int64_t dropped = static_cast<int64_t>(st.drop_counts[1]);
  const int64_t kept = global_samples - dropped;
  const double correction = kept > 0 ? static_cast<double>(global_samples) / static_cast<double>(kept) : 0.0;
  st.inv_scale = static_cast<float>(static_cast<double>(st.inv_scale) * correction);
  if (kept <= 0) st.found_inf = 1.0f;
  st.dropped_rank_steps += static_cast<int64_t>(st.drop_counts[0]);
  st.dropped_samples += dropped;
}

// Sharded state: the global sum of squares from every rank's sum over its slice, added in rank order.
AMPDIST_HOST_DEVICE void sum_rank_sums(StepState& st, const double* per_rank, int world) {
  double s = 0.0;
  for (int r = 0; r < world; ++r) s += per_rank[r];
  st.sum_sq = s;
}

}  // namespace ampdist

// ZeRO stage 1's two collectives of a step, between the optimizer and the next forward (DESIGN.md, the step order):
// each rank updates only its slice of the master weights, so the global gradient norm is summed from the ranks'
// slice sums, and the working copy every rank's forward reads is rebuilt from the updated slices.
#pragma once

#include "comm/communicator.h"
#include "runtime/amp/master_weights.h"
#include "runtime/amp/step_state_buffer.h"
#include "runtime/core/tensor.h"

namespace ampdist {

// The ranks' sums of squares of their gradient slices into the step state (StepStateBuffer::sum_rank_sums), in rank
// order on every rank, so every rank computes the same global norm. rank_sums: scratch of 4 * world FP16 elements on
// the step state's device (a double travels as four 16-bit words: the all-gather only moves bytes). Collective.
void reduce_slice_sums(Communicator& comm, StepStateBuffer& state, Tensor& rank_sums);

// Rebuilds the whole working copy (and the FP32 copy of the working dtype's layers, where there is one) from every
// rank's updated master slice: MasterWeights::update_working_slice, then an all-gather over the slice counts.
// Collective; also after a resume, once every rank has restored its slice.
void publish(MasterWeights& masters, Communicator& comm);

}  // namespace ampdist

// The public API of libampdist, in one include: what a program needs to train a model of its own with the runtime
// (examples/custom_model.cc). Tensors and the kernels a layer calls; layers (Module), losses (Criterion) and the
// built-in models; the run config; datasets; the communicators and MPI bootstrap; the loss scaler; checkpoint I/O;
// the Trainer and its loop. The runtime's internals (the Reducer, the consensus, master weights, the step state,
// the shard plan) are reached through these, not named here.
#pragma once

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "runtime/amp/autocast.h"
#include "runtime/amp/loss_scaler.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"
#include "runtime/data/dataset.h"
#include "runtime/kernels/kernels.h"
#include "runtime/nn/cnn.h"
#include "runtime/nn/conv.h"
#include "runtime/nn/mlp.h"
#include "runtime/nn/module.h"
#include "runtime/train/config.h"
#include "runtime/train/loop.h"
#include "runtime/train/trainer.h"

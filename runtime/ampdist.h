// The public API of libampdist, in one include. Everything a program needs to train a model of its own:
// tensors and kernels, layers (Module) and losses (Criterion), the mixed-precision machinery, optimizers,
// datasets, communicators, and the Trainer with its loop. See examples/custom_model.cc.
#pragma once

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/consensus.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/reducer.h"
#include "runtime/amp/autocast.h"
#include "runtime/amp/loss_scaler.h"
#include "runtime/amp/master_weights.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/data/sampler.h"
#include "runtime/kernels/kernels.h"
#include "runtime/nn/mlp.h"
#include "runtime/nn/module.h"
#include "runtime/optim/optimizer.h"
#include "runtime/train/config.h"
#include "runtime/train/loop.h"
#include "runtime/train/trainer.h"

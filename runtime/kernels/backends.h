// The two implementations behind the kernels' public headers (kernels.h, transformer.h, cnn.h): kernels::cpu::
// (kernels/cpu/) and kernels::cuda:: over Tensors (kernels/cuda/), each declared from the op table (kernels/ops.def).
// kernels/dispatch.cc picks one by the tensors' device; the contracts are the public headers'. Internal to the kernels.
#pragma once

#include "runtime/kernels/cnn.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer.h"

#define AMPDIST_OP(id, ret, name, params, args, devices, host_read, check) ret name params;
#define AMPDIST_COMPOSITE_OP(id)

namespace ampdist::kernels::cpu {
#include "runtime/kernels/ops.def"
}  // namespace ampdist::kernels::cpu

namespace ampdist::kernels::cuda {
#include "runtime/kernels/ops.def"
}  // namespace ampdist::kernels::cuda

#undef AMPDIST_OP
#undef AMPDIST_COMPOSITE_OP

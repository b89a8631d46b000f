// What the Tensor-level files of the CUDA backend (kernels/cuda/*_ops.cc) share: the DType codes the launchers take,
// the current device's compute stream, and launch(), which runs a launcher and turns its std::runtime_error into
// ampdist::Error. Internal to the kernels; only in builds with the CUDA backend.
#pragma once

#include <stdexcept>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace ampdist::kernels::cuda::detail {

inline int code(DType t) { return static_cast<int>(t); }
inline void* stream() { return device::compute_stream(); }
template <typename F> void launch(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
}

}  // namespace ampdist::kernels::cuda::detail

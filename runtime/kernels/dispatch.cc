// The public ops of kernels.h, transformer.h and cnn.h: one definition per row of the op table (kernels/ops.def),
// on the CPU backend, or on the CUDA backend when any tensor the row lists lives on the GPU (the CUDA side then
// checks that all of them do); the table's composites are written out after it.
#include <array>

#include "runtime/core/device.h"
#include "runtime/kernels/backends.h"
#include "runtime/kernels/checks.h"
#include "runtime/kernels/device_ops.h"
#include "runtime/kernels/op_table.h"

namespace ampdist::kernels {
namespace {
template <typename... T> bool any_on_gpu(const T&... ts) { return ((ts.device() == Device::kCUDA) || ...); }
bool dev(const Tensor& t) { return t.device() == Device::kCUDA; }
}  // namespace
}  // namespace ampdist::kernels

// Qualified definitions with trailing return types: a row without its declaration in a public header does not
// compile, and the row's types are looked up in ampdist::kernels.
#define AMPDIST_OP(id, ret, name, params, args, devices, host_read, check) \
  auto ampdist::kernels::name params -> ret {                              \
    check;                                                                 \
    if (host_read) device::note_host_read();                               \
    if (any_on_gpu devices) return cuda::name args;                        \
    return cpu::name args;                                                 \
  }
#define AMPDIST_COMPOSITE_OP(id)
#include "runtime/kernels/ops.def"
#undef AMPDIST_OP
#undef AMPDIST_COMPOSITE_OP

namespace ampdist::kernels {

std::span<const std::string_view> op_ids() {
#define AMPDIST_OP(id, ret, name, params, args, devices, host_read, check) #id,
#define AMPDIST_COMPOSITE_OP(id) #id,
  static constexpr std::string_view kIds[] = {
#include "runtime/kernels/ops.def"
  };
#undef AMPDIST_OP
#undef AMPDIST_COMPOSITE_OP
  return kIds;
}

void softmax_cross_entropy_forward_to(const Tensor& logits, std::span<const int32_t> targets, Tensor& targets_dev,
                                      Tensor& lse, Tensor& row_loss, double* loss_sum, double divisor) {
  if (dev(logits))
    return gpu::softmax_cross_entropy_forward(logits, targets, targets_dev, lse, row_loss, loss_sum, divisor);
  *loss_sum += cpu::softmax_cross_entropy_forward(logits, targets, lse) / divisor;  // host memory: the step state
}
void softmax_cross_entropy_backward_from(const Tensor& logits, std::span<const int32_t> targets,
                                         const Tensor& targets_dev, const Tensor& lse, const float* scale,
                                         double divisor, float row_divisor, Tensor& dlogits) {
  if (dev(logits) || dev(dlogits))
    return gpu::softmax_cross_entropy_backward(logits, targets_dev, lse, 0.0f, scale, divisor, row_divisor, dlogits);
  const float grad_scale = static_cast<float>(static_cast<double>(*scale) / divisor) / row_divisor;
  cpu::softmax_cross_entropy_backward(logits, targets, lse, grad_scale, dlogits);
}

}  // namespace ampdist::kernels

// The op families of the runtime, one function each, dispatched on the tensors' device.
//
// Implementations: kernels/cpu/ (oneDNN for GEMMs, Eigen and loops for the rest), kernels/cuda/ when the CUDA backend is built. Each op's
// per-element arithmetic comes from kernels/math.h. Shapes are row-major; "[B, N]" is B rows of N elements.
// Every function throws ampdist::Error on a shape, dtype or device mismatch, naming the op.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/core/tensor.h"
#include "runtime/kernels/exec_context.h"
#include "runtime/kernels/update_gate.h"

namespace ampdist::kernels {

// ---- casts ---------------------------------------------------------------------------------------------------
// dst[i] = src[i] converted (round to nearest even; inf, NaN and subnormals kept). Same numel, any dtypes.
void cast(const Tensor& src, Tensor& dst);

// ---- GEMM (the tensor-core contract) ------------------------------------------------------------------------
// C = alpha * op(A) @ op(B) + beta * C (+ bias broadcast over rows), op(X) = X or X^T.
// op(A): [M, K], op(B): [K, N], C: [M, N]; bias: [N] or undefined.
// A and B have one dtype (fp32, fp16 or bf16); they are multiplied exactly and accumulated in FP32 (the CPU backend:
// oneDNN, natively for bf16 and after an exact conversion to FP32 for fp16, kernels/cpu/onednn.h; the CUDA
// backend: cuBLAS), and the result, bias included, is rounded once to C's dtype. C may be FP32 (e.g. a
// weight gradient written straight into the FP32 gradient buffer) or the inputs' dtype. beta != 0 needs FP32 C.
// K == 0 gives C = beta * C (+ bias).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha = 1.0f,
          float beta = 0.0f, const Tensor* bias = nullptr);

// ---- reductions over rows --------------------------------------------------------------------------------------
// out[j] = beta * out[j] + sum_i x[i, j], x: [B, N] any dtype, out: [N] FP32, summed in FP32 (bias gradients).
void sum_rows(const Tensor& x, Tensor& out, float beta);

// ---- activations (element-wise; output keeps the input's dtype, math in FP32) --------------------------------
void relu_forward(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx);  // from the forward output y
// GELU (tanh form, math.h) with e = exp(2u) from the backend's exp: CUDA's expf on the GPU (within 2 ulp of the
// correctly rounded value); on the CPU Eigen's vectorised exp for FP32 tensors and glibc's expf, through exact
// tables, for fp16 / bf16 ones (each within 1 ulp). So the GPU and the CPU, and the CPU's FP32 and 16-bit paths, may differ in
// the last bits; tests/gpu/gelu_bound.h bounds how far.
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);  // from the forward input x

// ---- softmax cross-entropy (always FP32 arithmetic) -----------------------------------------------------------
// logits: [B, C] any dtype; targets: B class indices in [0, C). Returns sum_i (logsumexp(z_i) - z_i[t_i]) with
// each row in FP32 (max-subtracted) and the sum over rows in double, so a sum beyond the fp16 range is exact
// enough; writes each row's probabilities' log-sum-exp to lse [B] FP32 for the backward.
// Throws Error (bad input) naming the row when a target is out of range.
double softmax_cross_entropy_forward(const Tensor& logits, std::span<const int32_t> targets, Tensor& lse);
// dlogits[i, c] = grad_scale * (softmax(z_i)[c] - [c == t_i]), computed in FP32, rounded once to dlogits' dtype.
void softmax_cross_entropy_backward(const Tensor& logits, std::span<const int32_t> targets, const Tensor& lse,
                                    float grad_scale, Tensor& dlogits);
// Row-wise argmax of logits [B, C] compared with targets: number of rows where they agree.
int64_t count_correct(const Tensor& logits, std::span<const int32_t> targets);

// The training step's loss on the step state: the same two calls on both backends, neither reads a value back to
// the host (the trainer reads the state at due steps). loss_sum and scale point into the step state on the logits'
// device (host memory on the CPU, device memory on the GPU).
// Forward: adds softmax_cross_entropy_forward's sum / divisor to *loss_sum (a double; the GPU sums the rows in
// another fixed order). targets are checked on the host (Error, bad input, naming the row); targets_dev and
// row_loss are scratch of the caller's that carry the targets and row losses on the GPU (resized there; unused on
// the CPU): keep targets_dev for the backward.
void softmax_cross_entropy_forward_to(const Tensor& logits, std::span<const int32_t> targets, Tensor& targets_dev,
                                      Tensor& lse, Tensor& row_loss, double* loss_sum, double divisor);
// Backward with grad_scale = float(*scale / divisor) / row_divisor, formed where *scale lives, in the same roundings
// on both backends (the trainer's float(S / global samples), then a criterion's own division in FP32, such as the
// GPT's by the sequence length; row_divisor 1 changes nothing).
void softmax_cross_entropy_backward_from(const Tensor& logits, std::span<const int32_t> targets,
                                         const Tensor& targets_dev, const Tensor& lse, const float* scale,
                                         double divisor, float row_divisor, Tensor& dlogits);

// ---- mixed precision -------------------------------------------------------------------------------------------
struct UnscaleResult {
  bool found_inf = false;  // any element inf or NaN after unscaling
  double sum_sq = 0.0;     // sum of squares of the unscaled finite elements (for the global norm)
};
// One fused pass: g[i] *= inv_scale, records non-finite elements, accumulates squares. grads: FP32. At
// inv_scale == 1 the CPU pass leaves the buffer as it is (g * 1 == g for every finite float; a NaN's payload may
// differ, which does not matter: found_inf then skips the step).
UnscaleResult unscale_and_check(Tensor& grads, float inv_scale);
// The training step's form of the same pass, on the step state's fields (pointers on the tensor's device, so the GPU
// never waits): g[i] *= *inv_scale; *found_inf = 1 when any element is inf or NaN (never cleared here);
// *sum_sq += the sum of squares of the finite elements, in the same order as above (bitwise the same sums).
void unscale_and_check(Tensor& grads, const float* inv_scale, float* found_inf, double* sum_sq);
// *bad = 1 when any element of x (FP32) is inf or NaN; x is not changed. bad: on x's device.
void check_nonfinite(const Tensor& x, float* bad);
// x = 0 when *flag > 0 (flag on x's device); otherwise x is left as it is.
void zero_if(Tensor& x, const float* flag);
// dst = src (equal element counts and dtypes, one device) unless *flag != 0, with flag an int32 where the tensors
// live (the step state's agreed found_inf): a commit that only an applied step makes, decided where the step runs.
void copy_unless(Tensor& dst, const Tensor& src, const int32_t* flag);
// sum_i x[i]^2 over an FP32 tensor, accumulated in double (the global norm of gathered gradients).
double sum_squares(const Tensor& x);
// The same sum written to *out, a double on x's device (the step state's sum_sq; the GPU does not wait).
void sum_squares(const Tensor& x, double* out);
// g[i] *= factor (clipping).
void scale_inplace(Tensor& x, float factor);

// ---- optimizers over flat FP32 buffers (formulas in math.h) ---------------------------------------------------
// With a gate (the training step: a StepGate on the buffers' device, from optim/step_gate.h's finish_step), the
// update happens only when gate->apply, and lr, first_step, the clip factor and AdamW's bias corrections come from
// the gate; the params' lr, first_step and step are then ignored. Without one (null), they come from the params,
// with no clipping.
// working: null, or an [n] fp16 or bf16 tensor on the params' device, the working copy of these params. Each updated
// element is then also rounded into it (round to nearest even: cast()'s bits), in the same pass: the unsharded 16-bit
// step's cast of the master weights at the start of the next step is this write, at 2 bytes an element instead of a
// separate pass reading 4 and writing 2. When the gate skips the update, working is not written either.
// Throws Error for a working tensor of another dtype, element count or device.
struct SgdParams {
  float lr, momentum, dampening, weight_decay;
  bool nesterov, first_step;
};
void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdParams& p,
              const StepGate* gate = nullptr, Tensor* working = nullptr);

struct AdamWParams {
  float lr;
  double beta1, beta2, eps;  // doubles, as torch.optim.AdamW's Python floats
  float weight_decay;
  int64_t step;  // 1-based count including this update
};
void adamw_step(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const AdamWParams& p,
                const StepGate* gate = nullptr, Tensor* working = nullptr);

// ---- numerics report ---------------------------------------------------------------------------------------------
struct AbsStats {
  float max_abs = 0.0f;   // max |x| over the finite elements
  bool nonfinite = false; // some element is inf or NaN
  int64_t below = 0;      // elements with 0 < |x| <= threshold
};
// Statistics of x (any dtype) for the numerics report; the result is on the host (a device tensor synchronises).
AbsStats abs_stats(const Tensor& x, float threshold);

}  // namespace ampdist::kernels

namespace ampdist::kernels {
// The team the CPU kernels (oneDNN's OpenMP threads) use for the calling thread's calls now: the ExecScope's
// threads inside one (exec_context.h).
int num_threads();
// The CPUs this process may run on: its affinity mask (sched_getaffinity), which a launcher narrows when it binds
// ranks (mpirun binds each rank to one core when it starts 2 or fewer, to a socket above that; srun --cpu-bind);
// std::thread::hardware_concurrency() where the mask cannot be read.
int available_cpus();
}  // namespace ampdist::kernels

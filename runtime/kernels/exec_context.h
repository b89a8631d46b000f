// ExecContext: how the kernels a thread calls may execute. A run decides it once from its config
// (train.threads_per_rank, precision.allow_tf32) and every call into its step, evaluation or state runs inside it
// (ExecScope, which the Trainer opens around each of them). There is no process-wide switch: two trainers in one
// process (tests, tools) keep their own settings, and code outside any scope gets the defaults below.
#pragma once

namespace ampdist::kernels {

struct ExecContext {
  // The CPU kernels' team (oneDNN's OpenMP threads and the element-wise loops) for this thread's calls. 0 leaves the
  // thread's team as it is: OpenMP's default (OMP_NUM_THREADS, else every CPU) outside any scope.
  int threads = 0;
  // Whether FP32 GEMMs and convolutions on the GPU may round their inputs to TF32 (cuBLAS's FAST_TF32 compute type,
  // cuDNN's default math). Off by default, as PyTorch's allow_tf32 for matmuls since 1.12; fp16/bf16 GEMMs always
  // accumulate in FP32. No effect on the CPU.
  bool allow_tf32 = false;
};

// The innermost ExecScope's context on the calling thread, or the defaults above when there is none.
const ExecContext& current_exec_context();

// Makes `ctx` the calling thread's context until the scope ends, then restores the one before (scopes nest). Not
// copyable; lives on the stack of the thread it applies to.
class ExecScope {
 public:
  explicit ExecScope(const ExecContext& ctx);
  ~ExecScope();
  ExecScope(const ExecScope&) = delete;
  ExecScope& operator=(const ExecScope&) = delete;

 private:
  const ExecContext* outer_;  // the enclosing scope's context, or null
  int outer_threads_;         // the thread's OpenMP team size before this scope
};

}  // namespace ampdist::kernels

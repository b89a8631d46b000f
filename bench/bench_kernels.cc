// Micro-benchmarks of the hot CPU kernels, reported as FLOP/s or bytes/s:
//   build/bench/ampdist_bench_kernels --benchmark_counters_tabular=true
// GEMMs by input dtype show the cost of the tensor-core contract on the CPU (exact conversion to FP32, sgemm,
// one rounding); the passes over flat buffers are memory-bound and read as bytes/s. The machine's own limits are
// measured beside them, on one thread like the kernels: BM_Sgemm (oneDNN's f32 matmul called directly, what the
// GEMM wrapper calls) and BM_MemoryCopy (memcpy, counted as bytes read + written, as STREAM's copy counts). Every
// benchmark runs on one thread: main() holds a one-thread kernels::ExecScope around the whole run.
#include <oneapi/dnnl/dnnl.hpp>
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "runtime/kernels/kernels.h"

namespace {

using ampdist::DType;
using ampdist::Tensor;

Tensor filled(const ampdist::Shape& shape, DType dtype, float value) {
  Tensor f = Tensor::empty(shape, DType::kFloat32);
  float* p = f.data_as<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = value * static_cast<float>((i % 17) - 8);
  Tensor t = Tensor::empty(shape, dtype);
  ampdist::kernels::cast(f, t);
  return t;
}

void BM_Gemm(benchmark::State& state, DType dtype) {
  const int64_t n = state.range(0);
  Tensor a = filled({n, n}, dtype, 0.01f), b = filled({n, n}, dtype, 0.02f);
  Tensor c = Tensor::empty({n, n}, dtype);
  for (auto _ : state) ampdist::kernels::gemm(a, false, b, true, c);
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK_CAPTURE(BM_Gemm, fp32, DType::kFloat32)->Arg(256)->Arg(512);
BENCHMARK_CAPTURE(BM_Gemm, fp16, DType::kFloat16)->Arg(256)->Arg(512);
BENCHMARK_CAPTURE(BM_Gemm, bf16, DType::kBFloat16)->Arg(256)->Arg(512);

// The main job's largest GEMM, fc1 forward: [128, 784] x [512, 784]^T, at the sizes a 1-rank step runs it.
void BM_GemmMainJobFc1(benchmark::State& state, DType dtype) {
  Tensor x = filled({128, 784}, dtype, 0.01f), w = filled({512, 784}, dtype, 0.02f);
  Tensor y = Tensor::empty({128, 512}, dtype);
  for (auto _ : state) ampdist::kernels::gemm(x, false, w, true, y);
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * 128 * 784 * 512, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK_CAPTURE(BM_GemmMainJobFc1, fp32, DType::kFloat32);
BENCHMARK_CAPTURE(BM_GemmMainJobFc1, fp16, DType::kFloat16);
BENCHMARK_CAPTURE(BM_GemmMainJobFc1, bf16, DType::kBFloat16);

// oneDNN's f32 matmul on FP32 buffers through its own API (no wrapper): the engine's rate, the GEMM's limit.
void BM_Sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(static_cast<size_t>(n) * n, 0.01f), b(a.size(), 0.02f), c(a.size());
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc ma({n, n}, dnnl::memory::data_type::f32, tag::ab);
  const dnnl::memory::desc mb({n, n}, dnnl::memory::data_type::f32, tag::ba);
  dnnl::matmul mm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ma, mb, ma), eng));
  dnnl::memory A(ma, eng, a.data()), B(mb, eng, b.data()), C(ma, eng, c.data());
  for (auto _ : state) {
    mm.execute(s, {{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B}, {DNNL_ARG_DST, C}});
    s.wait();
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Sgemm)->Arg(256)->Arg(512);

void BM_MemoryCopy(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> src(n, 1.0f), dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 8);  // read + write
}
BENCHMARK(BM_MemoryCopy)->Arg(1 << 16)->Arg(1 << 24);

void BM_CastToWorking(benchmark::State& state, DType dtype) {
  const int64_t n = state.range(0);
  Tensor master = filled({n}, DType::kFloat32, 0.1f), working = Tensor::empty({n}, dtype);
  for (auto _ : state) ampdist::kernels::cast(master, working);
  state.SetBytesProcessed(state.iterations() * n * (4 + 2));
}
BENCHMARK_CAPTURE(BM_CastToWorking, fp16, DType::kFloat16)->Arg(1 << 16)->Arg(1 << 24);
BENCHMARK_CAPTURE(BM_CastToWorking, bf16, DType::kBFloat16)->Arg(1 << 16)->Arg(1 << 24);

void BM_UnscaleAndCheck(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor g = filled({n}, DType::kFloat32, 1.0f);
  for (auto _ : state) benchmark::DoNotOptimize(ampdist::kernels::unscale_and_check(g, 1.0f));
  state.SetBytesProcessed(state.iterations() * n * 8);  // read + write
}
BENCHMARK(BM_UnscaleAndCheck)->Arg(1 << 16)->Arg(1 << 24);

// The optimizer passes of an unsharded bf16 step, three ways: the update alone (FP32 runs), the update writing the
// bf16 working copy in its own pass (what the step does), and the update followed by a separate cast of the master
// weights (what it did before): the difference of the last two is what the fused write saves per step.
enum class WorkingCopy { kNone, kFused, kSeparateCast };

int64_t working_bytes(WorkingCopy w) { return w == WorkingCopy::kFused ? 2 : w == WorkingCopy::kSeparateCast ? 6 : 0; }

void update_working(Tensor& p, Tensor& working, WorkingCopy w) {
  if (w == WorkingCopy::kSeparateCast) ampdist::kernels::cast(p, working);
}

void BM_SgdNesterov(benchmark::State& state, WorkingCopy w) {
  const int64_t n = state.range(0);
  Tensor p = filled({n}, DType::kFloat32, 0.1f), g = filled({n}, DType::kFloat32, 0.01f);
  Tensor buf = Tensor::zeros({n}, DType::kFloat32), working = Tensor::empty({n}, DType::kBFloat16);
  Tensor* out = w == WorkingCopy::kFused ? &working : nullptr;
  bool first = true;
  for (auto _ : state) {
    ampdist::kernels::sgd_step(p, g, buf, {0.01f, 0.9f, 0.0f, 1e-4f, true, first}, nullptr, out);
    update_working(p, working, w);
    first = false;
  }
  // read p, g, buf; write p, buf; and the working copy's traffic
  state.SetBytesProcessed(state.iterations() * n * (4 * 5 + working_bytes(w)));
}
BENCHMARK_CAPTURE(BM_SgdNesterov, fp32, WorkingCopy::kNone)->Arg(1 << 16)->Arg(1 << 24);
BENCHMARK_CAPTURE(BM_SgdNesterov, bf16_fused, WorkingCopy::kFused)->Arg(1 << 16)->Arg(1 << 24);
BENCHMARK_CAPTURE(BM_SgdNesterov, bf16_then_cast, WorkingCopy::kSeparateCast)->Arg(1 << 16)->Arg(1 << 24);

void BM_AdamW(benchmark::State& state, WorkingCopy w) {
  const int64_t n = state.range(0);
  Tensor p = filled({n}, DType::kFloat32, 0.1f), g = filled({n}, DType::kFloat32, 0.01f);
  Tensor m = Tensor::zeros({n}, DType::kFloat32), v = Tensor::zeros({n}, DType::kFloat32);
  Tensor working = Tensor::empty({n}, DType::kBFloat16);
  Tensor* out = w == WorkingCopy::kFused ? &working : nullptr;
  int64_t step = 0;
  for (auto _ : state) {
    ampdist::kernels::adamw_step(p, g, m, v, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, ++step}, nullptr, out);
    update_working(p, working, w);
  }
  // read p, g, m, v; write p, m, v; and the working copy's traffic
  state.SetBytesProcessed(state.iterations() * n * (4 * 7 + working_bytes(w)));
}
BENCHMARK_CAPTURE(BM_AdamW, fp32, WorkingCopy::kNone)->Arg(1 << 16)->Arg(1 << 24);
BENCHMARK_CAPTURE(BM_AdamW, bf16_fused, WorkingCopy::kFused)->Arg(1 << 16)->Arg(1 << 24);
BENCHMARK_CAPTURE(BM_AdamW, bf16_then_cast, WorkingCopy::kSeparateCast)->Arg(1 << 16)->Arg(1 << 24);

}  // namespace

int main(int argc, char** argv) {
  const ampdist::kernels::ExecContext one_thread{1, false};  // single-thread rates: the engine, not a team
  const ampdist::kernels::ExecScope scope(one_thread);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

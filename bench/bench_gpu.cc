// GPU micro-benchmarks: one per kernel family of the CUDA backend, at GPT-2 small sizes (12 layers, C = 768,
// T = 1024, batch 8, 124M parameters), each printed as achieved bandwidth or FLOP/s against the NVIDIA H200 SXM
// datasheet rates (HBM3e 4.8 TB/s; dense BF16/FP16 tensor cores 989 TFLOP/s; FP32 67 TFLOP/s), and an all-reduce
// benchmark over NcclCommunicator that checks its results as nccl-tests does.
//
//   ampdist_bench_gpu kernels                      one process, this process's GPU 0
//   mpirun -np N ampdist_bench_gpu allreduce       one rank per GPU; bus bandwidth = algbw * 2 (N - 1) / N
//
// Times are wall time over many launches between two synchronisations of the compute stream (ms-scale batches, so
// launch gaps count, as they do in a training step). Bytes are the minimum each kernel must move; FLOPs are 2 per
// multiply-add, the causal attention's masked half included (the GEMMs compute it).
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/nccl_communicator.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/device_ops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer.h"

namespace ampdist {
namespace {

constexpr double kHbmBytesPerS = 4.8e12;   // H200 SXM, HBM3e
constexpr double kTensorFlops = 989e12;    // H200 SXM, dense BF16/FP16
constexpr double kFp32Flops = 67e12;       // H200 SXM, FP32 (non-tensor)

// Seconds per call of f, over enough calls to fill at least 50 ms after 3 warm-up calls.
double time_per_call(const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  device::synchronize();
  int n = 1;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    device::synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > 0.05 || n >= (1 << 16)) return dt / n;
    n *= 4;
  }
}

void report_bw(const std::string& name, double s, double bytes) {
  std::printf("kernel %-44s %9.1f us %8.1f GB/s  %5.1f%% of HBM3e 4.8 TB/s\n", name.c_str(), s * 1e6, bytes / s / 1e9,
              100.0 * bytes / s / kHbmBytesPerS);
}
void report_flops(const std::string& name, double s, double flops, double peak, const char* peak_name) {
  std::printf("kernel %-44s %9.1f us %8.1f TFLOP/s %5.1f%% of %s\n", name.c_str(), s * 1e6, flops / s / 1e12,
              100.0 * flops / s / peak, peak_name);
}

Tensor filled(const Shape& shape, DType t, float lo, float hi, uint32_t seed) {
  Tensor h = Tensor::empty(shape, DType::kFloat32);
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < h.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    h.data_as<float>()[i] = lo + (hi - lo) * static_cast<float>(x >> 8) / 16777216.0f;
  }
  Tensor c = Tensor::empty(shape, t);
  kernels::cast(h, c);
  return c.to(Device::kCUDA);
}

int run_kernels() {
  const int64_t B = 8, T = 1024, C = 768, H = 12, hs = 64, N = B * T, V = 50304, P = 124'000'000;
  const DType bf = DType::kBFloat16, f32 = DType::kFloat32;
  const device::Properties prop = device::properties(device::current_device());
  std::printf("device: %s (sm_%d%d, %d SMs); sizes of GPT-2 small: B %ld T %ld C %ld H %ld, %ld parameters\n",
              prop.name.c_str(), prop.major, prop.minor, prop.multiprocessors, static_cast<long>(B),
              static_cast<long>(T), static_cast<long>(C), static_cast<long>(H), static_cast<long>(P));
  {  // GEMM: the MLP's first Linear, [N, C] x [C, 4C]
    for (DType t : {bf, f32}) {
      const Tensor a = filled({N, C}, t, -1, 1, 1), w = filled({4 * C, C}, t, -1, 1, 2);
      Tensor c = Tensor::empty({N, 4 * C}, t, Device::kCUDA);
      const double s = time_per_call([&] { kernels::gemm(a, false, w, true, c, 1.0f, 0.0f); });
      const std::string name = std::string("gemm ") + dtype_name(t) + " [8192x768]x[768x3072]";
      if (t == bf) report_flops(name, s, 2.0 * N * C * 4 * C, kTensorFlops, "dense BF16 989 TFLOP/s");
      else report_flops(name, s, 2.0 * N * C * 4 * C, kFp32Flops, "FP32 67 TFLOP/s");
    }
  }
  {  // element-wise: cast, GELU forward and backward
    const int64_t n = N * 4 * C;
    const Tensor x32 = filled({n}, f32, -4, 4, 3);
    Tensor x16 = Tensor::empty({n}, bf, Device::kCUDA), y16 = Tensor::empty({n}, bf, Device::kCUDA);
    report_bw("cast fp32 -> bf16 [25.2M]", time_per_call([&] { kernels::cast(x32, x16); }), 6.0 * n);
    report_bw("gelu forward bf16 [25.2M]", time_per_call([&] { kernels::gelu_forward(x16, y16); }), 4.0 * n);
    Tensor dx = Tensor::empty({n}, bf, Device::kCUDA);
    report_bw("gelu backward bf16 [25.2M]", time_per_call([&] { kernels::gelu_backward(x16, y16, dx); }), 6.0 * n);
  }
  {  // LayerNorm forward and backward, [N, C] bf16 in, bf16 out, FP32 parameters and gradients
    const Tensor x = filled({N, C}, bf, -2, 2, 4), gamma = filled({C}, f32, 0.5, 1.5, 5), beta = filled({C}, f32, -1, 1, 6);
    Tensor y = Tensor::empty({N, C}, bf, Device::kCUDA), mean = Tensor::empty({N}, f32, Device::kCUDA),
           rstd = Tensor::empty({N}, f32, Device::kCUDA);
    report_bw("layernorm forward bf16 [8192x768]",
              time_per_call([&] { kernels::layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd); }), 4.0 * N * C);
    const Tensor dy = filled({N, C}, bf, -1, 1, 7);
    Tensor dx = Tensor::empty({N, C}, f32, Device::kCUDA), dg = Tensor::zeros({C}, f32, Device::kCUDA),
           db = Tensor::zeros({C}, f32, Device::kCUDA);
    report_bw("layernorm backward bf16 -> fp32 dx [8192x768]", time_per_call([&] {
                kernels::layernorm_backward(x, gamma, mean, rstd, dy, dx, false, dg, db, false);
              }),
              8.0 * N * C);
  }
  {  // column sums: a bias gradient
    const Tensor dy = filled({N, 4 * C}, bf, -1, 1, 8);
    Tensor out = Tensor::zeros({4 * C}, f32, Device::kCUDA);
    report_bw("sum_rows bf16 [8192x3072]", time_per_call([&] { kernels::sum_rows(dy, out, 0.0f); }), 2.0 * N * 4 * C);
  }
  {  // embedding backward (byte tokens spread over a GPT-2 vocabulary's rows)
    std::vector<int32_t> tokens(N);
    for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7919) % V);
    const Tensor dout = filled({N, C}, bf, -1, 1, 9);
    Tensor dwte = Tensor::zeros({V, C}, f32, Device::kCUDA), dwpe = Tensor::zeros({T, C}, f32, Device::kCUDA);
    report_bw("embedding backward bf16 [8192x768], V 50304", time_per_call([&] {
                kernels::embedding_backward(tokens, T, dout, dwte, false, dwpe, false);
              }),
              2.0 * N * C + 8.0 * N * C + 8.0 * T * C);
  }
  {  // softmax cross-entropy over the GPT-2 vocabulary
    const int64_t rows = 2048;
    std::vector<int32_t> targets(rows);
    for (int64_t i = 0; i < rows; ++i) targets[i] = static_cast<int32_t>((i * 31) % V);
    const Tensor z = filled({rows, V}, bf, -4, 4, 10);
    Tensor lse;
    report_bw("softmax xent forward bf16 [2048x50304]",
              time_per_call([&] { kernels::softmax_cross_entropy_forward(z, targets, lse); }), 2.0 * rows * V);
    Tensor dz = Tensor::empty({rows, V}, bf, Device::kCUDA);
    report_bw("softmax xent backward bf16 [2048x50304]", time_per_call([&] {
                kernels::softmax_cross_entropy_backward(z, targets, lse, 1.0f, dz);
              }),
              4.0 * rows * V);
  }
  {  // attention: causal, 12 heads of 64
    const kernels::AttentionShape s{B, T, H, hs};
    const Tensor qkv = filled({N, 3 * C}, bf, -1, 1, 11);
    Tensor probs = Tensor::empty({B, H, T, T}, f32, Device::kCUDA), out = Tensor::empty({N, C}, bf, Device::kCUDA);
    const double fwd = 4.0 * B * H * T * T * hs;
    report_flops("attention forward bf16 B8 T1024 H12 hs64",
                 time_per_call([&] { kernels::attention_forward(qkv, s, {}, bf, probs, out); }), fwd, kTensorFlops,
                 "dense BF16 989 TFLOP/s");
    const Tensor dout = filled({N, C}, bf, -1, 1, 12);
    Tensor dqkv = Tensor::empty({N, 3 * C}, bf, Device::kCUDA);
    report_flops("attention backward bf16 (ds GEMMs in FP32)",
                 time_per_call([&] { kernels::attention_backward(qkv, probs, s, bf, dout, dqkv); }), 2.0 * fwd,
                 kTensorFlops, "dense BF16 989 TFLOP/s");
  }
  {  // the step's flat passes over 124M FP32 parameters
    Tensor g = filled({P}, f32, -1, 1, 13), p = filled({P}, f32, -1, 1, 14);
    Tensor m = Tensor::zeros({P}, f32, Device::kCUDA), v = Tensor::zeros({P}, f32, Device::kCUDA);
    report_bw("unscale_and_check fp32 [124M]", time_per_call([&] { kernels::unscale_and_check(g, 1.0f); }), 8.0 * P);
    int64_t step = 0;
    report_bw("adamw fp32 [124M]", time_per_call([&] {
                kernels::adamw_step(p, g, m, v, {1e-4f, 0.9, 0.999, 1e-8, 0.1f, ++step});
              }),
              28.0 * P);
  }
  return 0;
}

// nccl-tests' scheme: rank r's element i is (r + 1) * (i % 7 + 1), small integers whose sum over any number of
// ranks is exact in FP32, so the result is checked element by element against n (n + 1) / 2 * (i % 7 + 1).
int run_allreduce() {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  bind_node_device(MPI_COMM_WORLD, /*allow_sharing=*/false);
  NcclCommunicator comm(MPI_COMM_WORLD, 120.0);
  double best_alg = 0, best_bus = 0;
  int64_t best_bytes = 0;
  int wrong = 0;
  if (rank == 0) std::printf("%12s %10s %12s %12s %s\n", "bytes", "time us", "algbw GB/s", "busbw GB/s", "check");
  for (int64_t bytes = int64_t{1} << 20; bytes <= int64_t{1} << 30; bytes <<= 2) {
    const int64_t n = bytes / 4;
    std::vector<float> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>((rank + 1) * (i % 7 + 1));
    Tensor buf = Tensor::empty({n}, DType::kFloat32, Device::kCUDA);
    device::copy(buf.data(), Device::kCUDA, h.data(), Device::kCPU, bytes);
    comm.allreduce_async(buf.data(), n, DType::kFloat32, ReduceOp::kSum, "bench all-reduce")->wait();
    device::copy(h.data(), Device::kCPU, buf.data(), Device::kCUDA, bytes);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i)
      if (h[i] != static_cast<float>(world * (world + 1) / 2 * (i % 7 + 1))) ++bad;
    const double s = time_per_call(
        [&] { comm.allreduce_async(buf.data(), n, DType::kFloat32, ReduceOp::kSum, "bench all-reduce")->wait(); });
    double t[1] = {s};
    comm.allreduce_f64(t, ReduceOp::kMax, "bench time");  // the slowest rank's time, as nccl-tests
    int64_t b[1] = {bad};
    comm.allreduce_i64(b, ReduceOp::kSum, "bench check");
    const double alg = bytes / t[0] / 1e9, bus = alg * 2.0 * (world - 1) / world;
    if (rank == 0)
      std::printf("%12ld %10.1f %12.2f %12.2f %s\n", static_cast<long>(bytes), t[0] * 1e6, alg, bus,
                  b[0] ? "WRONG" : "ok");
    if (b[0]) wrong = 1;
    if (alg > best_alg) {
      best_alg = alg;
      best_bus = bus;
      best_bytes = bytes;
    }
  }
  if (rank == 0) {
    std::printf("allreduce max: %.2f GB/s algbw %.2f GB/s busbw at %ld bytes on %d ranks%s\n", best_alg, best_bus,
                static_cast<long>(best_bytes), world, world == 1 ? " (busbw is 0 by definition for one rank)" : "");
    if (wrong) std::printf("allreduce WRONG RESULT: some element differs from the exact sum\n");
  }
  return wrong;
}

}  // namespace
}  // namespace ampdist

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 2;
  const std::string what = argc > 1 ? argv[1] : "";
  try {
    if (ampdist::device::device_count() == 0) {
      std::fprintf(stderr, "ampdist_bench_gpu: no GPU: %s\n", ampdist::device::unavailable_reason().c_str());
      rc = 1;
    } else if (what == "kernels") {
      ampdist::device::set_device(0);
      rc = ampdist::run_kernels();
    } else if (what == "allreduce") {
      rc = ampdist::run_allreduce();
    } else {
      std::fprintf(stderr, "usage: ampdist_bench_gpu kernels | allreduce\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampdist_bench_gpu: error: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}

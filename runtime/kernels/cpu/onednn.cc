#include "runtime/kernels/cpu/onednn.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <sched.h>
#include <thread>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/kernels/cpu/isa.h"
#include "runtime/kernels/kernels.h"

// The two OpenMP calls oneDNN's threading needs, declared here rather than through <omp.h>, which clang (the fuzz
// build) does not ship without libomp-dev; libgomp implements them.
extern "C" {
void omp_set_num_threads(int);
int omp_get_max_threads(void);
}

namespace ampdist::kernels::cpu::onednn {
namespace {

using dnnl::memory;
using dt = memory::data_type;

dt to_dnnl(DType d) {
  switch (d) {
    case DType::kFloat32: return dt::f32;
    case DType::kFloat16: return dt::f16;
    case DType::kBFloat16: return dt::bf16;
  }
  return dt::undef;
}

dnnl::engine& engine() {
  static dnnl::engine e = [] {
    isa::apply_cap_to_onednn();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return e;
}

// What a primitive is created for. Pointers are not part of it: they are set on the cached memory objects at
// every call.
struct Key {
  int64_t batch, m, n, k;
  int64_t as[3], bs[3], cs[3];
  DType ab, c, bias;
  bool has_bias;
  uint32_t alpha_bits, beta_bits;
  bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    const auto* p = reinterpret_cast<const unsigned char*>(&k);
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the key's bytes (the key is zero-initialised, padding too)
    for (size_t i = 0; i < sizeof(Key); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Entry {
  dnnl::matmul prim;
  memory src, wei, dst, bias, scratch;
  std::unordered_map<int, memory> args;
  size_t scratch_bytes = 0;
  std::string impl;
};

memory::desc md(int64_t batch, int64_t rows, int64_t cols, DType d, const int64_t* stride) {
  if (batch == 1) return memory::desc({rows, cols}, to_dnnl(d), {stride[1], stride[2]});
  return memory::desc({batch, rows, cols}, to_dnnl(d), {stride[0], stride[1], stride[2]});
}

// Per thread: the primitive cache, the stream and the scratchpad.
struct ThreadState {
#if defined(AMPDIST_ENGINE_SINGLE_THREAD)
  ThreadState() { omp_set_num_threads(1); }
#endif
  std::unordered_map<Key, std::unique_ptr<Entry>, KeyHash> cache;
  dnnl::stream stream{engine()};
  std::vector<unsigned char> scratch;
};
ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

Entry& entry_for(const Matmul& mm, bool has_bias) {
  Key key;
  std::memset(&key, 0, sizeof(key));
  key.batch = mm.batch;
  key.m = mm.m;
  key.n = mm.n;
  key.k = mm.k;
  std::copy(mm.a_stride, mm.a_stride + 3, key.as);
  std::copy(mm.b_stride, mm.b_stride + 3, key.bs);
  std::copy(mm.c_stride, mm.c_stride + 3, key.cs);
  key.ab = mm.ab_dtype;
  key.c = mm.c_dtype;
  key.bias = has_bias ? mm.bias_dtype : DType::kFloat32;
  key.has_bias = has_bias;
  std::memcpy(&key.alpha_bits, &mm.alpha, 4);
  std::memcpy(&key.beta_bits, &mm.beta, 4);
  ThreadState& ts = state();
  auto it = ts.cache.find(key);
  if (it != ts.cache.end()) return *it->second;

  auto e = std::make_unique<Entry>();
  const memory::desc a = md(mm.batch, mm.m, mm.k, mm.ab_dtype, mm.a_stride);
  const memory::desc b = md(mm.batch, mm.k, mm.n, mm.ab_dtype, mm.b_stride);
  const memory::desc c = md(mm.batch, mm.m, mm.n, mm.c_dtype, mm.c_stride);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (mm.alpha != 1.0f) attr.set_output_scales(0, {mm.alpha});
  if (mm.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(mm.beta);
    attr.set_post_ops(po);
  }
  try {
    dnnl::matmul::primitive_desc pd;
    if (has_bias) {
      const memory::desc bias = mm.batch == 1 ? memory::desc({1, mm.n}, to_dnnl(mm.bias_dtype), {mm.n, 1})
                                              : memory::desc({1, 1, mm.n}, to_dnnl(mm.bias_dtype), {mm.n, mm.n, 1});
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias, c), attr, engine());
      e->bias = memory(bias, engine(), DNNL_MEMORY_NONE);
    } else {
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine());
    }
    e->prim = dnnl::matmul(pd);
    e->impl = pd.impl_info_str();
    e->scratch_bytes = pd.scratchpad_desc().get_size();
    e->src = memory(a, engine(), DNNL_MEMORY_NONE);
    e->wei = memory(b, engine(), DNNL_MEMORY_NONE);
    e->dst = memory(c, engine(), DNNL_MEMORY_NONE);
    e->scratch = memory(pd.scratchpad_desc(), engine(), DNNL_MEMORY_NONE);
  } catch (const dnnl::error& err) {
    throw Error(std::string("gemm: oneDNN has no matmul for ") + dtype_name(mm.ab_dtype) + " -> " +
                dtype_name(mm.c_dtype) + " [" + std::to_string(mm.batch) + " x " + std::to_string(mm.m) + " x " +
                std::to_string(mm.k) + " x " + std::to_string(mm.n) + "]: " + err.what());
  }
  e->args = {{DNNL_ARG_SRC, e->src}, {DNNL_ARG_WEIGHTS, e->wei}, {DNNL_ARG_DST, e->dst},
             {DNNL_ARG_SCRATCHPAD, e->scratch}};
  if (has_bias) e->args.emplace(DNNL_ARG_BIAS, e->bias);
  return *ts.cache.emplace(key, std::move(e)).first->second;
}

}  // namespace

void matmul(const Matmul& mm, const void* a, const void* b, void* c, const void* bias) {
  Entry& e = entry_for(mm, bias != nullptr);
  ThreadState& ts = state();
  if (ts.scratch.size() < e.scratch_bytes) ts.scratch.resize(e.scratch_bytes);
  e.src.set_data_handle(const_cast<void*>(a));
  e.wei.set_data_handle(const_cast<void*>(b));
  e.dst.set_data_handle(c);
  if (bias) e.bias.set_data_handle(const_cast<void*>(bias));
  e.scratch.set_data_handle(ts.scratch.data());
  e.prim.execute(ts.stream, e.args);
  ts.stream.wait();
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  isa::apply_cap_to_onednn();
  const dnnl_status_t st =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success)
    throw Error("gemm: dnnl_sgemm failed (status " + std::to_string(static_cast<int>(st)) + ") for [" +
                std::to_string(m) + " x " + std::to_string(k) + " x " + std::to_string(n) + "]");
}

namespace {
// The bf16 GEMM implementation oneDNN offers on this CPU (under the cap), or "" where it has none.
std::string bf16_matmul_impl() {
  Matmul mm;
  mm.m = mm.n = mm.k = 256;
  mm.a_stride[1] = mm.b_stride[1] = mm.c_stride[1] = 256;
  mm.ab_dtype = DType::kBFloat16;
  mm.c_dtype = DType::kBFloat16;
  try {
    return entry_for(mm, false).impl;
  } catch (const Error&) {
    return "";  // no bf16 matmul at all for this CPU: below avx512_core (AVX2 CPUs, valgrind's virtual CPU)
  }
}
bool onednn_has_native_bf16() {
  static const bool yes = [] {
    const std::string impl = bf16_matmul_impl();
    return impl.find("amx_bf16") != std::string::npos || impl.find("avx512_core_bf16") != std::string::npos;
  }();
  return yes;
}
std::atomic<bool> g_native_bf16_enabled{true};
}  // namespace

bool native_bf16() { return onednn_has_native_bf16() && g_native_bf16_enabled.load(std::memory_order_relaxed); }
void set_native_bf16_enabled(bool enabled) { g_native_bf16_enabled.store(enabled, std::memory_order_relaxed); }

DType engine_dtype(DType operands) {
  return operands == DType::kBFloat16 && native_bf16() ? DType::kBFloat16 : DType::kFloat32;
}

std::string implementation(DType ab_dtype, DType c_dtype) {
  if (ab_dtype == DType::kFloat32) return "dnnl_sgemm (jit)";
  if (engine_dtype(ab_dtype) == DType::kFloat32)
    return std::string("dnnl_sgemm (jit) after an exact conversion of ") + dtype_name(ab_dtype) + " to f32";
  Matmul mm;
  mm.m = mm.n = mm.k = 256;
  mm.a_stride[1] = mm.b_stride[1] = mm.c_stride[1] = 256;
  mm.ab_dtype = ab_dtype;
  mm.c_dtype = c_dtype;
  return entry_for(mm, false).impl;
}

std::string version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

}  // namespace ampdist::kernels::cpu::onednn

namespace ampdist::kernels {
namespace {
thread_local const ExecContext* g_current = nullptr;  // the innermost ExecScope's context on this thread
}  // namespace

const ExecContext& current_exec_context() {
  static const ExecContext kDefaults{};
  return g_current ? *g_current : kDefaults;
}

// oneDNN's threads are OpenMP's (Debian builds libdnnl with DNNL_CPU_RUNTIME=OMP, libgomp): the calling thread's
// team size (an OpenMP per-thread setting) is what every primitive and parallel loop it runs uses.
ExecScope::ExecScope(const ExecContext& ctx) : outer_(g_current), outer_threads_(omp_get_max_threads()) {
  g_current = &ctx;
#if defined(AMPDIST_ENGINE_SINGLE_THREAD)
  omp_set_num_threads(1);
#else
  if (ctx.threads > 0) omp_set_num_threads(ctx.threads);
#endif
}

ExecScope::~ExecScope() {
  g_current = outer_;
#if defined(AMPDIST_ENGINE_SINGLE_THREAD)
  omp_set_num_threads(1);  // one thread everywhere in this build, also after a scope opened before ThreadState's
#else
  omp_set_num_threads(outer_threads_);
#endif
}

int num_threads() { return omp_get_max_threads(); }
int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}
}  // namespace ampdist::kernels

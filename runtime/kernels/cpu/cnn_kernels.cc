// CPU implementations of kernels/cnn.h: convolutions through oneDNN's convolution primitives (plain NCHW / OIHW
// memory at the interface, reordered into the layouts oneDNN chooses for its kernels), BatchNorm and pooling
// as loops over channels split across the compute threads (cpu/parallel.h: each output element is computed by the
// same operations for any thread count, so results are bitwise reproducible).
#include <immintrin.h>
#include <initializer_list>
#include <string>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>
#include <unordered_map>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/kernels/backends.h"
#include "runtime/kernels/cnn_checks.h"
#include "runtime/kernels/cpu/convert.h"
#include "runtime/kernels/cpu/isa.h"
#include "runtime/kernels/cpu/onednn.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/cpu/parallel.h"
#include "runtime/kernels/math.h"

namespace ampdist::kernels::cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e = [] {
    isa::apply_cap_to_onednn();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return e;
}

// All int64: no padding bytes, so that memcmp and the hash see only the fields (also in the map's copies).
struct ConvKey {
  ConvShape s;
  int64_t kind;   // 0 forward, 1 backward data, 2 backward weights
  int64_t bias;
  int64_t dtype;  // the DType the primitive multiplies: FP32 or BF16
  int64_t out;    // the DType it writes (dst, diff_src): FP32, or BF16 with a BF16 dtype; diff_weights are FP32
  bool operator==(const ConvKey& o) const { return std::memcmp(this, &o, sizeof(ConvKey)) == 0; }
};
struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    const auto* p = reinterpret_cast<const unsigned char*>(&k);
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the zero-initialised key
    for (size_t i = 0; i < sizeof(ConvKey); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// One operand of a primitive: the caller's plain NCHW / OIHW memory and, when the primitive chose another layout
// (format_tag::any: oneDNN's blocked nChw16c / OIhw16i16o... layouts, where its direct-convolution kernels run), a
// reorder between the two through a per-thread staging buffer.
struct Operand {
  memory user, inner;
  dnnl::reorder move;  // user -> inner for an input, inner -> user for an output; empty when the layouts agree
  int role = 0;        // which staging buffer holds `inner`
  bool reordered() const { return static_cast<bool>(move); }
};

struct ConvEntry {
  dnnl::primitive prim;
  // forward: src, wei, dst, bias; bwd data: diff_dst, wei, diff_src; bwd weights: src, diff_dst, diff_wei, diff_bias
  Operand a, b, c;
  memory d;
  memory scratch;
  std::vector<unsigned char> scratch_buf;
  std::string impl;
};

struct ConvDescs {
  memory::desc src, wei, dst, bias;
  memory::dims strides, dilates, pad_l, pad_r;
};
// The caller's layouts: plain NCHW activations and OIHW (or GOIHW) weights. Inputs in `in`, outputs in FP32.
struct Plain {
  memory::dims src, wei, dst;
  tag wei_tag;
};
Plain plain(const ConvShape& s) {
  Plain p;
  p.src = {s.n, s.c, s.h, s.w};
  p.dst = {s.n, s.k, s.out_h(), s.out_w()};
  p.wei = s.groups == 1 ? memory::dims{s.k, s.c, s.kh, s.kw}
                        : memory::dims{s.groups, s.k / s.groups, s.c / s.groups, s.kh, s.kw};
  p.wei_tag = s.groups == 1 ? tag::oihw : tag::goihw;
  return p;
}
// The primitive's descriptors: layouts left to oneDNN (any); src, weights (and diff_dst) in `in`; dst and diff_src
// in `out` (FP32, or BF16: oneDNN rounds its FP32 accumulator once, bias added before), diff_weights FP32; bias FP32.
ConvDescs descs(const ConvShape& s, dt in, dt out, int kind) {
  const Plain p = plain(s);
  ConvDescs d;
  d.src = memory::desc(p.src, kind == 1 ? out : in, tag::any);
  d.dst = memory::desc(p.dst, kind == 0 ? out : in, tag::any);
  d.wei = memory::desc(p.wei, kind == 2 ? dt::f32 : in, tag::any);
  d.bias = memory::desc({s.k}, dt::f32, tag::x);
  d.strides = {s.stride, s.stride};
  d.dilates = {s.dilation - 1, s.dilation - 1};  // oneDNN counts the gaps: 0 = a dense kernel
  d.pad_l = {s.pad, s.pad};
  // oneDNN wants the right padding that makes its size formula exact for this output size (floor mode).
  d.pad_r = {(s.out_h() - 1) * s.stride + (s.kh - 1) * s.dilation + 1 - s.h - s.pad,
             (s.out_w() - 1) * s.stride + (s.kw - 1) * s.dilation + 1 - s.w - s.pad};
  return d;
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvShape& s, dt in, dt out, bool bias,
                                                     const dnnl::primitive_attr& attr) {
  const ConvDescs d = descs(s, in, out, 0);
  dnnl::convolution_forward::desc fd =
      bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                             d.src, d.wei, d.bias, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
           : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                             d.src, d.wei, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r);
  return dnnl::convolution_forward::primitive_desc(fd, attr, engine());
}

// 64-byte aligned, grown to the largest need, never shrunk.
struct Staging {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> p;
  size_t bytes = 0;
  void* get(size_t n) {
    if (n > bytes) {
      const size_t rounded = (n + 63) / 64 * 64;
      p.reset(std::aligned_alloc(64, rounded));
      if (!p) throw Error("conv2d: cannot allocate " + std::to_string(rounded) + " bytes of staging memory");
      bytes = rounded;
    }
    return p.get();
  }
};

struct ConvState {
#if defined(AMPDIST_ENGINE_SINGLE_THREAD)
  // As for the matmuls (cpu/onednn.cc): TSan cannot see libgomp's barriers, so oneDNN runs on the calling thread.
  ConvState() { omp_set_num_threads(1); }
#endif
  std::unordered_map<ConvKey, std::unique_ptr<ConvEntry>, ConvKeyHash> cache;
  dnnl::stream stream{engine()};
  Staging staging[3];      // one per operand role (a, b, c) of the primitive running
  Staging widened[3];      // 16-bit operands widened to FP32 when the primitive multiplies FP32
};
ConvState& conv_state() {
  thread_local ConvState s;
  return s;
}

Operand operand(const memory::desc& chosen, const memory::dims& dims, dt type, tag t, bool input, int role) {
  Operand o;
  const memory::desc user_md(dims, type, t);
  o.user = memory(user_md, engine(), DNNL_MEMORY_NONE);
  o.role = role;
  if (chosen == user_md) {
    o.inner = o.user;
    return o;
  }
  o.inner = memory(chosen, engine(), DNNL_MEMORY_NONE);
  o.move = input ? dnnl::reorder(o.user, o.inner) : dnnl::reorder(o.inner, o.user);
  return o;
}

ConvEntry& conv_entry(const ConvShape& s, int kind, bool bias, DType dtype, DType out_dtype) {
  ConvKey key;  // every field is an int64 (no padding), all set below
  key.s = s;
  key.kind = kind;
  key.bias = bias;
  key.dtype = static_cast<int64_t>(dtype);
  key.out = static_cast<int64_t>(out_dtype);
  ConvState& st = conv_state();
  auto it = st.cache.find(key);
  if (it != st.cache.end()) return *it->second;
  s.validate();
  const dt in = dtype == DType::kBFloat16 ? dt::bf16 : dt::f32;
  const dt out = out_dtype == DType::kBFloat16 ? dt::bf16 : dt::f32;
  const Plain p = plain(s);
  auto e = std::make_unique<ConvEntry>();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const ConvDescs d = descs(s, in, out, kind);
  memory::desc scratch_md;
  try {
    if (kind == 0) {
      auto pd = forward_pd(s, in, out, bias, attr);
      e->prim = dnnl::convolution_forward(pd);
      e->impl = pd.impl_info_str();
      scratch_md = pd.scratchpad_desc();
      e->a = operand(pd.src_desc(), p.src, in, tag::nchw, true, 0);
      e->b = operand(pd.weights_desc(), p.wei, in, p.wei_tag, true, 1);
      e->c = operand(pd.dst_desc(), p.dst, out, tag::nchw, false, 2);
      e->d = memory(d.bias, engine(), DNNL_MEMORY_NONE);
    } else if (kind == 1) {
      const auto hint = forward_pd(s, in, in, false, dnnl::primitive_attr());
      dnnl::convolution_backward_data::desc bd(dnnl::algorithm::convolution_direct, d.src, d.wei, d.dst, d.strides,
                                               d.dilates, d.pad_l, d.pad_r);
      dnnl::convolution_backward_data::primitive_desc pd(bd, attr, engine(), hint);
      e->prim = dnnl::convolution_backward_data(pd);
      e->impl = pd.impl_info_str();
      scratch_md = pd.scratchpad_desc();
      e->a = operand(pd.diff_dst_desc(), p.dst, in, tag::nchw, true, 0);
      e->b = operand(pd.weights_desc(), p.wei, in, p.wei_tag, true, 1);
      e->c = operand(pd.diff_src_desc(), p.src, out, tag::nchw, false, 2);
    } else {
      const auto hint = forward_pd(s, in, in, bias, dnnl::primitive_attr());
      dnnl::convolution_backward_weights::desc wd =
          bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src, d.wei, d.bias,
                                                          d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
               : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src, d.wei, d.dst,
                                                          d.strides, d.dilates, d.pad_l, d.pad_r);
      dnnl::convolution_backward_weights::primitive_desc pd(wd, attr, engine(), hint);
      e->prim = dnnl::convolution_backward_weights(pd);
      e->impl = pd.impl_info_str();
      scratch_md = pd.scratchpad_desc();
      e->a = operand(pd.src_desc(), p.src, in, tag::nchw, true, 0);
      e->b = operand(pd.diff_dst_desc(), p.dst, in, tag::nchw, true, 1);
      e->c = operand(pd.diff_weights_desc(), p.wei, dt::f32, p.wei_tag, false, 2);
      e->d = memory(d.bias, engine(), DNNL_MEMORY_NONE);
    }
  } catch (const dnnl::error& err) {
    throw Error(std::string("conv2d: oneDNN has no ") +
                (kind == 0 ? "forward" : kind == 1 ? "backward-data" : "backward-weights") + " " +
                (in == dt::bf16 ? "bf16" : "f32") + " convolution for this shape: " + err.what());
  }
  e->scratch_buf.resize(scratch_md.get_size());
  e->scratch = memory(scratch_md, engine(), e->scratch_buf.empty() ? nullptr : e->scratch_buf.data());
  return *st.cache.emplace(key, std::move(e)).first->second;
}

// The dtype the convolution multiplies in for 16-bit operands of `d`: BF16 natively where oneDNN has bf16 kernels
// for this CPU (AVX512-BF16 or AMX), else FP32 after an exact widening (fp16 always: oneDNN 2.6 has no fp16
// convolution on the CPU).
DType compute_dtype(DType d) { return onednn::engine_dtype(d); }

// The pointer a primitive reads for input `t`: the tensor itself, or its exact FP32 widening in `buf`.
const void* input_data(const Tensor& t, DType compute, Staging& buf) {
  if (t.dtype() == compute) return t.data();
  float* w = static_cast<float*>(buf.get(static_cast<size_t>(t.numel()) * sizeof(float)));
  Tensor view = Tensor::view(w, t.shape(), DType::kFloat32, Device::kCPU);
  cast(t, view);
  return w;
}

// Where the primitive writes output `t`: t itself when it writes t's dtype, else an FP32 staging buffer that
// round_output then rounds into t (once, round to nearest even: kernels::cast).
void* output_data(Tensor& t, DType written, Staging& buf) {
  if (t.dtype() == written) return t.data();
  return buf.get(static_cast<size_t>(t.numel()) * sizeof(float));
}
void round_output(Tensor& t, DType written, Staging& buf) {
  if (t.dtype() == written) return;
  const Tensor f32 = Tensor::view(buf.get(0), t.shape(), DType::kFloat32, Device::kCPU);
  cast(f32, t);
}

// Runs e's primitive on the caller's buffers: reorders into the chosen layouts, the primitive, the reorder out.
void run(ConvEntry& e, const void* a, const void* b, void* c, std::unordered_map<int, memory> args, int arg_a,
         int arg_b, int arg_c) {
  ConvState& st = conv_state();
  Operand* ops[3] = {&e.a, &e.b, &e.c};
  void* user[3] = {const_cast<void*>(a), const_cast<void*>(b), c};
  for (int i = 0; i < 3; ++i) {
    Operand& o = *ops[i];
    o.user.set_data_handle(user[i]);
    if (o.reordered()) o.inner.set_data_handle(st.staging[o.role].get(o.inner.get_desc().get_size()));
  }
  for (int i = 0; i < 2; ++i)
    if (ops[i]->reordered()) ops[i]->move.execute(st.stream, ops[i]->user, ops[i]->inner);
  args[arg_a] = e.a.inner;
  args[arg_b] = e.b.inner;
  args[arg_c] = e.c.inner;
  args[DNNL_ARG_SCRATCHPAD] = e.scratch;
  e.prim.execute(st.stream, args);
  if (e.c.reordered()) e.c.move.execute(st.stream, e.c.inner, e.c.user);
  st.stream.wait();
}

}  // namespace

void conv2d_forward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  checks::conv2d_forward(s, x, w, bias, y, Device::kCPU);
  if (s.n == 0) return;
  const DType cd = compute_dtype(x.dtype());
  const DType od = y.dtype() == cd ? cd : DType::kFloat32;
  ConvEntry& e = conv_entry(s, 0, bias != nullptr, cd, od);
  ConvState& st = conv_state();
  std::unordered_map<int, memory> args;
  if (bias) {
    e.d.set_data_handle(const_cast<void*>(bias->data()));
    args.emplace(DNNL_ARG_BIAS, e.d);
  }
  run(e, input_data(x, cd, st.widened[0]), input_data(w, cd, st.widened[1]), output_data(y, od, st.widened[2]),
      std::move(args), DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST);
  round_output(y, od, st.widened[2]);
}

void conv2d_backward_data(const ConvShape& s, const Tensor& dy, const Tensor& w, Tensor& dx) {
  checks::conv2d_backward_data(s, dy, w, dx, Device::kCPU);
  if (s.n == 0) return;
  const DType cd = compute_dtype(dy.dtype());
  const DType od = dx.dtype() == cd ? cd : DType::kFloat32;
  ConvEntry& e = conv_entry(s, 1, false, cd, od);
  ConvState& st = conv_state();
  run(e, input_data(dy, cd, st.widened[0]), input_data(w, cd, st.widened[1]), output_data(dx, od, st.widened[2]),
      {}, DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC);
  round_output(dx, od, st.widened[2]);
}

void conv2d_backward_weights(const ConvShape& s, const Tensor& x, const Tensor& dy, Tensor& dw, Tensor* dbias,
                             bool accumulate) {
  checks::conv2d_backward_weights(s, x, dy, dw, dbias, Device::kCPU);
  if (s.n == 0) {
    if (!accumulate) {
      std::memset(dw.data(), 0, dw.nbytes());
      if (dbias) std::memset(dbias->data(), 0, dbias->nbytes());
    }
    return;
  }
  const DType cd = compute_dtype(x.dtype());
  ConvEntry& e = conv_entry(s, 2, dbias != nullptr, cd, DType::kFloat32);
  ConvState& st = conv_state();
  // oneDNN writes the gradient; a later micro-batch's is computed aside and added in FP32.
  thread_local std::vector<float> tmp_w, tmp_b;
  float* wout = dw.data_as<float>();
  float* bout = dbias ? dbias->data_as<float>() : nullptr;
  if (accumulate) {
    tmp_w.resize(static_cast<size_t>(dw.numel()));
    wout = tmp_w.data();
    if (dbias) {
      tmp_b.resize(static_cast<size_t>(dbias->numel()));
      bout = tmp_b.data();
    }
  }
  std::unordered_map<int, memory> args;
  if (dbias) {
    e.d.set_data_handle(bout);
    args.emplace(DNNL_ARG_DIFF_BIAS, e.d);
  }
  run(e, input_data(x, cd, st.widened[0]), input_data(dy, cd, st.widened[1]), wout, std::move(args), DNNL_ARG_SRC,
      DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS);
  if (accumulate) {
    float* g = dw.data_as<float>();
    for (int64_t i = 0; i < dw.numel(); ++i) g[i] += tmp_w[static_cast<size_t>(i)];
    if (dbias) {
      float* gb = dbias->data_as<float>();
      for (int64_t i = 0; i < dbias->numel(); ++i) gb[i] += tmp_b[static_cast<size_t>(i)];
    }
  }
}

}  // namespace ampdist::kernels::cpu

namespace ampdist::kernels {
std::string conv2d_implementation(const ConvShape& s, DType dtype) {
  const DType cd = cpu::compute_dtype(dtype);
  return cpu::conv_entry(s, 0, false, cd, cd).impl;
}
}  // namespace ampdist::kernels

namespace ampdist::kernels::cpu {

// ---- BatchNorm ------------------------------------------------------------------------------------------------

namespace {
// x: FP32, or the 16-bit working dtype it came in (read as FP32: every 16-bit value is an FP32 value).
using checks::Nchw;
constexpr Device kCpu = Device::kCPU;
template <typename T>
inline double as_double(T v) {
  return static_cast<double>(static_cast<float>(v));
}
// Sums over one channel's planes in double with kLanes independent partial sums (element i goes to lane i mod
// kLanes, the lanes added in order at the end): a fixed order for any thread count, and no serial chain of double
// additions (one add's latency per element) on the critical path.
constexpr int kLanes = 8;
// prepare(off) is called before each plane (its first element's offset); term(i, a, b) then adds element i of
// that plane.
template <typename P, typename F>
void channel_sums(const Nchw& d, int64_t c, P&& prepare, F&& term, double& out_a, double& out_b) {
  double a[kLanes] = {}, b[kLanes] = {};
  for (int64_t n = 0; n < d.n; ++n) {
    prepare((n * d.c + c) * d.hw);
    int64_t i = 0;
    for (; i + kLanes <= d.hw; i += kLanes)
      for (int l = 0; l < kLanes; ++l) term(i + l, a[l], b[l]);
    for (int l = 0; i < d.hw; ++i, ++l) term(i, a[l], b[l]);
  }
  out_a = out_b = 0.0;
  for (int l = 0; l < kLanes; ++l) {
    out_a += a[l];
    out_b += b[l];
  }
}
// Calls f(px, pd) with x's and dy's data as their C++ element types (each FP32 or 16-bit).
template <typename F>
void with_x_and_dy(const Tensor& x, const Tensor& dy, F&& f) {
  dispatch_dtype(x.dtype(), [&](auto tag_x) {
    dispatch_dtype(dy.dtype(), [&](auto tag_dy) {
      f(x.data_as<decltype(tag_x)>(), dy.data_as<decltype(tag_dy)>());
    });
  });
}
// Calls f(px, po) with x's data and out's (writable) data as their C++ element types.
template <typename F>
void with_in_and_out(const Tensor& x, Tensor& out, F&& f) {
  dispatch_dtype(out.dtype(), [&](auto tag_out) {
    auto* po = out.data_as<decltype(tag_out)>();
    dispatch_dtype(x.dtype(), [&](auto tag_x) { f(x.data_as<decltype(tag_x)>(), po); });
  });
}
// The gradient reaching a BatchNorm through the ReLU fused after it: dy where the forward output y > 0, else +0
// (math::relu_backward), as dy's bits ANDed with a mask that is all ones where y > 0. A select would compile to a
// branch on y's sign, which is random from element to element (measured: the masked sums ran ~10x slower than
// the plain ones). NoRelu: dy as it is.
struct NoRelu {};
template <typename D, typename M>
inline double masked_dy(const D* pd, const M* pm, int64_t i) {
  if constexpr (std::is_same_v<M, NoRelu>) {
    return as_double(pd[i]);
  } else {
    const uint32_t keep = 0u - static_cast<uint32_t>(static_cast<float>(pm[i]) > 0.0f);
    const uint32_t g = std::bit_cast<uint32_t>(static_cast<float>(pd[i]));
    return static_cast<double>(std::bit_cast<float>(g & keep));
  }
}
// Calls f(px, pd, pm) as with_x_and_dy, pm being relu_y's data, or a null `const NoRelu*` without one.
template <typename F>
void with_x_dy_relu(const Tensor& x, const Tensor& dy, const Tensor* relu_y, F&& f) {
  with_x_and_dy(x, dy, [&](const auto* px, const auto* pd) {
    if (!relu_y) return f(px, pd, static_cast<const NoRelu*>(nullptr));
    dispatch_dtype(relu_y->dtype(), [&](auto tag_m) { f(px, pd, relu_y->data_as<decltype(tag_m)>()); });
  });
}
// Writes one row of FP32 results `v[0, n)` into the 16-bit q, by Eigen's vectorised conversion (round to nearest
// even), the one kernels::cast uses. FP32 outputs are written in place and never pass through here.
template <typename Y>
inline void store_row(const float* v, Y* q, int64_t n) {
  Eigen::Map<Eigen::Array<Y, Eigen::Dynamic, 1>>(q, n) =
      Eigen::Map<const Eigen::Array<float, Eigen::Dynamic, 1>>(v, n).template cast<Y>();
}
// Per-thread FP32 rows of at least n values (grow only): slot 0 to 3.
float* row_buffer(int64_t n, int slot = 0) {
  thread_local std::vector<float> rows[4];
  std::vector<float>& row = rows[slot];
  if (static_cast<int64_t>(row.size()) < n) row.resize(static_cast<size_t>(n));
  return row.data();
}
// The n values at p + off as FP32: p + off itself for FP32 data, else converted exactly into row buffer `slot`
// (convert.h's widen_block). NoRelu (no tensor) stays a null NoRelu pointer.
template <typename T>
inline auto plane_f32(const T* p, int64_t off, int64_t n, int slot) {
  if constexpr (std::is_same_v<T, NoRelu>) {
    return static_cast<const NoRelu*>(nullptr);
  } else if constexpr (std::is_same_v<T, float>) {
    return p + off;
  } else {
    float* v = row_buffer(n, slot);
    cpu::widen_block(p + off, v, n);
    return static_cast<const float*>(v);
  }
}
}  // namespace

void batchnorm_sums(const Tensor& x, std::span<double> sums) {
  const Nchw d = checks::batchnorm("batchnorm", x, {}, {}, std::ssize(sums), kCpu);
  dispatch_dtype(x.dtype(), [&](auto tag_x) {
    using T = decltype(tag_x);
    const T* px = x.data_as<T>();
    cpu::parallel_ranges(d.c, 1, [&](int64_t c0, int64_t c1) {
      const float* v = nullptr;
      for (int64_t c = c0; c < c1; ++c)
        channel_sums(
            d, c, [&](int64_t off) { v = plane_f32(px, off, d.hw, 0); },
            [&](int64_t i, double& s, double& q) {
              const double e = v[i];
              s += e;
              q += e * e;
            },
            sums[static_cast<size_t>(c)], sums[static_cast<size_t>(d.c + c)]);
    });
  });
}

void batchnorm_apply(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                     const Tensor& beta, Tensor& y, bool relu) {
  const Nchw d = checks::batchnorm("batchnorm", x, {&y}, {&mean, &invstd, &gamma, &beta}, -1, kCpu);
  const float *pm = mean.data_as<float>(), *pi = invstd.data_as<float>(), *pg = gamma.data_as<float>(),
              *pb = beta.data_as<float>();
  with_in_and_out(x, y, [&](const auto* px, auto* py) {
    using Y = std::remove_pointer_t<decltype(py)>;
    cpu::parallel_ranges(d.n * d.c, 1, [&](int64_t r0, int64_t r1) {
      float* v = std::is_same_v<Y, float> ? nullptr : row_buffer(d.hw, 3);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t c = r % d.c;
        const float scale = math::batchnorm_scale(pi[c], pg[c]), m = pm[c], b = pb[c];
        const float* p = plane_f32(px, r * d.hw, d.hw, 1);
        float* q = std::is_same_v<Y, float> ? reinterpret_cast<float*>(py + r * d.hw) : v;
        if (relu)
          for (int64_t i = 0; i < d.hw; ++i) q[i] = math::relu(math::batchnorm(static_cast<float>(p[i]), m, scale, b));
        else
          for (int64_t i = 0; i < d.hw; ++i) q[i] = math::batchnorm(static_cast<float>(p[i]), m, scale, b);
        if constexpr (!std::is_same_v<Y, float>) store_row(v, py + r * d.hw, d.hw);
      }
    });
  });
}

void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                             std::span<double> sums, const Tensor* relu_y) {
  const Nchw d = checks::batchnorm("batchnorm backward", x, {&dy, relu_y}, {&mean, &invstd}, std::ssize(sums), kCpu);
  const float *pm = mean.data_as<float>(), *pi = invstd.data_as<float>();
  with_x_dy_relu(x, dy, relu_y, [&](const auto* px, const auto* pd, const auto* pr) {
    cpu::parallel_ranges(d.c, 1, [&](int64_t c0, int64_t c1) {
      const float *vx = nullptr, *vd = nullptr;
      decltype(plane_f32(pr, 0, 0, 2)) vr = nullptr;
      for (int64_t c = c0; c < c1; ++c) {
        const double m = pm[c], is = pi[c];
        channel_sums(
            d, c,
            [&](int64_t off) {
              vx = plane_f32(px, off, d.hw, 0);
              vd = plane_f32(pd, off, d.hw, 1);
              vr = plane_f32(pr, off, d.hw, 2);
            },
            [&](int64_t i, double& s, double& sx) {
              const double g = masked_dy(vd, vr, i);
              s += g;
              sx += g * (static_cast<double>(vx[i]) - m) * is;
            },
            sums[static_cast<size_t>(c)], sums[static_cast<size_t>(d.c + c)]);
      }
    });
  });
}

void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                           const Tensor& gamma, std::span<const double> sums, double count, Tensor& dx,
                           const Tensor* relu_y) {
  const Nchw d = checks::batchnorm("batchnorm backward", x, {&dy, &dx, relu_y}, {&mean, &invstd, &gamma},
                                   std::ssize(sums), kCpu);
  const float *pm = mean.data_as<float>(), *pi = invstd.data_as<float>(), *pg = gamma.data_as<float>();
  dispatch_dtype(dx.dtype(), [&](auto tag_dx) {
    using Y = decltype(tag_dx);
    Y* out = dx.data_as<Y>();
    with_x_dy_relu(x, dy, relu_y, [&](const auto* px, const auto* pd, const auto* pr) {
      cpu::parallel_ranges(d.n * d.c, 1, [&](int64_t r0, int64_t r1) {
        float* v = std::is_same_v<Y, float> ? nullptr : row_buffer(d.hw, 3);
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t c = r % d.c;
          const double is = pi[c], k = pg[c] * is, m = pm[c];
          const double mean_dy = count > 0 ? sums[static_cast<size_t>(c)] / count : 0.0;
          const double mean_dyx = count > 0 ? sums[static_cast<size_t>(d.c + c)] / count : 0.0;
          const int64_t off = r * d.hw;
          const float* p = plane_f32(px, off, d.hw, 0);
          const float* g = plane_f32(pd, off, d.hw, 1);
          const auto* mask = plane_f32(pr, off, d.hw, 2);
          float* q = std::is_same_v<Y, float> ? reinterpret_cast<float*>(out + off) : v;
          for (int64_t i = 0; i < d.hw; ++i)
            q[i] = static_cast<float>(math::batchnorm_backward(masked_dy(g, mask, i), static_cast<double>(p[i]), m,
                                                               is, k, mean_dy, mean_dyx));
          if constexpr (!std::is_same_v<Y, float>) store_row(v, out + off, d.hw);
        }
      });
    });
  });
}

using checks::channels_of;

void batchnorm_sums_to(const Tensor& x, double* sums) {
  batchnorm_sums(x, std::span<double>(sums, static_cast<size_t>(2 * channels_of(x))));
}
void batchnorm_backward_sums_to(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                                double* sums, const Tensor* relu_y) {
  batchnorm_backward_sums(x, dy, mean, invstd, std::span<double>(sums, static_cast<size_t>(2 * channels_of(x))),
                          relu_y);
}
void batchnorm_backward_dx_from(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                                const Tensor& gamma, const double* sums, double count, Tensor& dx,
                                const Tensor* relu_y) {
  batchnorm_backward_dx(x, dy, mean, invstd, gamma,
                        std::span<const double>(sums, static_cast<size_t>(2 * channels_of(x))), count, dx, relu_y);
}

void batchnorm_statistics(const double* sums, double count, float eps, float momentum, Tensor& mean, Tensor& var,
                          Tensor& invstd, Tensor& running_mean, Tensor& running_var, Tensor& tracked) {
  const int64_t c = mean.numel();
  checks::batchnorm_channels("batchnorm_statistics", c, {&mean, &var, &invstd, &running_mean, &running_var}, kCpu);
  checks::batchnorm_channels("batchnorm_statistics", 1, {&tracked}, kCpu);
  for (int64_t i = 0; i < c; ++i)
    math::batchnorm_channel_statistics(i, c, sums, count, eps, momentum, mean.data_as<float>(), var.data_as<float>(),
                                       invstd.data_as<float>(), running_mean.data_as<float>(),
                                       running_var.data_as<float>());
  tracked.data_as<float>()[0] += 1.0f;
}

void batchnorm_running_statistics(const Tensor& running_mean, const Tensor& running_var, float eps, Tensor& mean,
                                  Tensor& var, Tensor& invstd) {
  const int64_t c = mean.numel();
  checks::batchnorm_channels("batchnorm_running_statistics", c, {&running_mean, &running_var, &mean, &var, &invstd}, kCpu);
  const float *rm = running_mean.data_as<float>(), *rv = running_var.data_as<float>();
  float *m = mean.data_as<float>(), *v = var.data_as<float>(), *is = invstd.data_as<float>();
  for (int64_t i = 0; i < c; ++i) {
    m[i] = rm[i];
    v[i] = rv[i];
    is[i] = math::batchnorm_invstd(static_cast<double>(rv[i]), eps);
  }
}

void batchnorm_param_grads(const double* sums, Tensor& dgamma, Tensor& dbeta, bool accumulate) {
  const int64_t c = dgamma.numel();
  checks::batchnorm_channels("batchnorm_param_grads", c, {&dgamma, &dbeta}, kCpu);
  float *g = dgamma.data_as<float>(), *b = dbeta.data_as<float>();
  for (int64_t i = 0; i < c; ++i) {
    const float dg = static_cast<float>(sums[c + i]), db = static_cast<float>(sums[i]);
    g[i] = accumulate ? g[i] + dg : dg;
    b[i] = accumulate ? b[i] + db : db;
  }
}

void residual_add(const Tensor& a, const Tensor& b, Tensor& y, bool relu) {
  checks::residual_add(a, b, y, kCpu);
  float* py = y.data_as<float>();
  with_x_and_dy(a, b, [&](const auto* pa, const auto* pb) {
    cpu::parallel_ranges(y.numel(), int64_t{1} << 14, [&](int64_t i0, int64_t i1) {
      if (relu)
        for (int64_t i = i0; i < i1; ++i) py[i] = math::relu(static_cast<float>(pa[i]) + static_cast<float>(pb[i]));
      else
        for (int64_t i = i0; i < i1; ++i) py[i] = static_cast<float>(pa[i]) + static_cast<float>(pb[i]);
    });
  });
}

// ---- pooling ----------------------------------------------------------------------------------------------------

namespace {

// One output row of a max-pool window scan: the input plane p, the window's rows [h0, h1) inside the image, and
// where the row's outputs and argmax start (row: the index of its output 0).
struct PoolRow {
  const float* p;
  int64_t h0, h1, row;
  float* py;
  int32_t* argmax;
};

#ifdef __AVX2__
// ResNet's max-pool (3x3, stride 2) in AVX2 registers, eight outputs at a time from j while they lie before j_hi;
// returns the first output not done. The columns 2j - pad + b of the eight windows are the even / odd elements of
// two 8-float loads (b = 0, 1) and of two loads one pair further on (b = 2). Each window is scanned in the scalar
// loops' order (row-major), with their rule (take v when !(v <= best) and best is not NaN), so values and argmax are
// theirs bit for bit. The loads reach column 2j - pad + 17, hence the bound.
int64_t max_row_3x3s2_avx2(const PoolShape& s, const PoolRow& r, int64_t j, int64_t j_hi) {
  const float* p = r.p;
  const auto evens = [](const float* q) {  // q[0], q[2], ..., q[14]
    const __m256 a = _mm256_loadu_ps(q), b = _mm256_loadu_ps(q + 8);
    return _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
  };
  const auto odds = [](const float* q) {  // q[1], q[3], ..., q[15]
    const __m256 a = _mm256_loadu_ps(q), b = _mm256_loadu_ps(q + 8);
    return _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
  };
  const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  for (; j + 8 <= j_hi && 2 * j - s.pad + 18 <= s.w; j += 8) {
    const int64_t base = 2 * j - s.pad;
    __m256 best = _mm256_setzero_ps();
    __m256i at = _mm256_setzero_si256();
    for (int64_t hi = r.h0; hi < r.h1; ++hi) {
      const float* q = p + hi * s.w + base;
      const __m256 v[3] = {evens(q), odds(q), evens(q + 2)};
      for (int b = 0; b < 3; ++b) {
        const __m256i idx =
            _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(hi * s.w + base + b)), lane2);
        if (hi == r.h0 && b == 0) {
          best = v[0];
          at = idx;
          continue;
        }
        const __m256 take = _mm256_and_ps(_mm256_cmp_ps(v[b], best, _CMP_NLE_UQ),
                                          _mm256_cmp_ps(best, best, _CMP_EQ_OQ));
        best = _mm256_blendv_ps(best, v[b], take);
        at = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(idx), take));
      }
    }
    _mm256_storeu_ps(r.py + r.row + j, best);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(r.argmax + r.row + j), at);
  }
  return j;
}
#endif

// Eight outputs at a time from j while they lie before j_hi (returns the first not done), each window scanned in the
// same (row-major) order as max_one: eight independent compare-select chains instead of one serial chain per window.
int64_t max_row_blocks(const PoolShape& s, const PoolRow& r, int64_t j, int64_t j_hi) {
  const float* p = r.p;
  constexpr int kBlock = 8;
  for (; j + kBlock <= j_hi; j += kBlock) {
    float best[kBlock];
    int64_t at[kBlock];
    for (int l = 0; l < kBlock; ++l) {
      at[l] = r.h0 * s.w + (j + l) * s.stride - s.pad;
      best[l] = p[at[l]];
    }
    for (int64_t hi = r.h0; hi < r.h1; ++hi)
      for (int64_t b = 0; b < s.kernel; ++b)
        for (int l = 0; l < kBlock; ++l) {
          const int64_t idx = hi * s.w + (j + l) * s.stride - s.pad + b;
          const float v = p[idx];
          const bool take = !(v <= best[l]) & (best[l] == best[l]);
          best[l] = take ? v : best[l];
          at[l] = take ? idx : at[l];
        }
    for (int l = 0; l < kBlock; ++l) {
      r.py[r.row + j + l] = best[l];
      r.argmax[r.row + j + l] = static_cast<int32_t>(at[l]);
    }
  }
  return j;
}

// Output j, its window clipped to the image.
void max_one(const PoolShape& s, const PoolRow& r, int64_t j) {
  const float* p = r.p;
  const int64_t w0 = std::max<int64_t>(0, j * s.stride - s.pad);
  const int64_t w1 = std::min<int64_t>(s.w, j * s.stride - s.pad + s.kernel);
  int64_t at = r.h0 * s.w + w0;
  float best = p[at];
  for (int64_t hi = r.h0; hi < r.h1; ++hi)
    for (int64_t wi = w0; wi < w1; ++wi) {
      const float v = p[hi * s.w + wi];
      // Larger, or the window's first NaN (a NaN maximum then stays: nothing compares above it). Selected
      // without a branch: which element wins is data-dependent and would mispredict half the time.
      const bool take = !(v <= best) & (best == best);
      best = take ? v : best;
      at = take ? hi * s.w + wi : at;
    }
  const int64_t o = r.row + j;
  r.py[o] = best;
  r.argmax[o] = static_cast<int32_t>(at);
}

}  // namespace

void maxpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y, std::span<int32_t> argmax) {
  checks::pool("maxpool2d", s, x, y, std::ssize(argmax), kCpu);
  const int64_t oh = s.out_h(), ow = s.out_w();
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
  cpu::parallel_ranges(s.n * s.c, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < oh; ++i) {
        // The window's rows and columns inside the image (padding is never the maximum, as in PyTorch).
        const PoolRow row{px + r * s.h * s.w, std::max<int64_t>(0, i * s.stride - s.pad),
                          std::min<int64_t>(s.h, i * s.stride - s.pad + s.kernel), (r * oh + i) * ow, py,
                          argmax.data()};
        // Outputs whose window lies inside the image horizontally: j in [j_lo, j_hi).
        const int64_t j_lo = std::min<int64_t>(ow, (s.pad + s.stride - 1) / s.stride);
        const int64_t j_hi = std::max<int64_t>(j_lo, std::min<int64_t>(ow, (s.w + s.pad - s.kernel) / s.stride + 1));
        int64_t j = j_lo;
#ifdef __AVX2__
        if (s.kernel == 3 && s.stride == 2) j = max_row_3x3s2_avx2(s, row, j, j_hi);
#endif
        j = max_row_blocks(s, row, j, j_hi);
        for (int64_t jj = 0; jj < j_lo; ++jj) max_one(s, row, jj);
        for (; j < ow; ++j) max_one(s, row, j);
      }
    }
  });
}

void maxpool2d_backward(const PoolShape& s, const Tensor& dy, std::span<const int32_t> argmax, Tensor& dx) {
  checks::pool("maxpool2d backward", s, dx, dy, std::ssize(argmax), kCpu);
  const int64_t plane = s.out_h() * s.out_w();
  const float* pd = dy.data_as<float>();
  float* out = dx.data_as<float>();
  cpu::parallel_ranges(s.n * s.c, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* q = out + r * s.h * s.w;
      std::fill(q, q + s.h * s.w, 0.0f);
      for (int64_t o = 0; o < plane; ++o) q[argmax[static_cast<size_t>(r * plane + o)]] += pd[r * plane + o];
    }
  });
}

void avgpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y) {
  checks::pool("avgpool2d", s, x, y, -1, kCpu);
  const int64_t oh = s.out_h(), ow = s.out_w();
  const float inv = 1.0f / static_cast<float>(s.kernel * s.kernel);
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
  cpu::parallel_ranges(s.n * s.c, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* p = px + r * s.h * s.w;
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          float acc = 0.0f;
          for (int64_t a = 0; a < s.kernel; ++a) {
            const int64_t hi = i * s.stride - s.pad + a;
            if (hi < 0 || hi >= s.h) continue;
            for (int64_t b = 0; b < s.kernel; ++b) {
              const int64_t wi = j * s.stride - s.pad + b;
              if (wi >= 0 && wi < s.w) acc += p[hi * s.w + wi];
            }
          }
          py[(r * oh + i) * ow + j] = acc * inv;
        }
    }
  });
}

void avgpool2d_backward(const PoolShape& s, const Tensor& dy, Tensor& dx) {
  checks::pool("avgpool2d backward", s, dx, dy, -1, kCpu);
  const int64_t oh = s.out_h(), ow = s.out_w();
  const float inv = 1.0f / static_cast<float>(s.kernel * s.kernel);
  const float* pd = dy.data_as<float>();
  float* out = dx.data_as<float>();
  cpu::parallel_ranges(s.n * s.c, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* q = out + r * s.h * s.w;
      std::fill(q, q + s.h * s.w, 0.0f);
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const float g = pd[(r * oh + i) * ow + j] * inv;
          for (int64_t a = 0; a < s.kernel; ++a) {
            const int64_t hi = i * s.stride - s.pad + a;
            if (hi < 0 || hi >= s.h) continue;
            for (int64_t b = 0; b < s.kernel; ++b) {
              const int64_t wi = j * s.stride - s.pad + b;
              if (wi >= 0 && wi < s.w) q[hi * s.w + wi] += g;
            }
          }
        }
    }
  });
}

void global_avgpool2d_forward(const Tensor& x, Tensor& y) {
  const int64_t hw = checks::global_avgpool("global_avgpool2d", x, y, kCpu), rows = y.numel();
  const float* p = x.data_as<float>();
  float* q = y.data_as<float>();
  const float inv = 1.0f / static_cast<float>(hw);
  for (int64_t r = 0; r < rows; ++r) {
    float acc = 0.0f;
    for (int64_t i = 0; i < hw; ++i) acc += p[r * hw + i];
    q[r] = acc * inv;
  }
}

void global_avgpool2d_backward(const Tensor& dy, Tensor& dx) {
  const int64_t hw = checks::global_avgpool("global_avgpool2d backward", dx, dy, kCpu), rows = dy.numel();
  const float inv = 1.0f / static_cast<float>(hw);
  const float* g = dy.data_as<float>();
  float* q = dx.data_as<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < hw; ++i) q[r * hw + i] = g[r] * inv;
}

}  // namespace ampdist::kernels::cpu

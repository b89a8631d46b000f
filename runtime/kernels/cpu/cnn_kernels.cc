// CPU implementations of kernels/cnn.h: convolutions through oneDNN's convolution primitives (plain NCHW / OIHW
// memory, so no reorders at the interface; oneDNN picks its implementation for that layout), BatchNorm and pooling
// as loops over channels split across the compute threads (cpu/parallel.h: each output element is computed by the
// same operations for any thread count, so results are bitwise reproducible).
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>
#include <unordered_map>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/kernels/cnn.h"
#include "runtime/kernels/cpu/parallel.h"

namespace ampdist::kernels {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

void check_cpu_f32(const Tensor& t, const char* op, const char* what) {
  if (t.device() != Device::kCPU || t.dtype() != DType::kFloat32)
    throw Error(std::string(op) + ": " + what + " must be an FP32 tensor on the CPU, got " + dtype_name(t.dtype()) +
                (t.device() == Device::kCPU ? "" : " on the GPU"));
}
void check_numel(const Tensor& t, int64_t n, const char* op, const char* what) {
  if (t.numel() != n)
    throw Error(std::string(op) + ": " + what + " has " + std::to_string(t.numel()) + " elements, expected " +
                std::to_string(n));
}

// All int64: no padding bytes, so that memcmp and the hash see only the fields (also in the map's copies).
struct ConvKey {
  ConvShape s;
  int64_t kind;  // 0 forward, 1 backward data, 2 backward weights
  int64_t bias;
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
struct ConvEntry {
  dnnl::primitive prim;
  memory a, b, c, d;  // forward: src, wei, dst, bias; bwd data: diff_dst, wei, diff_src; bwd weights: src, diff_dst,
                      // diff_wei, diff_bias
  memory scratch;
  std::vector<unsigned char> scratch_buf;
  std::string impl;
};

struct ConvDescs {
  memory::desc src, wei, dst, bias;
  memory::dims strides, dilates, pad_l, pad_r;
};
ConvDescs descs(const ConvShape& s) {
  ConvDescs d;
  d.src = memory::desc({s.n, s.c, s.h, s.w}, dt::f32, tag::nchw);
  d.dst = memory::desc({s.n, s.k, s.out_h(), s.out_w()}, dt::f32, tag::nchw);
  d.wei = s.groups == 1 ? memory::desc({s.k, s.c, s.kh, s.kw}, dt::f32, tag::oihw)
                        : memory::desc({s.groups, s.k / s.groups, s.c / s.groups, s.kh, s.kw}, dt::f32, tag::goihw);
  d.bias = memory::desc({s.k}, dt::f32, tag::x);
  d.strides = {s.stride, s.stride};
  d.dilates = {s.dilation - 1, s.dilation - 1};  // oneDNN counts the gaps: 0 = a dense kernel
  d.pad_l = {s.pad, s.pad};
  // oneDNN wants the right padding that makes its size formula exact for this output size (floor mode).
  d.pad_r = {(s.out_h() - 1) * s.stride + (s.kh - 1) * s.dilation + 1 - s.h - s.pad,
             (s.out_w() - 1) * s.stride + (s.kw - 1) * s.dilation + 1 - s.w - s.pad};
  return d;
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvShape& s, bool bias, const dnnl::primitive_attr& attr) {
  const ConvDescs d = descs(s);
  dnnl::convolution_forward::desc fd =
      bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                             d.src, d.wei, d.bias, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
           : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                             d.src, d.wei, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r);
  return dnnl::convolution_forward::primitive_desc(fd, attr, engine());
}

struct ConvState {
#if defined(AMPDIST_ENGINE_SINGLE_THREAD)
  // As for the matmuls (cpu/onednn.cc): TSan cannot see libgomp's barriers, so oneDNN runs on the calling thread.
  ConvState() { omp_set_num_threads(1); }
#endif
  std::unordered_map<ConvKey, std::unique_ptr<ConvEntry>, ConvKeyHash> cache;
  dnnl::stream stream{engine()};
};
ConvState& conv_state() {
  thread_local ConvState s;
  return s;
}

void validate(const ConvShape& s) {
  if (s.n < 0 || s.c <= 0 || s.h <= 0 || s.w <= 0 || s.k <= 0 || s.kh <= 0 || s.kw <= 0 || s.stride <= 0 ||
      s.pad < 0 || s.dilation <= 0 || s.groups <= 0 || s.c % s.groups != 0 || s.k % s.groups != 0 ||
      s.out_h() <= 0 || s.out_w() <= 0)
    throw Error("conv2d: invalid shape: input [" + std::to_string(s.n) + ", " + std::to_string(s.c) + ", " +
                std::to_string(s.h) + ", " + std::to_string(s.w) + "], " + std::to_string(s.k) + " filters of " +
                std::to_string(s.kh) + "x" + std::to_string(s.kw) + ", stride " + std::to_string(s.stride) +
                ", padding " + std::to_string(s.pad) + ", dilation " + std::to_string(s.dilation) + ", groups " +
                std::to_string(s.groups));
}

ConvEntry& conv_entry(const ConvShape& s, int kind, bool bias) {
  ConvKey key;
  key.s = s;
  key.kind = kind;
  key.bias = bias;
  ConvState& st = conv_state();
  auto it = st.cache.find(key);
  if (it != st.cache.end()) return *it->second;
  validate(s);
  auto e = std::make_unique<ConvEntry>();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const ConvDescs d = descs(s);
  memory::desc scratch_md;
  try {
    if (kind == 0) {
      auto pd = forward_pd(s, bias, attr);
      e->prim = dnnl::convolution_forward(pd);
      e->impl = pd.impl_info_str();
      scratch_md = pd.scratchpad_desc();
      e->a = memory(d.src, engine(), DNNL_MEMORY_NONE);
      e->b = memory(d.wei, engine(), DNNL_MEMORY_NONE);
      e->c = memory(d.dst, engine(), DNNL_MEMORY_NONE);
      e->d = memory(d.bias, engine(), DNNL_MEMORY_NONE);
    } else if (kind == 1) {
      const auto hint = forward_pd(s, false, dnnl::primitive_attr());
      dnnl::convolution_backward_data::desc bd(dnnl::algorithm::convolution_direct, d.src, d.wei, d.dst, d.strides,
                                               d.dilates, d.pad_l, d.pad_r);
      dnnl::convolution_backward_data::primitive_desc pd(bd, attr, engine(), hint);
      e->prim = dnnl::convolution_backward_data(pd);
      e->impl = pd.impl_info_str();
      scratch_md = pd.scratchpad_desc();
      e->a = memory(d.dst, engine(), DNNL_MEMORY_NONE);
      e->b = memory(d.wei, engine(), DNNL_MEMORY_NONE);
      e->c = memory(d.src, engine(), DNNL_MEMORY_NONE);
    } else {
      const auto hint = forward_pd(s, bias, dnnl::primitive_attr());
      dnnl::convolution_backward_weights::desc wd =
          bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src, d.wei, d.bias,
                                                          d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
               : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src, d.wei, d.dst,
                                                          d.strides, d.dilates, d.pad_l, d.pad_r);
      dnnl::convolution_backward_weights::primitive_desc pd(wd, attr, engine(), hint);
      e->prim = dnnl::convolution_backward_weights(pd);
      e->impl = pd.impl_info_str();
      scratch_md = pd.scratchpad_desc();
      e->a = memory(d.src, engine(), DNNL_MEMORY_NONE);
      e->b = memory(d.dst, engine(), DNNL_MEMORY_NONE);
      e->c = memory(d.wei, engine(), DNNL_MEMORY_NONE);
      e->d = memory(d.bias, engine(), DNNL_MEMORY_NONE);
    }
  } catch (const dnnl::error& err) {
    throw Error(std::string("conv2d: oneDNN has no ") +
                (kind == 0 ? "forward" : kind == 1 ? "backward-data" : "backward-weights") +
                " convolution for this shape: " + err.what());
  }
  e->scratch_buf.resize(scratch_md.get_size());
  e->scratch = memory(scratch_md, engine(), e->scratch_buf.empty() ? nullptr : e->scratch_buf.data());
  return *st.cache.emplace(key, std::move(e)).first->second;
}

}  // namespace

void conv2d_forward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  check_cpu_f32(x, "conv2d", "x");
  check_cpu_f32(w, "conv2d", "weight");
  check_cpu_f32(y, "conv2d", "y");
  check_numel(x, s.n * s.c * s.h * s.w, "conv2d", "x");
  check_numel(w, s.k * (s.c / std::max<int64_t>(s.groups, 1)) * s.kh * s.kw, "conv2d", "weight");
  check_numel(y, s.n * s.k * s.out_h() * s.out_w(), "conv2d", "y");
  if (s.n == 0) return;
  ConvEntry& e = conv_entry(s, 0, bias != nullptr);
  e.a.set_data_handle(const_cast<void*>(x.data()));
  e.b.set_data_handle(const_cast<void*>(w.data()));
  e.c.set_data_handle(y.data());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}, {DNNL_ARG_SCRATCHPAD, e.scratch}};
  if (bias) {
    check_cpu_f32(*bias, "conv2d", "bias");
    check_numel(*bias, s.k, "conv2d", "bias");
    e.d.set_data_handle(const_cast<void*>(bias->data()));
    args.emplace(DNNL_ARG_BIAS, e.d);
  }
  ConvState& st = conv_state();
  e.prim.execute(st.stream, args);
  st.stream.wait();
}

void conv2d_backward_data(const ConvShape& s, const Tensor& dy, const Tensor& w, Tensor& dx) {
  check_cpu_f32(dy, "conv2d backward", "dy");
  check_cpu_f32(w, "conv2d backward", "weight");
  check_cpu_f32(dx, "conv2d backward", "dx");
  check_numel(dy, s.n * s.k * s.out_h() * s.out_w(), "conv2d backward", "dy");
  check_numel(dx, s.n * s.c * s.h * s.w, "conv2d backward", "dx");
  if (s.n == 0) return;
  ConvEntry& e = conv_entry(s, 1, false);
  e.a.set_data_handle(const_cast<void*>(dy.data()));
  e.b.set_data_handle(const_cast<void*>(w.data()));
  e.c.set_data_handle(dx.data());
  ConvState& st = conv_state();
  e.prim.execute(st.stream, {{DNNL_ARG_DIFF_DST, e.a},
                             {DNNL_ARG_WEIGHTS, e.b},
                             {DNNL_ARG_DIFF_SRC, e.c},
                             {DNNL_ARG_SCRATCHPAD, e.scratch}});
  st.stream.wait();
}

void conv2d_backward_weights(const ConvShape& s, const Tensor& x, const Tensor& dy, Tensor& dw, Tensor* dbias,
                             bool accumulate) {
  check_cpu_f32(x, "conv2d weight gradient", "x");
  check_cpu_f32(dy, "conv2d weight gradient", "dy");
  check_cpu_f32(dw, "conv2d weight gradient", "dw");
  check_numel(x, s.n * s.c * s.h * s.w, "conv2d weight gradient", "x");
  check_numel(dy, s.n * s.k * s.out_h() * s.out_w(), "conv2d weight gradient", "dy");
  if (s.n == 0) {
    if (!accumulate) {
      std::memset(dw.data(), 0, dw.nbytes());
      if (dbias) std::memset(dbias->data(), 0, dbias->nbytes());
    }
    return;
  }
  ConvEntry& e = conv_entry(s, 2, dbias != nullptr);
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
  e.a.set_data_handle(const_cast<void*>(x.data()));
  e.b.set_data_handle(const_cast<void*>(dy.data()));
  e.c.set_data_handle(wout);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, e.a},
                                       {DNNL_ARG_DIFF_DST, e.b},
                                       {DNNL_ARG_DIFF_WEIGHTS, e.c},
                                       {DNNL_ARG_SCRATCHPAD, e.scratch}};
  if (dbias) {
    check_cpu_f32(*dbias, "conv2d weight gradient", "dbias");
    e.d.set_data_handle(bout);
    args.emplace(DNNL_ARG_DIFF_BIAS, e.d);
  }
  ConvState& st = conv_state();
  e.prim.execute(st.stream, args);
  st.stream.wait();
  if (accumulate) {
    float* g = dw.data_as<float>();
    for (int64_t i = 0; i < dw.numel(); ++i) g[i] += tmp_w[static_cast<size_t>(i)];
    if (dbias) {
      float* gb = dbias->data_as<float>();
      for (int64_t i = 0; i < dbias->numel(); ++i) gb[i] += tmp_b[static_cast<size_t>(i)];
    }
  }
}

std::string conv2d_implementation(const ConvShape& s) { return conv_entry(s, 0, false).impl; }

// ---- BatchNorm ------------------------------------------------------------------------------------------------

namespace {
struct Nchw {
  int64_t n, c, hw;
};
Nchw nchw(const Tensor& x, const char* op) {
  check_cpu_f32(x, op, "x");
  if (x.ndim() != 4) throw Error(std::string(op) + ": x " + shape_str(x.shape()) + " is not [N, C, H, W]");
  return {x.dim(0), x.dim(1), x.dim(2) * x.dim(3)};
}
}  // namespace

void batchnorm_sums(const Tensor& x, std::span<double> sums) {
  const Nchw d = nchw(x, "batchnorm");
  if (static_cast<int64_t>(sums.size()) != 2 * d.c) throw Error("batchnorm: sums must hold 2C doubles");
  const float* px = x.data_as<float>();
  cpu::parallel_ranges(d.c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double s = 0.0, q = 0.0;
      for (int64_t n = 0; n < d.n; ++n) {
        const float* p = px + (n * d.c + c) * d.hw;
        for (int64_t i = 0; i < d.hw; ++i) {
          const double v = p[i];
          s += v;
          q += v * v;
        }
      }
      sums[static_cast<size_t>(c)] = s;
      sums[static_cast<size_t>(d.c + c)] = q;
    }
  });
}

void batchnorm_apply(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                     const Tensor& beta, Tensor& y) {
  const Nchw d = nchw(x, "batchnorm");
  check_cpu_f32(y, "batchnorm", "y");
  check_numel(y, x.numel(), "batchnorm", "y");
  for (const Tensor* t : {&mean, &invstd, &gamma, &beta}) {
    check_cpu_f32(*t, "batchnorm", "a per-channel tensor");
    check_numel(*t, d.c, "batchnorm", "a per-channel tensor");
  }
  const float *px = x.data_as<float>(), *pm = mean.data_as<float>(), *pi = invstd.data_as<float>(),
              *pg = gamma.data_as<float>(), *pb = beta.data_as<float>();
  float* py = y.data_as<float>();
  cpu::parallel_ranges(d.n * d.c, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r % d.c;
      const float scale = pi[c] * pg[c], m = pm[c], b = pb[c];
      const float* p = px + r * d.hw;
      float* q = py + r * d.hw;
      for (int64_t i = 0; i < d.hw; ++i) q[i] = (p[i] - m) * scale + b;
    }
  });
}

void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                             std::span<double> sums) {
  const Nchw d = nchw(x, "batchnorm backward");
  check_cpu_f32(dy, "batchnorm backward", "dy");
  check_numel(dy, x.numel(), "batchnorm backward", "dy");
  if (static_cast<int64_t>(sums.size()) != 2 * d.c) throw Error("batchnorm backward: sums must hold 2C doubles");
  const float *px = x.data_as<float>(), *pd = dy.data_as<float>(), *pm = mean.data_as<float>(),
              *pi = invstd.data_as<float>();
  cpu::parallel_ranges(d.c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double s = 0.0, sx = 0.0;
      const double m = pm[c], is = pi[c];
      for (int64_t n = 0; n < d.n; ++n) {
        const int64_t off = (n * d.c + c) * d.hw;
        for (int64_t i = 0; i < d.hw; ++i) {
          const double g = pd[off + i];
          s += g;
          sx += g * (px[off + i] - m) * is;
        }
      }
      sums[static_cast<size_t>(c)] = s;
      sums[static_cast<size_t>(d.c + c)] = sx;
    }
  });
}

void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                           const Tensor& gamma, std::span<const double> sums, double count, Tensor& dx) {
  const Nchw d = nchw(x, "batchnorm backward");
  check_cpu_f32(dx, "batchnorm backward", "dx");
  check_numel(dx, x.numel(), "batchnorm backward", "dx");
  const float *px = x.data_as<float>(), *pd = dy.data_as<float>(), *pm = mean.data_as<float>(),
              *pi = invstd.data_as<float>(), *pg = gamma.data_as<float>();
  float* out = dx.data_as<float>();
  cpu::parallel_ranges(d.n * d.c, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r % d.c;
      const double is = pi[c], k = pg[c] * is, m = pm[c];
      const double mean_dy = count > 0 ? sums[static_cast<size_t>(c)] / count : 0.0;
      const double mean_dyx = count > 0 ? sums[static_cast<size_t>(d.c + c)] / count : 0.0;
      const float* p = px + r * d.hw;
      const float* g = pd + r * d.hw;
      float* q = out + r * d.hw;
      for (int64_t i = 0; i < d.hw; ++i)
        q[i] = static_cast<float>(k * (g[i] - mean_dy - (p[i] - m) * is * mean_dyx));
    }
  });
}

// ---- pooling ----------------------------------------------------------------------------------------------------

namespace {
void check_pool(const PoolShape& s, const Tensor& x, const Tensor& y, const char* op) {
  if (s.kernel <= 0 || s.stride <= 0 || s.pad < 0 || 2 * s.pad > s.kernel || s.out_h() <= 0 || s.out_w() <= 0)
    throw Error(std::string(op) + ": kernel " + std::to_string(s.kernel) + ", stride " + std::to_string(s.stride) +
                ", padding " + std::to_string(s.pad) + " do not fit a " + std::to_string(s.h) + "x" +
                std::to_string(s.w) + " input (padding at most half the kernel)");
  check_cpu_f32(x, op, "input");
  check_cpu_f32(y, op, "output");
  check_numel(x, s.n * s.c * s.h * s.w, op, "input");
  check_numel(y, s.n * s.c * s.out_h() * s.out_w(), op, "output");
}
}  // namespace

void maxpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y, std::span<int32_t> argmax) {
  check_pool(s, x, y, "maxpool2d");
  const int64_t oh = s.out_h(), ow = s.out_w();
  if (static_cast<int64_t>(argmax.size()) != y.numel()) throw Error("maxpool2d: argmax must hold one per output");
  const float* px = x.data_as<float>();
  float* py = y.data_as<float>();
  cpu::parallel_ranges(s.n * s.c, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* p = px + r * s.h * s.w;
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          float best = -std::numeric_limits<float>::infinity();
          int32_t at = -1;
          for (int64_t a = 0; a < s.kernel; ++a) {
            const int64_t hi = i * s.stride - s.pad + a;
            if (hi < 0 || hi >= s.h) continue;
            for (int64_t b = 0; b < s.kernel; ++b) {
              const int64_t wi = j * s.stride - s.pad + b;
              if (wi < 0 || wi >= s.w) continue;
              const float v = p[hi * s.w + wi];
              // The first NaN of a window stays its maximum.
              if (at < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
                best = v;
                at = static_cast<int32_t>(hi * s.w + wi);
              }
            }
          }
          const int64_t o = (r * oh + i) * ow + j;
          py[o] = best;
          argmax[static_cast<size_t>(o)] = at;
        }
    }
  });
}

void maxpool2d_backward(const PoolShape& s, const Tensor& dy, std::span<const int32_t> argmax, Tensor& dx) {
  check_pool(s, dx, dy, "maxpool2d backward");
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
  check_pool(s, x, y, "avgpool2d");
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
  check_pool(s, dx, dy, "avgpool2d backward");
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

}  // namespace ampdist::kernels

// fp16 / bf16 storage and conversions (DESIGN.md "Numerics rules": 16 bits in memory, round to nearest even,
// inf, NaN and subnormals kept).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/kernels.h"

namespace ampdist {
namespace {

uint16_t bits_of(half h) {
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}
uint16_t bits_of(bfloat16 h) {
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}
uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
half half_from_bits(uint16_t b) { return Eigen::numext::bit_cast<half>(b); }
bfloat16 bf16_from_bits(uint16_t b) { return Eigen::numext::bit_cast<bfloat16>(b); }
uint16_t fp16_bits(float f) { return bits_of(half(f)); }
uint16_t bf16_bits(float f) { return bits_of(bfloat16(f)); }

bool fp16_is_nan_bits(uint16_t b) { return (b & 0x7C00u) == 0x7C00u && (b & 0x03FFu) != 0; }
bool bf16_is_nan_bits(uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0; }

// The exact value of an fp16 bit pattern, decoded independently of Eigen (IEEE 754 binary16).
double decode_fp16(uint16_t b) {
  const int sign = b >> 15, exp = (b >> 10) & 0x1F, mant = b & 0x3FF;
  double v;
  if (exp == 0x1F) v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp == 0) v = std::ldexp(static_cast<double>(mant), -24);             // subnormal: mant * 2^-24
  else v = std::ldexp(static_cast<double>(1024 + mant), exp - 25);               // (1.mant) * 2^(exp-15)
  return sign ? -v : v;
}

std::string hex(uint32_t v) {
  std::ostringstream o;
  o << "0x" << std::hex << v;
  return o.str();
}

// ---- exhaustive round trips ---------------------------------------------------------------------------------

// Every one of the 65,536 fp16 patterns: fp16 -> float is exact (checked against an independent decoder) and
// float -> fp16 gives the same bits back.
//
// NaN patterns: the result is a NaN with the same sign, but the payload is not kept. On this toolchain Eigen 3.4's
// software conversion (used with GCC even under -mf16c: its EIGEN_HAS_FP16_C guard tests EIGEN_COMP_CLANG, which
// is defined as 0 on GCC) maps every NaN to the canonical quiet NaN 0x7E00 | sign; F16C's vcvtps2ph instead keeps
// the top payload bits and sets the quiet bit; CUDA's cvt.rn.f16.f32 returns the canonical 0x7FFF (even the sign
// goes, so a GPU test may only assert NaN-ness). IEEE 754 does not require a
// format conversion to preserve payloads (it only "should"), and the design only needs NaN to stay NaN so the
// non-finite check sees it, so only NaN-ness and the sign are asserted.
TEST(DType, Fp16AllPatternsRoundTripBitwise) {
  int failures = 0;
  std::string first;
  int nan_patterns = 0;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = static_cast<float>(half_from_bits(bits));
    const uint16_t back = fp16_bits(f);
    bool ok;
    if (fp16_is_nan_bits(bits)) {
      ++nan_patterns;
      ok = std::isnan(f) && std::signbit(f) == static_cast<bool>(bits >> 15) && fp16_is_nan_bits(back) &&
           (back >> 15) == (bits >> 15);
    } else {
      const double exact = decode_fp16(bits);
      ok = back == bits && static_cast<double>(f) == exact && std::signbit(f) == std::signbit(exact);
    }
    if (!ok && failures++ == 0) first = hex(bits) + " -> float " + hex(bits_of(f)) + " -> " + hex(back);
  }
  EXPECT_EQ(nan_patterns, 2 * 1023);  // 2 signs x 1023 nonzero mantissas with an all-ones exponent
  EXPECT_EQ(failures, 0) << "first failure: " << first;
}

// Every one of the 65,536 bf16 patterns: bf16 -> float is the pattern shifted into the upper half (bf16 is the top
// 16 bits of binary32), and float -> bf16 gives the same bits back. NaN: same sign and still NaN; Eigen 3.4
// canonicalises the payload to 0x7FC0 | sign (see the fp16 test for why that is allowed).
TEST(DType, Bf16AllPatternsRoundTripBitwise) {
  int failures = 0;
  std::string first;
  int nan_patterns = 0;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = static_cast<float>(bf16_from_bits(bits));
    const uint16_t back = bf16_bits(f);
    bool ok;
    if (bf16_is_nan_bits(bits)) {
      ++nan_patterns;
      ok = std::isnan(f) && std::signbit(f) == static_cast<bool>(bits >> 15) && bf16_is_nan_bits(back) &&
           (back >> 15) == (bits >> 15);
    } else {
      ok = back == bits && bits_of(f) == (static_cast<uint32_t>(bits) << 16);
    }
    if (!ok && failures++ == 0) first = hex(bits) + " -> float " + hex(bits_of(f)) + " -> " + hex(back);
  }
  EXPECT_EQ(nan_patterns, 2 * 127);
  EXPECT_EQ(failures, 0) << "first failure: " << first;
}

// ---- FP32 -> fp16 rounding ------------------------------------------------------------------------------------

TEST(DType, Fp16RoundsTiesToEven) {
  // ulp(1) in fp16 is 2^-10, so 1 + 2^-11 is exactly half way between 1.0 (mantissa 0, even) and 1 + 2^-10 (odd).
  EXPECT_EQ(fp16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  // 1 + 3*2^-11 lies half way between 1 + 2^-10 (odd) and 1 + 2^-9 (even): rounds up.
  EXPECT_EQ(fp16_bits(1.0f + 3.0f * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(static_cast<float>(half(1.0f + 3.0f * std::ldexp(1.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
  // Just above a tie rounds up, just below rounds down (not a truncation).
  EXPECT_EQ(fp16_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(fp16_bits(1.0f + std::ldexp(1.0f, -11) - std::ldexp(1.0f, -20)), 0x3C00);
  // Negative ties are symmetric.
  EXPECT_EQ(fp16_bits(-(1.0f + std::ldexp(1.0f, -11))), 0xBC00);
  EXPECT_EQ(fp16_bits(-(1.0f + 3.0f * std::ldexp(1.0f, -11))), 0xBC02);
}

TEST(DType, Fp16Subnormals) {
  const float tiny = std::ldexp(1.0f, -24);                  // smallest fp16 subnormal
  EXPECT_EQ(fp16_bits(tiny), 0x0001);
  EXPECT_EQ(fp16_bits(std::ldexp(1.0f, -25)), 0x0000);        // tie between 0 and 2^-24: to even, 0
  EXPECT_EQ(fp16_bits(-std::ldexp(1.0f, -25)), 0x8000);       // keeps the sign: -0
  EXPECT_EQ(fp16_bits(std::ldexp(1.0f, -25) * 1.0001f), 0x0001);  // above the tie
  EXPECT_EQ(fp16_bits(1.5f * tiny), 0x0002);                  // tie between 1 and 2 ulps: rounds UP to even 2
  EXPECT_EQ(fp16_bits(2.5f * tiny), 0x0002);                  // tie between 2 and 3: rounds DOWN to even 2
  EXPECT_EQ(fp16_bits(3.5f * tiny), 0x0004);                  // tie between 3 and 4: up to 4
  EXPECT_EQ(fp16_bits(std::ldexp(1.0f, -14) - tiny), 0x03FF);  // largest subnormal
  EXPECT_EQ(fp16_bits(std::ldexp(1.0f, -14)), 0x0400);        // smallest normal
  // Subnormals convert back exactly.
  EXPECT_EQ(static_cast<float>(half_from_bits(0x0001)), tiny);
  EXPECT_EQ(static_cast<float>(half_from_bits(0x03FF)), 1023.0f * tiny);
}

TEST(DType, Fp16OverflowInfAndNaN) {
  EXPECT_EQ(fp16_bits(65504.0f), 0x7BFF);   // largest finite
  EXPECT_EQ(fp16_bits(65519.0f), 0x7BFF);   // below the midpoint 65520 between 65504 and 2^16
  EXPECT_EQ(fp16_bits(65520.0f), 0x7C00);   // the midpoint: ties to even, i.e. to 2^16, which is +inf
  EXPECT_EQ(fp16_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(fp16_bits(-65519.0f), 0xFBFF);
  EXPECT_EQ(fp16_bits(1e10f), 0x7C00);
  EXPECT_EQ(fp16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(fp16_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(fp16_bits(FLT_MAX), 0x7C00);
  EXPECT_TRUE(fp16_is_nan_bits(fp16_bits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(fp16_is_nan_bits(fp16_bits(std::numeric_limits<float>::signaling_NaN())));
  const uint16_t neg_nan = fp16_bits(-std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(fp16_is_nan_bits(neg_nan));
  EXPECT_EQ(neg_nan >> 15, 1);
  // A float NaN whose payload lives only in the low 13 bits must not truncate to inf (0x7C00).
  float low_payload_nan;
  const uint32_t lp = 0x7F800001u;
  std::memcpy(&low_payload_nan, &lp, 4);
  EXPECT_TRUE(fp16_is_nan_bits(fp16_bits(low_payload_nan)));
  EXPECT_EQ(fp16_bits(-0.0f), 0x8000);
}

// ---- FP32 -> bf16 rounding ------------------------------------------------------------------------------------

TEST(DType, Bf16RoundsTiesToEven) {
  // ulp(1) in bf16 is 2^-7: 1 + 2^-8 is a tie between 1.0 (even) and 1 + 2^-7 (odd).
  EXPECT_EQ(bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3*2^-8: a tie between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(bf16_bits(1.0f + 3.0f * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(static_cast<float>(bfloat16(1.0f + 3.0f * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);  // above the tie: up
  EXPECT_EQ(bf16_bits(-(1.0f + std::ldexp(1.0f, -8))), 0xBF80);
}

TEST(DType, Bf16OverflowSubnormalsAndNaN) {
  // FLT_MAX = 0x7F7FFFFF: the dropped half 0xFFFF is above the midpoint, so it rounds up into the exponent: +inf.
  EXPECT_EQ(bf16_bits(FLT_MAX), 0x7F80);
  EXPECT_EQ(bf16_bits(-FLT_MAX), 0xFF80);
  EXPECT_EQ(bf16_bits(3.38953139e38f), 0x7F7F);  // the largest finite bf16 stays
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  // 1e-40f is a float subnormal (bits 0x000116C2); bf16 shares float's exponent range, so it stays a nonzero
  // subnormal: 0x0001 (the dropped half 0x16C2 is below the midpoint).
  const float sub = 1e-40f;
  ASSERT_EQ(std::fpclassify(sub), FP_SUBNORMAL);
  const uint16_t b = bf16_bits(sub);
  EXPECT_EQ(b, 0x0001);
  const float back = static_cast<float>(bf16_from_bits(b));
  EXPECT_NE(back, 0.0f);
  EXPECT_EQ(std::fpclassify(back), FP_SUBNORMAL);
  EXPECT_TRUE(bf16_is_nan_bits(bf16_bits(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload is only in the dropped half must not truncate to inf.
  float low_payload_nan;
  const uint32_t lp = 0x7F800001u;
  std::memcpy(&low_payload_nan, &lp, 4);
  EXPECT_TRUE(bf16_is_nan_bits(bf16_bits(low_payload_nan)));
  const uint16_t neg_nan = bf16_bits(-std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(bf16_is_nan_bits(neg_nan));
  EXPECT_EQ(neg_nan >> 15, 1);
}

// ---- tensors and the cast kernel ------------------------------------------------------------------------------

TEST(DType, SixteenBitTensorsHoldTwoBytesPerElement) {
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  Tensor h = Tensor::empty({3, 5}, DType::kFloat16);
  Tensor b = Tensor::zeros({3, 5}, DType::kBFloat16);
  Tensor f = Tensor::empty({3, 5}, DType::kFloat32);
  EXPECT_EQ(h.nbytes(), 30u);
  EXPECT_EQ(b.nbytes(), 30u);
  EXPECT_EQ(f.nbytes(), 60u);
  // Element i really sits at byte 2*i.
  half* hp = h.data_as<half>();
  EXPECT_EQ(reinterpret_cast<char*>(hp + 7) - reinterpret_cast<char*>(hp), 14);
  EXPECT_THROW(h.data_as<float>(), Error);
  EXPECT_THROW(b.data_as<half>(), Error);
  EXPECT_STREQ(dtype_name(DType::kFloat16), "fp16");
  EXPECT_STREQ(dtype_name(DType::kBFloat16), "bf16");
  EXPECT_STREQ(dtype_name(DType::kFloat32), "fp32");
}

std::vector<float> tricky_values() {
  const float t = std::ldexp(1.0f, -24);
  return {1.0f + std::ldexp(1.0f, -11), 1.0f + 3.0f * std::ldexp(1.0f, -11), 1.0f + std::ldexp(1.0f, -8),
          1.0f + 3.0f * std::ldexp(1.0f, -8), t, 1.5f * t, 2.5f * t, std::ldexp(1.0f, -25), std::ldexp(1.0f, -14),
          65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e10f, FLT_MAX, 1e-40f, 0.1f, -0.0f, 0.0f, -3.14159f,
          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
}

template <typename T>
void check_cast_kernel_matches_scalar(DType dt) {
  const std::vector<float> v = tricky_values();
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor src = Tensor::view(const_cast<float*>(v.data()), {n}, DType::kFloat32);
  Tensor mid = Tensor::empty({n}, dt);
  Tensor back = Tensor::empty({n}, DType::kFloat32);
  kernels::cast(src, mid);
  kernels::cast(mid, back);
  const T* m = mid.data_as<T>();
  const float* r = back.data_as<float>();
  for (int64_t i = 0; i < n; ++i) {
    const T scalar(v[i]);
    const float scalar_back = static_cast<float>(scalar);
    if (std::isnan(v[i])) {
      EXPECT_TRUE(std::isnan(static_cast<float>(m[i]))) << "element " << i;
      EXPECT_TRUE(std::isnan(r[i])) << "element " << i;
      EXPECT_EQ(std::signbit(r[i]), std::signbit(v[i])) << "element " << i;
    } else {
      EXPECT_EQ(bits_of(m[i]), bits_of(scalar)) << dtype_name(dt) << " element " << i << " = " << v[i];
      EXPECT_EQ(bits_of(r[i]), bits_of(scalar_back)) << dtype_name(dt) << " element " << i << " = " << v[i];
    }
  }
}

TEST(DType, CastKernelAgreesWithScalarConversionsFp16) { check_cast_kernel_matches_scalar<half>(DType::kFloat16); }
TEST(DType, CastKernelAgreesWithScalarConversionsBf16) {
  check_cast_kernel_matches_scalar<bfloat16>(DType::kBFloat16);
}

TEST(DType, CastKernelSpotValues) {
  // Independent of the scalar path: the expected bits are the hand-derived ones of the tests above.
  const float in[] = {1.0f + std::ldexp(1.0f, -11), 1.5f * std::ldexp(1.0f, -24), 65520.0f, 65519.0f};
  Tensor src = Tensor::view(const_cast<float*>(in), {4}, DType::kFloat32);
  Tensor h = Tensor::empty({4}, DType::kFloat16);
  kernels::cast(src, h);
  const half* p = h.data_as<half>();
  EXPECT_EQ(bits_of(p[0]), 0x3C00);
  EXPECT_EQ(bits_of(p[1]), 0x0002);
  EXPECT_EQ(bits_of(p[2]), 0x7C00);
  EXPECT_EQ(bits_of(p[3]), 0x7BFF);
  // fp16 -> bf16 directly (through FP32, both conversions exact or RNE): 65504 = 0x477FE0 -> bf16 rounds to 65536.
  Tensor bf = Tensor::empty({4}, DType::kBFloat16);
  kernels::cast(h, bf);
  EXPECT_EQ(bits_of(bf.data_as<bfloat16>()[3]), 0x4780);  // 65536 = 2^16
  EXPECT_EQ(bits_of(bf.data_as<bfloat16>()[2]), 0x7F80);  // inf stays inf
  Tensor wrong = Tensor::empty({3}, DType::kFloat16);
  EXPECT_THROW(kernels::cast(src, wrong), Error);
}

TEST(DType, DtypeMax) {
  EXPECT_EQ(dtype_max(DType::kFloat16), 65504.0f);
  // (2 - 2^-7) * 2^127, bits 0x7F7F0000.
  EXPECT_EQ(bits_of(dtype_max(DType::kBFloat16)), 0x7F7F0000u);
  EXPECT_EQ(dtype_max(DType::kBFloat16), 3.38953139e38f);
  EXPECT_EQ(dtype_max(DType::kFloat32), FLT_MAX);
  EXPECT_EQ(static_cast<float>(half(dtype_max(DType::kFloat16))), 65504.0f);
}

}  // namespace
}  // namespace ampdist

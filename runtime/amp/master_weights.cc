#include "runtime/amp/master_weights.h"

#include <xxhash.h>

#include <algorithm>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/kernels/kernels.h"

namespace ampdist {
namespace {

// dst[offset, offset + n) = src[0, n) (host FP32), rounded to dst's dtype, on dst's device.
void put(Tensor& dst, int64_t offset, const float* src, int64_t n) {
  if (n <= 0) return;
  const size_t es = dtype_size(dst.dtype());
  char* at = static_cast<char*>(dst.data()) + offset * static_cast<int64_t>(es);
  if (dst.dtype() == DType::kFloat32) return device::copy(at, dst.device(), src, Device::kCPU, n * sizeof(float));
  thread_local Tensor half;
  half.ensure({n}, dst.dtype());
  kernels::cast(Tensor::view(const_cast<float*>(src), {n}, DType::kFloat32), half);
  device::copy(at, dst.device(), half.data(), Device::kCPU, n * es);
}

// [b, e) of the flat space intersected with a tensor's [off, off + n), as (first, count); count 0 when disjoint.
std::pair<int64_t, int64_t> overlap(int64_t b, int64_t e, int64_t off, int64_t n) {
  const int64_t lo = std::max(b, off), hi = std::min(e, off + n);
  return {lo, std::max<int64_t>(0, hi - lo)};
}

}  // namespace

MasterWeights::MasterWeights(FlatLayout layout, DType working_dtype, Device device, MasterSlice slice,
                             std::vector<bool> fp32_reads)
    : layout_(std::move(layout)), working_dtype_(working_dtype), device_(device), sharded_(slice.world > 0) {
  const int64_t total = layout_.numel();
  slice_.begin = 0;
  slice_.count = total;
  if (sharded_) {
    slice_counts_ = shard_counts(total, slice.world);
    for (int r = 0; r < slice.rank; ++r) slice_.begin += slice_counts_[r];
    slice_.count = slice_counts_[slice.rank];
  }
  master_ = Tensor::zeros({slice_.count}, DType::kFloat32, device);
  grads_ = Tensor::zeros({total}, DType::kFloat32, device);
  working_ = !sharded_ && working_dtype == DType::kFloat32 ? master_ : Tensor::zeros({total}, working_dtype, device);
  fp32_offset_.assign(layout_.size(), -1);
  if (sharded_ && working_dtype != DType::kFloat32) {
    int64_t n = 0;
    for (size_t i = 0; i < layout_.size(); ++i)
      if (i < fp32_reads.size() && fp32_reads[i]) {
        fp32_offset_[i] = n;
        n += layout_[i].numel();
      }
    if (n > 0) fp32_ = Tensor::zeros({n}, DType::kFloat32, device);
    fp32_counts_.assign(slice_counts_.size(), 0);
    int64_t b = 0;
    for (size_t r = 0; r < slice_counts_.size(); ++r) {
      for (size_t i = 0; i < layout_.size(); ++i)
        if (fp32_offset_[i] >= 0)
          fp32_counts_[r] += overlap(b, b + slice_counts_[r], layout_[i].offset, layout_[i].numel()).second;
      b += slice_counts_[r];
    }
  }
}

void MasterWeights::fill(const std::function<void(size_t, int64_t, int64_t, float*)>& gen) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  std::vector<float> buf(kChunk);
  const int64_t sb = slice_.begin, se = slice_.begin + slice_.count;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const FlatEntry& e = layout_[i];
    for (int64_t j = 0; j < e.numel(); j += kChunk) {
      const int64_t c = std::min(kChunk, e.numel() - j), g0 = e.offset + j;
      gen(i, j, c, buf.data());
      if (!sharded_) {
        put(master_, g0, buf.data(), c);
        continue;
      }
      const auto [first, n] = overlap(sb, se, g0, c);
      put(master_, first - sb, buf.data() + (first - g0), n);
      put(working_, g0, buf.data(), c);
      if (fp32_offset_[i] >= 0) put(fp32_, fp32_offset_[i] + j, buf.data(), c);
    }
  }
  cast_to_working();
}

void MasterWeights::cast_to_working() {
  if (sharded_ || working_dtype_ == DType::kFloat32) return;
  kernels::cast(master_, working_);
  working_current_ = true;
}

void MasterWeights::ensure_working() {
  if (!working_current_) cast_to_working();
}

Tensor* MasterWeights::fused_working_out() {
  return sharded_ || working_dtype_ == DType::kFloat32 ? nullptr : &working_;
}

void MasterWeights::update_working_slice() {
  if (!sharded_) return;
  const int64_t sb = slice_.begin, se = slice_.begin + slice_.count;
  const size_t es = dtype_size(working_dtype_);
  Tensor w = Tensor::view(static_cast<char*>(working_.data()) + sb * static_cast<int64_t>(es), {slice_.count},
                          working_dtype_, device_);
  kernels::cast(master_, w);
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (fp32_offset_[i] < 0) continue;
    const FlatEntry& e = layout_[i];
    const auto [first, n] = overlap(sb, se, e.offset, e.numel());
    if (n == 0) continue;
    const Tensor src = Tensor::view(master_.data_as<float>() + (first - sb), {n}, DType::kFloat32, device_);
    Tensor dst = Tensor::view(fp32_.data_as<float>() + fp32_offset_[i] + (first - e.offset), {n}, DType::kFloat32,
                              device_);
    kernels::cast(src, dst);
  }
}

Tensor MasterWeights::grad_slice() {
  return Tensor::view(grads_.data_as<float>() + slice_.begin, {slice_.count}, DType::kFloat32, device_);
}

Tensor MasterWeights::grad_view(size_t i) {
  const FlatEntry& e = layout_[i];
  return Tensor::view(grads_.data_as<float>() + e.offset, e.shape, DType::kFloat32, device_);
}

Tensor MasterWeights::working_view(size_t i) {
  const FlatEntry& e = layout_[i];
  return Tensor::view(static_cast<char*>(working_.data()) + e.offset * dtype_size(working_dtype_), e.shape,
                      working_dtype_, device_);
}

Tensor MasterWeights::fp32_view(size_t i) {
  const FlatEntry& e = layout_[i];
  if (!sharded_) return Tensor::view(master_.data_as<float>() + e.offset, e.shape, DType::kFloat32, device_);
  if (working_dtype_ == DType::kFloat32) return working_view(i);
  if (fp32_offset_[i] < 0) return Tensor();
  return Tensor::view(fp32_.data_as<float>() + fp32_offset_[i], e.shape, DType::kFloat32, device_);
}

namespace {
uint64_t xxh3_of(const Tensor& t) {
  if (t.device() == Device::kCPU) return XXH3_64bits(t.data(), t.nbytes());
  const Tensor host = t.to(Device::kCPU);
  return XXH3_64bits(host.data(), host.nbytes());
}
}  // namespace

uint64_t MasterWeights::hash() const { return xxh3_of(master_); }
uint64_t MasterWeights::working_hash() const { return xxh3_of(working_); }

}  // namespace ampdist

// FlatLayout: named tensors laid out back to back in one flat buffer, in registration order: the layout of the
// master weights, their working copy, the gradients and the optimizer moments (amp/master_weights.h), of the
// reducer's buckets (runtime/dist/reducer.h) and of a checkpoint's tensor index. It knows names, shapes and offsets only,
// so every layer that needs the layout can use it without knowing what a model parameter is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace ampdist {

struct FlatEntry {
  std::string name;     // "fc1.weight"
  Shape shape;
  int64_t offset = 0;   // element offset in every flat buffer
  int64_t numel() const { return shape_numel(shape); }
};

class FlatLayout {
 public:
  // Appends a tensor after the last one; returns its index (registration order).
  int add(std::string name, Shape shape);
  const std::vector<FlatEntry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  const FlatEntry& operator[](size_t i) const { return entries_.at(i); }
  int64_t numel() const { return numel_; }

 private:
  std::vector<FlatEntry> entries_;
  int64_t numel_ = 0;
};

// Element counts of each rank's contiguous shard of n elements: n / W each, the first n % W ranks one more.
std::vector<int64_t> shard_counts(int64_t n, int world_size);

}  // namespace ampdist

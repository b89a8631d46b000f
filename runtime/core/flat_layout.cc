#include "runtime/core/flat_layout.h"

namespace ampdist {

int FlatLayout::add(std::string name, Shape shape) {
  FlatEntry e{std::move(name), std::move(shape), numel_};
  numel_ += e.numel();
  entries_.push_back(std::move(e));
  return static_cast<int>(entries_.size()) - 1;
}

std::vector<int64_t> shard_counts(int64_t n, int world_size) {
  std::vector<int64_t> c(world_size, n / world_size);
  for (int r = 0; r < n % world_size; ++r) ++c[r];
  return c;
}

}  // namespace ampdist

// Splitting an element-wise loop over the compute threads of this rank (train.threads_per_rank, the OpenMP team
// oneDNN also uses). Each thread gets one contiguous range, and every output element is computed by exactly the
// same operations as in a serial loop, so results are bitwise the same for any thread count; loops that reduce
// (sums over rows or columns) split only across the independent sums, never inside one.
#pragma once

#include <algorithm>
#include <cstdint>

extern "C" int omp_get_max_threads(void);

namespace ampdist::kernels::cpu {

// f(begin, end) over [0, n) in at most (threads) ranges of at least `grain` elements; serial below 2 * grain.
// Under ThreadSanitizer (AMPDIST_ENGINE_SINGLE_THREAD) everything runs on the calling thread: TSan cannot see
// libgomp's synchronisation.
template <typename F>
void parallel_ranges(int64_t n, int64_t grain, F&& f) {
#if defined(AMPDIST_ENGINE_SINGLE_THREAD)
  if (n > 0) f(int64_t{0}, n);
  return;
#endif
  const int64_t chunks = std::min<int64_t>(omp_get_max_threads(), n / std::max<int64_t>(grain, 1));
  if (chunks <= 1) {
    if (n > 0) f(int64_t{0}, n);
    return;
  }
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) f(n * c / chunks, n * (c + 1) / chunks);
}

}  // namespace ampdist::kernels::cpu

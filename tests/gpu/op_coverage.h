// Which GPU-against-CPU test covers which op of the op table (runtime/kernels/ops.def). Beside each such test:
//
//   AMPDIST_GPU_TEST_COVERS(GpuKernels, CastsEqualTheCpuBitForBit, "cast");
//   TEST(GpuKernels, CastsEqualTheCpuBitForBit) { ... }
//
// claims that the test runs each named op on the GPU and checks it against the CPU backend (directly, or through a
// layer or model whose result it compares). GpuOpCoverage.EveryOpOfTheTableHasAGpuAgainstCpuTest needs no GPU (it
// runs wherever the CUDA targets are built, nvcc being found) and fails for an op of the table that no test claims,
// a claim of an op the table lacks, and a claim by a test that does not exist.
#pragma once

#include <initializer_list>
#include <map>
#include <set>
#include <string>

namespace ampdist::testing {

// op id -> the tests that claim it ("Suite.Name").
inline std::map<std::string, std::set<std::string>>& gpu_op_coverage() {
  static std::map<std::string, std::set<std::string>> claims;
  return claims;
}

inline bool claim_gpu_coverage(const char* test, std::initializer_list<const char*> ops) {
  for (const char* op : ops) gpu_op_coverage()[op].insert(test);
  return true;
}

}  // namespace ampdist::testing

#define AMPDIST_GPU_TEST_COVERS(suite, name, ...)                          \
  [[maybe_unused]] const bool suite##_##name##_covers =                    \
      ::ampdist::testing::claim_gpu_coverage(#suite "." #name, {__VA_ARGS__})

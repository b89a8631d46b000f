// The op table against the GPU tests' claims (tests/gpu/op_coverage.h). Needs no GPU: it runs in every build that
// has the GPU tests, as the unit test gpu_op_coverage and within gpu_np1.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "runtime/kernels/op_table.h"
#include "tests/gpu/op_coverage.h"

namespace ampdist {
namespace {

std::set<std::string> registered_tests() {
  std::set<std::string> out;
  const ::testing::UnitTest& all = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < all.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *all.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j)
      out.insert(std::string(suite.name()) + "." + suite.GetTestInfo(j)->name());
  }
  return out;
}

TEST(GpuOpCoverage, EveryOpOfTheTableHasAGpuAgainstCpuTest) {
  const auto& claims = testing::gpu_op_coverage();
  std::set<std::string> table;
  for (std::string_view id : kernels::op_ids()) {
    table.emplace(id);
    EXPECT_TRUE(claims.count(std::string(id)))
        << "op " << id << " of runtime/kernels/ops.def has no GPU-against-CPU test: write one in tests/gpu/ and "
        << "claim the op with AMPDIST_GPU_TEST_COVERS beside it";
  }
  const std::set<std::string> tests = registered_tests();
  for (const auto& [op, by] : claims) {
    EXPECT_TRUE(table.count(op)) << "GPU tests claim op " << op << ", which runtime/kernels/ops.def does not list";
    for (const std::string& t : by) EXPECT_TRUE(tests.count(t)) << "claim of " << op << " by " << t << ": no such test";
  }
}

}  // namespace
}  // namespace ampdist

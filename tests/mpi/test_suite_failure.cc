// The mpi suite's own failure handling (mpi_main.cc), on purpose: one rank fails a test while every other rank waits
// in a collective that the failing rank never enters. Skipped unless AMPDIST_TEST_FAIL_ON_RANK names a rank;
// tests/mpi/failure_ends_every_rank.sh runs it and checks that every rank ends within seconds, non-zero, and that
// the output names the test and the rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

TEST(MpiSuite, FailsOnPurposeOnOneRank) {
  const char* on = std::getenv("AMPDIST_TEST_FAIL_ON_RANK");
  if (on == nullptr) GTEST_SKIP() << "AMPDIST_TEST_FAIL_ON_RANK is not set (tests/mpi/failure_ends_every_rank.sh sets it)";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == std::atoi(on)) {
    // AMPDIST_TEST_FAIL_BY=throw: an exception escapes the test body, as a library error would; else an assertion.
    const char* by = std::getenv("AMPDIST_TEST_FAIL_BY");
    if (by != nullptr && std::string(by) == "throw")
      throw std::runtime_error("thrown on purpose on rank " + std::to_string(rank));
    FAIL() << "failed on purpose on rank " << rank;
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the failing rank never arrives here
}

}  // namespace

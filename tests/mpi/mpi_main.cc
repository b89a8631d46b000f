// GoogleTest main for tests run under mpirun: every rank runs every test; rank 0 prints the results, other ranks
// print only failures. A test that fails (or throws) on any rank ends every rank of the job at once, non-zero:
// the other ranks may be waiting in a collective of that test, or of the next, that the failing rank never enters,
// so going on would hang the suite until CTest's timeout. tests/mpi/failure_ends_every_rank.sh checks it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#ifdef AMPDIST_GPU_TESTS
#include "comm/bootstrap.h"
#include "comm/nccl_communicator.h"
#include "runtime/core/device.h"
#endif

namespace {
// On ranks other than 0: one line per failed assertion, prefixed with the rank, so that a failure only one rank
// sees is visible in the log.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test's name is kept here: OnTestPartResult runs under GoogleTest's own lock, and
  // UnitTest::current_test_info() takes that lock again (a deadlock on the first failure).
  void OnTestStart(const ::testing::TestInfo& t) override {
    test_ = std::string(t.test_suite_name()) + "." + t.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d: %s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
  std::string test_ = "?";
};

// After a test failed on this rank: one line naming the test and the rank, then MPI_Abort, which makes the launcher
// end every rank of the job with a non-zero exit.
class AbortOnFailure : public ::testing::EmptyTestEventListener {
 public:
  explicit AbortOnFailure(int rank) : rank_(rank) {}
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (!t.result()->Failed()) return;
    std::fprintf(stderr, "[rank %d] test %s.%s failed: ending every rank of the job (MPI_Abort)\n", rank_,
                 t.test_suite_name(), t.name());
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  ::testing::UnitTest::GetInstance()->listeners().Append(new AbortOnFailure(rank));
#ifdef AMPDIST_GPU_TESTS
  // Bind this rank's GPU before any test touches a device: work on device 0 first would leave rank 1's stream,
  // handles and memory there. Ranks beyond the GPU count share (tests needing a GPU per rank skip themselves).
  if (ampdist::device::device_count() > 0) ampdist::bind_node_device(MPI_COMM_WORLD, /*allow_sharing=*/true);
#endif
  const int rc = RUN_ALL_TESTS();
  // A failure on any rank fails every rank's exit code, so mpirun reports it whichever rank it was.
  int all = rc;
  MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return all;
}

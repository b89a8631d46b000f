// GoogleTest main for tests run under mpirun: every rank runs every test; rank 0 prints the results, other ranks
// print only failures. A rank whose assertion fails exits non-zero, which fails the CTest entry.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

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
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "[rank %d] FAILED %s.%s at %s:%d: %s\n", rank_, t ? t->test_suite_name() : "?",
                 t ? t->name() : "?", r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
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
#ifdef AMPDIST_GPU_TESTS
  // Bind this rank's GPU before any test touches a device: work on device 0 first would leave rank 1's stream,
  // handles and memory there. Ranks beyond the GPU count share (tests needing a GPU per rank skip themselves).
  if (ampdist::device::device_count() > 0) {
    const ampdist::NodeRank node = ampdist::node_rank(MPI_COMM_WORLD);
    ampdist::bind_device(node.local_rank, node.local_size, /*allow_sharing=*/true);
  }
#endif
  const int rc = RUN_ALL_TESTS();
  // A failure on any rank fails every rank's exit code, so mpirun reports it whichever rank it was.
  int all = rc;
  MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return all;
}

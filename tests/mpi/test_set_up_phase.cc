// The set-up agreement of `ampdist train` (launch/set_up_phase.h): after each set-up phase every rank learns the
// largest exit code, and exactly one rank, the lowest that failed first-hand, prints the line. A rank that failed
// only because another did (a secondary error) never prints, in every phase: the NCCL set-up drill, where rank 1
// fails to join and every other rank aborts its join, must print rank 1's line, not rank 0's.
#include <gtest/gtest.h>

#include "launch/set_up_phase.h"
#include "test_util.h"

namespace ampdist {
namespace {

PhaseResult failed(int code, const std::string& message, bool secondary) {
  PhaseResult r;
  // Through run_phase, as the program records it: an Error marked secondary keeps the mark.
  run_phase(r, "run.pbtxt", [&] {
    Error e(message, code == 2 ? ErrorKind::kBadInput : ErrorKind::kRuntime);
    if (secondary) e.set_secondary();
    throw e;
  });
  return r;
}

TEST(SetUpPhase, NoFailureIsCodeZeroAndNoReporter) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  const PhaseVerdict v = agree_on_phase(comm, PhaseResult{});
  EXPECT_EQ(v.code, 0);
  EXPECT_EQ(v.reporter, -1);
}

TEST(SetUpPhase, TheRankThatFailedFirstHandReportsNotTheRanksThatFailedBecauseOfIt) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  if (comm.world_size() < 2) GTEST_SKIP() << "needs 2 ranks (mpi_np2, mpi_np4)";
  // The NCCL set-up drill's outcome: rank 1's join fails first-hand; every other rank aborts its own join.
  const PhaseResult mine = comm.rank() == 1 ? failed(1, "ncclCommInitRankConfig (rank 1): injected failure", false)
                                            : failed(1, "NCCL set-up: rank 1 failed before joining", true);
  EXPECT_EQ(mine.secondary, comm.rank() != 1);
  const PhaseVerdict v = agree_on_phase(comm, mine);
  EXPECT_EQ(v.code, 1);
  EXPECT_EQ(v.reporter, 1);
  EXPECT_FALSE(v.prefix_rank) << "every rank failed";
}

TEST(SetUpPhase, TheLowestFirstHandFailureReportsWithItsRankAndTheLargestCodeWins) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  const int last = comm.world_size() - 1;
  // Only the last rank fails (bad input, code 2): it reports, naming its rank unless it is the only rank.
  const PhaseResult mine = comm.rank() == last ? failed(2, "data.idx.dir: no such directory", false) : PhaseResult{};
  const PhaseVerdict v = agree_on_phase(comm, mine);
  EXPECT_EQ(v.code, 2);
  EXPECT_EQ(v.reporter, last);
  EXPECT_EQ(v.prefix_rank, comm.world_size() > 1);
  if (comm.world_size() < 2) return;
  // Every rank fails first-hand, rank 0 with code 1 and the others with 2: rank 0 reports, the code is 2.
  const PhaseVerdict all = agree_on_phase(comm, failed(comm.rank() == 0 ? 1 : 2, "disk full", false));
  EXPECT_EQ(all.code, 2);
  EXPECT_EQ(all.reporter, 0);
  EXPECT_FALSE(all.prefix_rank);
}

}  // namespace
}  // namespace ampdist

// The NCCL id broadcast's status word (comm/bootstrap.h), on the CPU: what the GPU backend's set-up does before any
// device is involved. Rank 0 makes the bytes; when it fails, every rank must hear of it through the same broadcast
// instead of waiting for bytes that never come.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <string>

#include "comm/bootstrap.h"
#include "runtime/core/error.h"

namespace ampdist {
namespace {

int rank_of_world() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

TEST(IdBroadcast, RankZerosBytesReachEveryRank) {
  std::array<unsigned char, 128> id{};  // the size of an ncclUniqueId
  broadcast_from_rank0(
      MPI_COMM_WORLD, id.data(), id.size(),
      [](void* out) {
        for (int i = 0; i < 128; ++i) static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(i * 7 + 1);
      },
      30.0, "unique id broadcast");
  for (int i = 0; i < 128; ++i) ASSERT_EQ(id[i], static_cast<unsigned char>(i * 7 + 1)) << i;
}

// Rank 0's producer fails (as ncclGetUniqueId with the injected fault, or a real NCCL error): every rank throws at
// once with rank 0's message; rank 0's error is first-hand, the others' secondary (the program then prints rank 0's
// line only), and nobody waits for the deadline.
TEST(IdBroadcast, AFailureOnRankZeroBecomesTheSameErrorOnEveryRank) {
  const double deadline_s = 60.0;
  std::array<unsigned char, 128> id{};
  id.fill(0xAB);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    broadcast_from_rank0(
        MPI_COMM_WORLD, id.data(), id.size(),
        [](void*) { throw Error("ncclGetUniqueId: injected failure (fault.nccl_setup_error, stage UNIQUE_ID)"); },
        deadline_s, "NCCL unique id broadcast");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ncclGetUniqueId: injected failure"), std::string::npos) << m;
    EXPECT_EQ(e.secondary(), rank_of_world() != 0) << m;
    EXPECT_EQ(e.exit_code(), 1);
    if (rank_of_world() != 0) {
      EXPECT_NE(m.find("NCCL unique id broadcast: rank 0 failed"), std::string::npos) << m;
    }
  }
  for (unsigned char b : id) ASSERT_EQ(b, 0xAB) << "a failed broadcast must leave the caller's bytes alone";
  // Well inside the deadline: the failure travels with the broadcast, it is not detected by waiting.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), deadline_s / 4);
  // The communicator is still usable afterwards (the agreement on the failure that follows in the program).
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  EXPECT_EQ(sum, world);
}

// A message longer than the status word's room is cut, not overrun.
TEST(IdBroadcast, ALongMessageIsCutToItsRoom) {
  unsigned char id[16] = {};
  try {
    broadcast_from_rank0(
        MPI_COMM_WORLD, id, sizeof id, [](void*) { throw Error(std::string(5000, 'x')); }, 30.0, "id");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(std::count(m.begin(), m.end(), 'x'), 1024) << m.size();
  }
}

}  // namespace
}  // namespace ampdist

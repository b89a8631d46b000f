// Which GPU each rank of a node binds (comm/device_binding.h), from the GPUs each rank sees. Two launch styles:
// every rank sees every GPU (mpirun), or each rank sees only its own (srun --gpus-per-task=1: every rank's device 0
// is another GPU). Both must bind one GPU per rank; more ranks than distinct GPUs is refused on every rank unless
// sharing is allowed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/device_binding.h"
#include "runtime/core/error.h"

namespace ampdist {
namespace {

using Lists = std::vector<std::vector<std::string>>;

std::vector<int> assignment(const Lists& visible, bool allow_sharing) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(visible.size()); ++r) out.push_back(choose_device(r, visible, allow_sharing));
  return out;
}

TEST(DeviceBinding, EveryRankSeesEveryGpuAndTakesItsLocalRank) {
  const Lists visible(4, {"A", "B", "C", "D"});
  EXPECT_EQ(assignment(visible, false), (std::vector<int>{0, 1, 2, 3}));
}

TEST(DeviceBinding, GpusPerTaskOneEachRankSeesOnlyItsOwnAndTakesDeviceZero) {
  // srun --gpus-per-task=1 on a node of 4 GPUs: each task sees one GPU, a different one, as device 0.
  const Lists visible = {{"A"}, {"B"}, {"C"}, {"D"}};
  EXPECT_EQ(assignment(visible, false), (std::vector<int>{0, 0, 0, 0}));
  // --gpus-per-task=2: two GPUs each; each rank takes its first.
  EXPECT_EQ(assignment({{"A", "B"}, {"C", "D"}}, false), (std::vector<int>{0, 0}));
}

TEST(DeviceBinding, MoreRanksThanDistinctGpusIsRefusedByEveryRankUnlessSharingIsAllowed) {
  const Lists global(3, {"A", "B"});
  for (int r = 0; r < 3; ++r) {
    try {
      choose_device(r, global, false);
      ADD_FAILURE() << "local rank " << r << " accepted 3 ranks on 2 GPUs";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find("3 ranks on this node but 2 distinct GPUs"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(assignment(global, true), (std::vector<int>{0, 1, 0}));  // local_rank % GPUs, as before
  // Per-task lists that name the same GPU twice are sharing too, not per-task binding.
  EXPECT_THROW(choose_device(0, {{"A"}, {"A"}}, false), Error);
  EXPECT_EQ(assignment({{"A"}, {"A"}}, true), (std::vector<int>{0, 0}));
}

TEST(DeviceBinding, ARankThatSeesNoGpuIsBadInput) {
  try {
    choose_device(1, {{"A"}, {}}, true);
    ADD_FAILURE() << "accepted a rank without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("no CUDA device for the rank with local rank 1"), std::string::npos);
  }
}

TEST(DeviceBinding, OverlappingListsTakeTheFirstGpuNoLowerRankTook) {
  // CUDA_VISIBLE_DEVICES=0,1 on local rank 0 and 1,2 on local rank 1: rank 0 takes A (its device 0), rank 1 takes B
  // (its device 0), which rank 0 did not take.
  EXPECT_EQ(assignment({{"A", "B"}, {"B", "C"}}, false), (std::vector<int>{0, 0}));
  // Rank 0 sees B first: rank 1's B is taken, so rank 1 takes C, its device 1.
  EXPECT_EQ(assignment({{"B", "A"}, {"B", "C"}}, false), (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace ampdist

// The watchdog's timeout line from the other ranks' progress records (comm/watchdog.h): a rank whose heartbeat has
// stopped is named as silent, a live rank behind this one as not arrived, and a live lower rank in the same wait
// prints the line instead of this one. Each case is a death test: the watchdog ends the process with exit code 1.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <unistd.h>

#include "comm/watchdog.h"

namespace ampdist {
namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A progress record as another rank's watchdog writes it: {step, waits begun, heartbeat ms, state}, the state 0
// running, 2 waiting on a collective, 1 timed out.
void write_record(const std::string& dir, int rank, int64_t step, int64_t waits, int64_t heartbeat_ms,
                  int64_t state = 0) {
  std::filesystem::create_directories(dir);
  char name[32];
  std::snprintf(name, sizeof name, "/rank_%05d", rank);
  const int64_t rec[4] = {step, waits, heartbeat_ms, state};
  std::ofstream(dir + name, std::ios::binary).write(reinterpret_cast<const char*>(rec), sizeof rec);
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("ampdist_watchdog_" + name + "_" +
                                                                     std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  return dir;
}

// Arms one wait on `rank` of a world of 3 and waits past the 0.4 s timeout (the silent threshold is then
// min(2 s, 0.4 s / 2) = 0.2 s).
void time_out(const std::string& dir, int rank) {
  Watchdog wd(rank, 0.4);
  wd.set_progress_dir(dir, 3);
  wd.set_step(7);
  wd.arm("bucket 0 all-reduce");
  std::this_thread::sleep_for(std::chrono::seconds(5));
}

TEST(WatchdogDeathTest, NamesRanksWithoutAHeartbeatAsSilent) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = fresh_dir("silent");
  // Ranks 1 and 2 stopped beating 5 s ago in the same wait (1 wait begun): their node is gone.
  write_record(dir, 1, 7, 1, now_ms() - 5000);
  write_record(dir, 2, 7, 1, now_ms() - 5000);
  EXPECT_EXIT(time_out(dir, 0), testing::ExitedWithCode(1),
              "\\[rank 0\\] step 7: bucket 0 all-reduce did not complete within 0.4 s \\(comm.timeout_s\\); ranks 1, 2 "
              "silent for 5\\.[0-9] s \\(process or node gone\\); stopping the job");
  std::filesystem::remove_all(dir);
}

TEST(WatchdogDeathTest, NamesALiveRankBehindAsNotArrived) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = fresh_dir("late");
  // Rank 1 is alive (a heartbeat 10 s ahead stays fresh for the whole test) but has begun no wait yet; rank 2 is
  // gone.
  write_record(dir, 1, 6, 0, now_ms() + 10000);
  write_record(dir, 2, 7, 1, now_ms() - 3000);
  EXPECT_EXIT(time_out(dir, 0), testing::ExitedWithCode(1),
              "; rank 2 silent for 3\\.[0-9] s \\(process or node gone\\); ranks that did not arrive: 1 \\(at step 6\\); "
              "stopping the job");
  std::filesystem::remove_all(dir);
}

TEST(WatchdogDeathTest, LeavesTheLineToALiveLowerRankInThisWaitOrALaterOne) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = fresh_dir("quiet");
  // Rank 0 is alive in the same wait: it prints the line naming rank 2; rank 1 exits without one.
  write_record(dir, 0, 7, 1, now_ms() + 10000);
  write_record(dir, 2, 7, 1, now_ms() - 5000);
  EXPECT_EXIT(time_out(dir, 1), testing::ExitedWithCode(1), "^$");
  // Likewise when rank 0 got one wait further (its part of a ring all-reduce arrived before rank 2 died).
  write_record(dir, 0, 8, 2, now_ms() + 10000);
  EXPECT_EXIT(time_out(dir, 1), testing::ExitedWithCode(1), "^$");
  // And when rank 0 is one wait behind but waiting on that collective (peers that die mid-collective can leave the
  // survivors one collective apart: rank 1 passed step 6's consensus, rank 0 did not): rank 0's own watchdog fires.
  write_record(dir, 0, 6, 0, now_ms() + 10000, 2);
  EXPECT_EXIT(time_out(dir, 1), testing::ExitedWithCode(1), "^$");
  std::filesystem::remove_all(dir);
}

TEST(WatchdogDeathTest, NamesALiveLowerRankBehindThatIsNotWaiting) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = fresh_dir("lower_late");
  // Rank 0 is alive, one wait behind and not in a collective (stuck in its own work): rank 1 prints, naming it.
  write_record(dir, 0, 6, 0, now_ms() + 10000, 0);
  write_record(dir, 2, 7, 1, now_ms() - 5000);
  EXPECT_EXIT(time_out(dir, 1), testing::ExitedWithCode(1),
              "\\[rank 1\\] step 7: .*; rank 2 silent for 5\\.[0-9] s \\(process or node gone\\); ranks that did "
              "not arrive: 0 \\(at step 6\\); stopping the job");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ampdist

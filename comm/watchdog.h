// Watchdog: bounds every wait on a collective by a timeout.
//
// A background thread checks the armed deadline every 100 ms. When a wait outlives it, the watchdog prints one line
// ("ampdist: error: [rank 3] step 120: bucket 2 all-reduce did not complete within 600 s (comm.timeout_s); ranks that
// did not arrive: 1 (at step 119); ...", the last part from the other ranks' progress files when they are set) and ends the
// process with exit code 1; mpirun and srun then stop the other ranks. It does not call into MPI from its thread.
//
// With progress files the same thread also beats a heartbeat (the wall clock, every 100 ms) into this rank's file. A
// rank whose heartbeat is older than min(2 s, timeout_s / 2) when a wait times out is named as silent: "rank(s) 2, 3
// silent for 9.8 s (process or node gone)": its process, or the node under it, is gone, as opposed to a rank that is
// alive but late ("did not arrive"). A rank that sees a lower rank alive and itself waiting on a collective (in any
// wait: ranks can be one collective apart when peers die mid-collective), already timed out, or in the same wait or
// a later one, leaves the line to it and exits with code 1 without repeating it: of the ranks stuck together, only
// the lowest live one prints.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace ampdist {

class Watchdog {
 public:
  Watchdog(int rank, double timeout_s);
  ~Watchdog();

  void set_timeout(double timeout_s);
  void set_step(int64_t step) { step_ = step; }
  // Publishes this rank's progress in <dir>/rank_RRRRR, a 32-byte file mapped into memory (one store per wait, no
  // system call): int64 {step, number of collective waits begun, heartbeat in ms of CLOCK_REALTIME, state: 0 running,
  // 2 waiting on a collective, 1 once this rank's watchdog fired}; and reads the other ranks' files when a wait times out, to name the ranks that did not
  // arrive and those that fell silent. `dir` must be visible to every rank that should be named (one node, or a
  // shared file system). Without it the message names only this rank.
  void set_progress_dir(const std::string& dir, int world_size);
  void set_rank(int rank) { rank_ = rank; }
  // Marks the start and end of one wait. Not reentrant: one collective wait at a time per process.
  void arm(const std::string& what);
  void disarm();

 private:
  void run();
  // The "; rank(s) ... silent ...; ranks that did not arrive: ..." part of the timeout line; `quiet` is set when a
  // lower rank is alive (or already timed out) in this wait or a later one, and prints the line instead.
  std::string missing_ranks(bool& quiet) const;

  std::atomic<int> rank_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int64_t> step_{0};
  int64_t waits_ = 0;                     // collective waits begun by this rank
  volatile int64_t* progress_ = nullptr;  // mapped {step, waits, heartbeat ms, state} of this rank, or null
  std::string progress_dir_;
  int world_size_ = 0;
  std::string what_;
  bool armed_ = false, stop_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::thread thread_;
};

}  // namespace ampdist

// Asynchronous checkpoint saves (checkpoint.async: true): the state is copied into a staging buffer, a background
// thread writes, hashes and fsyncs this rank's shard while training goes on, and the ranks commit with
// save_checkpoint's own protocol (commit_save: the manifest is published only when every rank's shard is durable,
// then `latest`, then pruning) at the first step boundary where every rank's write is done. The file format is the
// blocking save's, so loading, resharding, ZeRO-1 slices and export do not tell them apart.
//
// The staging copy: host state is copied by the background thread itself, before it writes, while the next step's
// forward and backward run (they read the master weights and the optimizer state but do not write them); the step
// waits for that copy at its update (wait_staged(), the training loop's before_update observer), so a step pays for
// the copy only where the copy is slower than a forward and backward. Device state is copied at start() (one
// device -> host copy into page-locked memory, which waits for the compute stream).
//
// Contract (the same on every rank, like every collective): start() at the same save steps, wait_staged() before
// anything writes the state start() was given, poll() at every step boundary while in_flight(), drain() before a
// save that must be on disk (the stop-save, the final save), before the next start() and before the run ends. At
// most one save is in flight per rank; draining one whose write is still running is the only time a step waits for
// the disk (write_done() says whether it will). A crash at any point leaves the previous checkpoint as the newest
// complete one: the new one is only ever a .tmp_step_* directory until commit_save renames it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"

namespace ampdist {

class AsyncCheckpointer {
 public:
  // `dir` as save_checkpoint's; `faults` (may be null) outlives this object.
  AsyncCheckpointer(RankGroup ranks, std::string dir, int keep_last, const FaultConfig* faults);
  // Waits for this rank's background write, if any; never publishes (drain() does, collectively).
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // A checkpoint published by poll() or drain().
  struct Published {
    std::string path;
    int64_t step = 0;
    double seconds = 0;  // from start() to the publish (wall clock, this rank)
    std::vector<std::string> warnings;  // rank 0: damaged checkpoints moved aside (commit_save)
  };

  // Collective, at a save step, with no save in flight (drain() it first; throws Error otherwise): takes the manifest
  // fields and starts the background write of this rank's shard of every buffer of `state` (host tensors, or device
  // tensors: Trainer::checkpoint_state(true)) through the staging buffer (allocated once, reused). Host tensors are
  // copied by the background thread: they must stay alive and unwritten until wait_staged() returns.
  void start(const CheckpointState& state);

  // Waits until the staging copy of the save in flight is done (at once when it is, or none is in flight); from then
  // on the state given to start() may change.
  void wait_staged();
  bool staged() const;

  // Collective, at each step boundary while in_flight(): one all-reduce (MAX) of the ranks' "still writing" flags
  // (8 bytes, host MPI on both backends); when every rank's is, commits and returns what was published. Throws Error (collective, kRuntime) on every
  // rank when a rank's write failed, as save_checkpoint does; the save is then no longer in flight.
  std::optional<Published> poll();

  // Collective: waits for this rank's background write and commits. nullopt when nothing is in flight.
  std::optional<Published> drain();

  bool in_flight() const { return pending_; }
  // This rank's shard of the save in flight is written and synced (the commit may still be due).
  bool write_done() const { return written_.load(); }
  int64_t in_flight_step() const { return target_.step; }
  const std::string& in_flight_path() const { return target_.final_path; }

 private:
  std::optional<Published> commit();

  RankGroup ranks_;
  std::string dir_;
  int keep_last_;
  const FaultConfig* faults_;
  bool pending_ = false;
  SaveTarget target_;
  Manifest meta_;
  std::vector<std::string> names_;
  // This rank's shard of each buffer: host Tensors, or for device state page-locked memory (device::alloc_host)
  // so that the one device -> host copy per save is a DMA, viewed by Tensors.
  std::vector<Tensor> staging_;
  std::vector<void*> pinned_;
  size_t pinned_bytes_ = 0;  // of each pinned_ block
  ShardWrite result_;
  mutable std::mutex staged_mu_;
  std::condition_variable staged_cv_;
  bool staged_ = true;  // the staging copy of the save in flight is done (guarded by staged_mu_)
  std::atomic<bool> written_{false};
  std::thread writer_;
  double started_ = 0;  // steady clock seconds at start()
};

}  // namespace ampdist

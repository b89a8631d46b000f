// Sharded checkpoints (format in proto/ampdist/checkpoint.proto): atomic, hash-verified, any world size.
//
// Save (collective): every rank writes its contiguous 1/W slice of every flat FP32 state buffer into
// <dir>/.tmp_step_XXXXXXXX/shard_RRRRR_of_WWWWW.pb and fsyncs it; rank 0 gathers every shard's size, record count and
// XXH3, writes manifest.pb last, fsyncs, renames the directory to step_XXXXXXXX (atomic on POSIX), then replaces
// `latest` atomically, and only then prunes checkpoints beyond keep_last. A crash at any point leaves either the
// previous checkpoints untouched plus a .tmp directory that is never chosen, or the new checkpoint complete.
//
// Load (collective): every rank reads the manifest and every shard, checks sizes, file hashes, record hashes, the
// run id and that the checkpoint's tensors match this model and optimizer, and agrees with the other ranks, before
// it writes any state; then it fills the full buffers (every rank holds full replicas), whatever the world size at
// save. A problem is an ampdist::Error of kind kBadInput naming the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ampdist/checkpoint.pb.h"
#include "comm/communicator.h"
#include "runtime/core/tensor.h"

namespace ampdist {

// Records hold at most this much payload (64 MiB), so no single protobuf message approaches its 2 GiB limit.
constexpr int64_t kMaxRecordBytes = int64_t{64} << 20;

// What a checkpoint holds, as views of the trainer's state. Buffers are [numel] FP32, full on every rank.
struct CheckpointState {
  Manifest meta;  // scalar fields (step, scaler, optimizer, tensors, config, ...); shards and buffers filled by save
  std::vector<std::pair<std::string, Tensor*>> buffers;  // "master" first, then the optimizer's moments
};

// "step_00001200"
std::string checkpoint_name(int64_t step);

// Collective. Writes the checkpoint of state.meta.step() under `dir` and returns its path. Throws Error (kRuntime) on
// every rank when any rank failed to write; the partial directory is removed and the previous checkpoints stay as
// they were. faults: fault injection for tests (fault.crash_during_save: the named rank truncates its shard halfway
// and kills itself; fault.save_error: the named rank's write fails with ENOSPC or EIO).
std::string save_checkpoint(Communicator& comm, const CheckpointState& state, const std::string& dir, int keep_last,
                            const FaultConfig* faults = nullptr);

// Reads and verifies <path>/manifest.pb (no shards). Throws Error (kBadInput) naming the file.
Manifest read_manifest(const std::string& path);

// Collective. Verifies the checkpoint at `path` against `into` (same tensors and buffers) and then copies every
// buffer into `into.buffers`. Returns the manifest. Throws Error (kBadInput) on every rank, before touching any
// state, when any rank found a problem.
Manifest load_checkpoint(Communicator& comm, const std::string& path, CheckpointState& into);

// Every problem of the checkpoint at `path` (manifest, sizes, hashes, records, coverage), one line each; empty when
// it is whole. Reads everything; no communication.
std::vector<std::string> verify_checkpoint(const std::string& path);

// The newest complete checkpoint under `dir`: the one `latest` names when it verifies, else the highest-step
// step_* directory whose manifest verifies. Partial (.tmp_*) directories are never returned.
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

// Reads one whole flat buffer (e.g. "master") of a verified checkpoint into host memory, for tools.
std::vector<float> read_checkpoint_buffer(const std::string& path, const std::string& buffer);

}  // namespace ampdist

// Sharded checkpoints (format in proto/ampdist/checkpoint.proto): atomic, hash-verified, any world size.
//
// Save (collective): every rank writes its contiguous 1/W slice of every flat FP32 state buffer into
// <dir>/.tmp_step_XXXXXXXX/shard_RRRRR_of_WWWWW.pb and fsyncs it; rank 0 gathers every shard's size, record count and
// XXH3, writes manifest.pb last, fsyncs, renames the directory to step_XXXXXXXX (atomic on POSIX), then replaces
// `latest` atomically, and only then prunes checkpoints beyond keep_last. A crash at any point leaves either the
// previous checkpoints untouched plus a .tmp directory that is never chosen, or the new checkpoint complete.
//
// Load (collective): every rank reads the manifest and only the records of the shards that overlap the slice it
// needs (its slice of the new world; ShardFileInfo.record_bytes locates them), checks each record's XXH3, run id,
// buffer and range, and that the checkpoint's tensors match this model and optimizer, and agrees with the other ranks
// before it writes any state. A replicated state (every buffer whole on every rank) is then completed by an
// all-gather; a sharded one (optimizer.zero_stage 1) keeps its slice. Any world size at save, any at load. A problem
// is an ampdist::Error of kind kBadInput naming the file. verify_checkpoint still reads and checks everything.
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

// What a checkpoint holds, as views of the trainer's state (host FP32 tensors, all of one length).
struct CheckpointState {
  Manifest meta;  // scalar fields (step, scaler, optimizer, tensors, config, ...); shards and buffers filled by save
  std::vector<std::pair<std::string, Tensor*>> buffers;  // "master" first, then the optimizer's moments
  // The flat buffers' length, and where in them the tensors above start: numel < 0 means the tensors are the whole
  // buffers (replicated state, begin 0); with sharded state each rank's tensors are its slice [begin, begin + length),
  // which must contain the rank's checkpoint shard (shard_counts(numel, world)[rank]).
  int64_t numel = -1;
  int64_t begin = 0;
  int64_t record_elements = 0;  // save: elements per record (0: kMaxRecordBytes / 4); smaller only in tests
};

// What a load read, on this rank.
struct LoadStats {
  int64_t bytes_read = 0;  // bytes of shard files read
  int64_t records = 0;     // records read and checked
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
Manifest load_checkpoint(Communicator& comm, const std::string& path, CheckpointState& into,
                         LoadStats* stats = nullptr);

// Every problem of the checkpoint at `path` (manifest, sizes, hashes, records, coverage), one line each; empty when
// it is whole. Reads everything; no communication.
std::vector<std::string> verify_checkpoint(const std::string& path);

// The newest complete checkpoint under `dir`: the one `latest` names when it verifies, else the highest-step
// step_* directory whose manifest verifies. Partial (.tmp_*) directories are never returned.
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

// The checkpoints under `dir` a resume may try, newest first (`latest` first when it names one): those whose manifest
// verifies and whose shard files exist with the sizes it lists. Reads manifests only, so every rank can call it; a
// load then checks every byte it reads (and fails alike on every rank, so the caller can try the next).
std::vector<std::string> resume_candidates(const std::string& dir);

// Reads one whole flat buffer (e.g. "master") of a verified checkpoint into host memory, for tools.
std::vector<float> read_checkpoint_buffer(const std::string& path, const std::string& buffer);

}  // namespace ampdist

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
#include "runtime/core/tensor.h"
#include "runtime/dist/rank_group.h"

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
// Whether shard files are written and read with O_DIRECT where the file system takes it: false when the environment
// sets AMPDIST_CKPT_DIRECT_IO to 0, false, off or no (runtime/checkpoint/direct_io.h says why and how). Throws
// BadInput naming the variable for any other value than those and 1, true, on, yes.
bool checkpoint_direct_io();

// Collective. Writes the checkpoint of state.meta.step() under `dir` and returns its path. Throws Error (kRuntime) on
// every rank when any rank failed to write; the partial directory is removed and the previous checkpoints stay as
// they were. faults: fault injection for tests (fault.crash_during_save: the named rank truncates its shard halfway
// and kills itself; fault.save_error: the named rank's write fails with ENOSPC or EIO; fault.slow_save: the named
// rank pauses halfway through its shard). A damaged checkpoint is never written over or pruned: one in the way
// (same step, or beyond keep_last) that is not whole (whole_checkpoint_problem) is moved aside
// (move_aside_damaged), and rank 0 appends a line saying so to `warnings`.
std::string save_checkpoint(RankGroup ranks, const CheckpointState& state, const std::string& dir, int keep_last,
                            const FaultConfig* faults = nullptr, std::vector<std::string>* warnings = nullptr);

// The three phases of save_checkpoint, also run apart by the asynchronous writer (async_checkpoint.h):
// prepare_save (collective: rank 0 makes <dir>/.tmp_step_XXXXXXXX), write_own_shard (local, any thread: this rank's
// shard of `state`, written, hashed and fsynced) and commit_save (collective: gathers every rank's result; rank 0
// writes the manifest, renames, replaces `latest` and prunes; throws the same errors as save_checkpoint).
struct SaveTarget {
  std::string dir, name, tmp, final_path;
  int64_t step = 0;
  int64_t numel = 0;         // elements of each flat buffer
  int64_t per_record = 0;    // elements per record
  int64_t begin = 0, count = 0;  // this rank's shard of the flat buffers
  int64_t most_records = 0;  // records of the largest shard (every rank's gather count)
  size_t buffers = 0;
  std::string prepare_error;  // rank 0: the temporary directory could not be made
};
struct ShardWrite {
  int64_t bytes = 0, records = 0;
  uint64_t xxh3 = 0;
  std::vector<int64_t> record_bytes;
  int err = 0;        // errno of a failed write, 0 when written
  std::string error;  // what failed, "" when written
};
SaveTarget prepare_save(RankGroup ranks, const CheckpointState& state, const std::string& dir);
// `state` holds at least this rank's shard [t.begin, t.begin + t.count) of every buffer (state.begin says where its
// tensors start). Never throws: a failure is in the result.
ShardWrite write_own_shard(const SaveTarget& t, const CheckpointState& state, int rank, int world,
                           const FaultConfig* faults);
std::string commit_save(RankGroup ranks, const SaveTarget& t, const Manifest& meta,
                        const std::vector<std::string>& buffer_names, const ShardWrite& mine, int keep_last,
                        std::vector<std::string>* warnings);

// Reads and verifies <path>/manifest.pb (no shards). Throws Error (kBadInput) naming the file.
Manifest read_manifest(const std::string& path);

// Collective. Verifies the checkpoint at `path` against `into` (same tensors and buffers) and then copies every
// buffer into `into.buffers`. Returns the manifest. Throws Error (kBadInput) on every rank, before touching any
// state, when any rank found a problem.
Manifest load_checkpoint(RankGroup ranks, const std::string& path, CheckpointState& into,
                         LoadStats* stats = nullptr);

// Every problem of the checkpoint at `path` (manifest, sizes, hashes, records, coverage), one line each; empty when
// it is whole. Reads everything; no communication.
std::vector<std::string> verify_checkpoint(const std::string& path);

// The newest complete checkpoint under `dir`: the one `latest` names when it verifies, else the highest-step
// step_* directory whose manifest verifies. Partial (.tmp_*) directories are never returned.
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

// "" when the checkpoint at `path` is whole as far as a cheap look can tell (its manifest verifies and every shard
// file it lists exists with the listed size), else what is wrong, naming the file. Reads the manifest only.
std::string whole_checkpoint_problem(const std::string& path);

// The step_* checkpoints under `dir`, newest first (`latest` first when it names one): `candidates` are those a
// resume may try (whole_checkpoint_problem empty), `damaged` the others with what is wrong. Reads manifests only, so
// every rank can call it; a load then checks every byte it reads (and fails alike on every rank, so the caller can
// try the next).
struct ResumeScan {
  std::vector<std::string> candidates;
  std::vector<std::pair<std::string, std::string>> damaged;  // (path, problem)
};
ResumeScan scan_for_resume(const std::string& dir);

// A damaged checkpoint is evidence, kept for repair: renames the directory `path` to `path.damaged` (`.damaged.2`,
// ... when that exists; never onto an existing name), fsyncs the parent and returns the new path. Its step_* name
// is gone, so no resume, save or pruning sees it again; `ampdist ckpt verify DIR` still lists it. Throws Error
// (kRuntime) when the rename fails.
std::string move_aside_damaged(const std::string& path);

// True for a directory name move_aside_damaged gives: step_XXXXXXXX.damaged or step_XXXXXXXX.damaged.N.
bool is_moved_aside(const std::string& dirname);

// Reads one whole flat buffer (e.g. "master") of a verified checkpoint into host memory, for tools.
std::vector<float> read_checkpoint_buffer(const std::string& path, const std::string& buffer);

}  // namespace ampdist

// Saving a checkpoint: prepare_save, write_own_shard and commit_save (checkpoint.h), and the blocking
// save_checkpoint built from them.
#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>  // renameat2
#include <cstring>
#include <filesystem>
#include <thread>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/direct_io.h"
#include "runtime/checkpoint/shard_format.h"
#include "runtime/core/error.h"
#include "runtime/core/flat_layout.h"  // shard_counts

namespace ampdist {

using namespace ckpt;
namespace fs = std::filesystem;
namespace pbio = google::protobuf::io;

namespace {

// One shard: records of the slice [begin, begin + count) of every buffer, in buffer order.
struct ShardResult {
  int64_t bytes = 0, records = 0;
  uint64_t xxh3 = 0;
  std::vector<int64_t> record_bytes;  // each record's bytes, varint length prefix included, in file order
};

// crash: truncate the shard halfway and SIGKILL this process; fail_errno != 0: fail the first write with it;
// pause_s > 0: sleep that long with every record written and before the fsync (a slow disk).
// The state's tensors hold elements [state.begin, ...) of the flat buffers.
ShardResult write_shard(const std::string& path, const CheckpointState& state, int64_t begin, int64_t count,
                        int64_t per_record, bool crash, int fail_errno, double pause_s) {
  ShardFileWriter file(path);  // O_DIRECT where the file system takes it (direct_io.h)
  if (fail_errno != 0) {  // a disk that refuses the first write
    errno = fail_errno;
    throw Error(path + ": write failed: " + errno_text());
  }
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  ShardResult r;
  std::string head, trailer;
  try {
    for (const auto& [name, tensor] : state.buffers) {
      const float* data = tensor->data_as<float>() - state.begin;  // indexed by flat element
      for (const auto& [off, n] : record_ranges(begin, count, per_record)) {
        // The bytes are exactly ShardRecord{run_id, buffer, offset, count, data, xxh3} serialised length-delimited
        // (proto2 writes set fields in field-number order), but the payload goes from the state to the file's
        // blocks without an intermediate copy: its XXH3 first, then the header, then the payload chunk by chunk,
        // each chunk added to the file's XXH3 while it is in cache and copied from there, then the xxh3 field.
        const char* payload = reinterpret_cast<const char*>(data + off);
        const size_t payload_bytes = static_cast<size_t>(n) * sizeof(float);
        const uint64_t record_xxh3 = XXH3_64bits(payload, payload_bytes);
        ShardRecord fields;
        fields.set_run_id(state.meta.run_id());
        fields.set_buffer(name);
        fields.set_offset(off);
        fields.set_count(n);
        const std::string before_data = fields.SerializeAsString();
        trailer.clear();
        trailer.push_back(static_cast<char>(ShardRecord::kXxh3FieldNumber << 3 | 0));  // varint
        append_varint(trailer, record_xxh3);
        const size_t record_bytes =
            before_data.size() + 1 + pbio::CodedOutputStream::VarintSize64(payload_bytes) + payload_bytes + trailer.size();
        head.clear();
        append_varint(head, record_bytes);
        head += before_data;
        head.push_back(static_cast<char>(ShardRecord::kDataFieldNumber << 3 | 2));  // length-delimited
        append_varint(head, payload_bytes);
        file.append(head.data(), head.size());
        XXH3_64bits_update(h, head.data(), head.size());
        constexpr size_t kChunk = size_t{1} << 20;
        for (size_t at = 0; at < payload_bytes; at += kChunk) {
          const size_t len = std::min(kChunk, payload_bytes - at);
          XXH3_64bits_update(h, payload + at, len);
          file.append(payload + at, len);
        }
        file.append(trailer.data(), trailer.size());
        XXH3_64bits_update(h, trailer.data(), trailer.size());
        const int64_t total = static_cast<int64_t>(head.size() + payload_bytes + trailer.size());
        r.bytes += total;
        r.record_bytes.push_back(total);
        ++r.records;
      }
    }
    file.flush();
    if (crash) {
      // Fault injection: die with the shard half written, as a killed rank would leave it.
      if (::ftruncate(file.fd(), r.bytes / 2) != 0) throw Error(path + ": truncate failed");
      ::fsync(file.fd());
      std::raise(SIGKILL);
    }
    if (pause_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause_s));
    file.finish();
  } catch (...) {
    XXH3_freeState(h);
    throw;
  }
  r.xxh3 = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return r;
}

}  // namespace

bool checkpoint_direct_io() { return direct_io_enabled(); }

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

SaveTarget prepare_save(RankGroup ranks, const CheckpointState& state, const std::string& dir) {
  const int rank = ranks.rank(), world = ranks.world_size();
  SaveTarget t;
  t.dir = dir;
  t.step = state.meta.step();
  t.name = checkpoint_name(t.step);
  t.tmp = (fs::path(dir) / (".tmp_" + t.name)).string();
  t.final_path = (fs::path(dir) / t.name).string();
  t.numel = state.numel >= 0 ? state.numel : state.buffers.empty() ? 0 : state.buffers.front().second->numel();
  t.per_record = state.record_elements > 0 ? state.record_elements : default_record_elements();
  t.buffers = state.buffers.size();
  const std::vector<int64_t> counts = shard_counts(t.numel, world);
  for (int r = 0; r < rank; ++r) t.begin += counts[r];
  t.count = counts[rank];
  t.most_records = static_cast<int64_t>(state.buffers.size()) *
                   static_cast<int64_t>(record_ranges(0, counts.empty() ? 0 : counts[0], t.per_record).size());
  for (const auto& b : state.buffers)
    AMPDIST_CHECK(t.begin >= state.begin && t.begin + t.count <= state.begin + b.second->numel(),
                  "the state of rank " + std::to_string(rank) + " does not hold its checkpoint shard");
  // Rank 0 clears a stale temporary directory of an earlier, interrupted save of the same step.
  if (rank == 0) {
    try {
      fs::create_directories(dir);
      fs::remove_all(t.tmp);
      fs::create_directories(t.tmp);
    } catch (const std::exception& e) {
      t.prepare_error = "cannot prepare " + t.tmp + ": " + e.what();
    }
  }
  ranks.barrier("checkpoint directory barrier");
  return t;
}

ShardWrite write_own_shard(const SaveTarget& t, const CheckpointState& state, int rank, int world,
                           const FaultConfig* faults) {
  ShardWrite w;
  if (!t.prepare_error.empty()) {
    w.error = t.prepare_error;
    w.err = EIO;
    return w;
  }
  try {
    const bool die = faults && faults->has_crash_during_save() && faults->crash_during_save().step() == t.step &&
                     faults->crash_during_save().rank() == rank;
    const bool fail = faults && faults->has_save_error() && faults->save_error().step() == t.step &&
                      faults->save_error().rank() == rank;
    const bool slow = faults && faults->has_slow_save() && faults->slow_save().step() == t.step &&
                      faults->slow_save().rank() == rank && !faults->slow_save().before_staging_copy();
    const ShardResult r = write_shard((fs::path(t.tmp) / shard_name(rank, world)).string(), state, t.begin, t.count,
                                      t.per_record, die, fail ? (faults->save_error().disk_full() ? ENOSPC : EIO) : 0,
                                      slow ? faults->slow_save().seconds() : 0.0);
    w.bytes = r.bytes;
    w.records = r.records;
    w.xxh3 = r.xxh3;
    w.record_bytes = r.record_bytes;
  } catch (const std::exception& e) {
    w.error = e.what();
    w.err = errno ? errno : EIO;
  }
  return w;
}

namespace {

// Every rank's shard as the manifest lists it: size, record count, XXH3 and each record's length.
struct GatheredShards {
  std::vector<uint64_t> bytes, records, hashes;
  std::vector<std::vector<int64_t>> record_bytes;
};

// Collective. Everyone learns whether every shard is on disk, and which rank failed with what, before anything is
// published: throws the one collective Error of a failed save (the temporary directory removed by rank 0) on every
// rank, else returns every rank's shard.
GatheredShards gather_shards(RankGroup ranks, const SaveTarget& t, const ShardWrite& mine) {
  const int world = ranks.world_size();
  const std::vector<uint64_t> errnos =
      ranks.gather(mine.error.empty() ? 0 : (mine.err ? mine.err : EIO), "checkpoint status gather");
  int64_t failed = 0;
  std::string who;
  for (int r = 0; r < world; ++r) {
    if (errnos[r] == 0) continue;
    ++failed;
    if (who.empty())
      who = "rank " + std::to_string(r) + " could not write its shard (" +
            (fs::path(t.tmp).filename() / shard_name(r, world)).string() +
            "): " + std::strerror(static_cast<int>(errnos[r]));
  }
  GatheredShards g;
  g.bytes = ranks.gather(static_cast<uint64_t>(mine.bytes), "checkpoint shard sizes");
  g.records = ranks.gather(static_cast<uint64_t>(mine.records), "checkpoint shard records");
  g.hashes = ranks.gather(mine.xxh3, "checkpoint shard hashes");
  if (failed > 0) {
    // Nothing of this save is kept (it may be what filled the disk); nothing older was touched.
    if (ranks.rank() == 0) {
      std::error_code ec;
      fs::remove_all(t.tmp, ec);
    }
    throw Error("checkpoint " + t.final_path + " not saved: " + (who.empty() ? mine.error : who) +
                (failed > 1 ? " (and " + std::to_string(failed - 1) + " more)" : ""))
        .set_collective();
  }
  // Every record's length, for readers that seek: the same number of gathers on every rank (the most records any
  // rank writes, which every rank can compute), each rank giving 0 past its own.
  g.record_bytes.resize(static_cast<size_t>(world));
  for (int64_t k = 0; k < t.most_records; ++k) {
    const int64_t len = k < std::ssize(mine.record_bytes) ? mine.record_bytes[k] : 0;
    const std::vector<uint64_t> all = ranks.gather(static_cast<uint64_t>(len), "checkpoint record sizes");
    for (int r = 0; r < world; ++r)
      if (all[r] > 0) g.record_bytes[r].push_back(static_cast<int64_t>(all[r]));
  }
  return g;
}

// The manifest of the save: the caller's fields, then the format, the buffers and every rank's shard.
Manifest final_manifest(const Manifest& meta, const SaveTarget& t, const std::vector<std::string>& buffer_names,
                        const GatheredShards& g) {
  const int world = static_cast<int>(g.bytes.size());
  Manifest m = meta;
  m.set_format_version(kFormatVersion);
  m.set_world_size(world);
  m.set_numel(t.numel);
  m.set_record_elements(t.per_record);
  m.clear_buffers();
  for (const std::string& b : buffer_names) m.add_buffers(b);
  m.clear_shards();
  for (int r = 0; r < world; ++r) {
    ShardFileInfo* s = m.add_shards();
    s->set_rank(r);
    s->set_file(shard_name(r, world));
    s->set_bytes(static_cast<int64_t>(g.bytes[r]));
    s->set_records(static_cast<int64_t>(g.records[r]));
    s->set_xxh3(g.hashes[r]);
    for (int64_t b : g.record_bytes[r]) s->add_record_bytes(b);
  }
  return m;
}

// Removes the checkpoint at `path` when it is whole; a damaged one is evidence and is moved aside instead, with a
// line in `warnings` ("<path> <tense> damaged (<problem>): moved aside to <new path><instead>").
void remove_whole_or_move_aside(const std::string& path, const char* tense, const char* instead,
                                std::vector<std::string>* warnings) {
  const std::string problem = whole_checkpoint_problem(path);
  if (problem.empty()) {
    fs::remove_all(path);
    return;
  }
  const std::string aside = move_aside_damaged(path);
  if (warnings)
    warnings->push_back(path + " " + tense + " damaged (" + problem + "): moved aside to " + aside + instead);
}

// Rank 0: writes the manifest last, renames the temporary directory to its step name, replaces `latest`, then
// prunes beyond keep_last; each step made durable (fsync) before the next.
void publish_checkpoint(const SaveTarget& t, const Manifest& m, int keep_last, std::vector<std::string>* warnings) {
  ManifestFile mf;
  mf.set_manifest(m.SerializeAsString());
  mf.set_xxh3(XXH3_64bits(mf.manifest().data(), mf.manifest().size()));
  write_file_durably((fs::path(t.tmp) / "manifest.pb").string(), mf.SerializeAsString());
  fsync_path(t.tmp);
  // A re-save of the same step replaces a whole checkpoint.
  if (fs::exists(t.final_path)) remove_whole_or_move_aside(t.final_path, "was", ", not written over", warnings);
  fs::rename(t.tmp, t.final_path);
  fsync_path(t.dir);
  const std::string latest_tmp = (fs::path(t.dir) / ".latest.tmp").string();
  write_file_durably(latest_tmp, t.name + "\n");
  fs::rename(latest_tmp, fs::path(t.dir) / "latest");
  fsync_path(t.dir);
  if (keep_last <= 0) return;
  // Pruning removes whole checkpoints only (manifest and shard sizes checked, not every byte).
  const auto all = complete_checkpoints(t.dir);
  for (size_t i = 0; i + keep_last < all.size(); ++i)
    remove_whole_or_move_aside(all[i].second, "is", " instead of pruned", warnings);
}

}  // namespace

std::string commit_save(RankGroup ranks, const SaveTarget& t, const Manifest& meta,
                        const std::vector<std::string>& buffer_names, const ShardWrite& mine, int keep_last,
                        std::vector<std::string>* warnings) {
  const GatheredShards shards = gather_shards(ranks, t, mine);
  std::string error;
  if (ranks.rank() == 0) {
    try {
      publish_checkpoint(t, final_manifest(meta, t, buffer_names, shards), keep_last, warnings);
    } catch (const std::exception& e) {
      error = "publishing checkpoint " + t.final_path + " failed: " + e.what();
    }
  }
  // Rank 0 holds the reason, and rank 0 reports a collective error.
  if (ranks.sum(error.empty() ? 0 : 1, "checkpoint publish all-reduce") > 0)
    throw Error(!error.empty() ? error : "checkpoint " + t.final_path + " not published").set_collective();
  return t.final_path;
}

std::string save_checkpoint(RankGroup ranks, const CheckpointState& state, const std::string& dir, int keep_last,
                            const FaultConfig* faults, std::vector<std::string>* warnings) {
  const SaveTarget t = prepare_save(ranks, state, dir);
  const ShardWrite mine = write_own_shard(t, state, ranks.rank(), ranks.world_size(), faults);
  std::vector<std::string> names;
  for (const auto& b : state.buffers) names.push_back(b.first);
  return commit_save(ranks, t, state.meta, names, mine, keep_last, warnings);
}

}  // namespace ampdist

// Loading and verifying a checkpoint: read_manifest, verify_checkpoint, load_checkpoint (any world size onto any
// other: each rank reads only the records that overlap its slice) and read_checkpoint_buffer (checkpoint.h).
#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <span>

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

// Reads every shard of a checkpoint, checking it against the manifest; when `buffers` is non-null, sizes each of
// its entries (name -> full buffer) to numel and fills it. Problems are collected, not thrown.
void read_shards(const std::string& path, const Manifest& m, std::map<std::string, std::vector<float>>* buffers,
                 Problems& p) {
  const int world = m.world_size();
  // Rank r's slice length, as shard_counts(numel, world)[r], computed per rank: world comes from the file, and a
  // vector of `world` counts would allocate whatever the file says.
  const int64_t slices = std::max(world, 1), numel = m.numel();
  auto slice_count = [&](int r) -> int64_t { return numel / slices + (r < numel % slices ? 1 : 0); };
  std::map<std::string, int64_t> covered;
  if (m.shards_size() != world)
    p.add((fs::path(path) / "manifest.pb").string() + ": lists " + std::to_string(m.shards_size()) +
          " shards for a world of " + std::to_string(world));
  // A manifest copied from another run fails the size and hash checks of shards it never described: when every
  // shard there is starts with one run id, and not the manifest's, say what is wrong (the manifest), in one line.
  std::set<std::string> shard_ids;
  bool all_parse = true;
  for (const ShardFileInfo& info : m.shards()) {
    const std::string file = (fs::path(path) / info.file()).string();
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) continue;
    const std::optional<std::string> id = shard_run_id(file);
    if (id) shard_ids.insert(*id);
    all_parse = all_parse && id.has_value();
  }
  if (all_parse && shard_ids.size() == 1 && *shard_ids.begin() != m.run_id()) {
    p.add((fs::path(path) / "manifest.pb").string() + ": belongs to run " + m.run_id() + ", the shards to run " +
          *shard_ids.begin() + " (a manifest from another run?)");
    return;
  }
  // The buffers take numel floats each: they are allocated only when the shard files (distinct, of the sizes the
  // manifest says) hold that much, so that a corrupt numel costs no more memory than the files do.
  bool copy = buffers != nullptr;
  if (buffers) {
    std::set<std::string> files;
    int64_t held = 0;
    bool sizes_ok = true;
    for (const ShardFileInfo& info : m.shards()) {
      std::error_code ec;
      const fs::path file = fs::path(path) / info.file();
      if (!fs::is_regular_file(file, ec) || static_cast<int64_t>(fs::file_size(file, ec)) != info.bytes()) {
        sizes_ok = false;  // the loop below names the file
        continue;
      }
      if (files.insert(info.file()).second) held += info.bytes();
    }
    if (numel > held / static_cast<int64_t>(sizeof(float)) / std::max<int64_t>(1, std::ssize(*buffers))) {
      copy = false;
      if (sizes_ok) {
        p.add((fs::path(path) / "manifest.pb").string() + ": numel " + std::to_string(numel) + " in " +
              std::to_string(buffers->size()) + " buffer(s) is more than the shard files hold (" +
              std::to_string(held) + " bytes)");
        return;
      }
    } else {
      for (auto& [name, buffer] : *buffers) buffer.assign(static_cast<size_t>(numel), 0.0f);
    }
  }
  int64_t begin = 0;
  for (int r = 0; r < m.shards_size(); ++r) {
    const ShardFileInfo& info = m.shards(r);
    const std::string file = (fs::path(path) / info.file()).string();
    const int64_t slice_begin = begin, slice_end = begin + (r < world ? slice_count(r) : 0);
    begin = slice_end;
    if (!shard_file_ok(file, info, p)) continue;
    // The shard streams through once (direct_io.h, as a load reads it): each piece goes into the file's XXH3 and onto
    // the bytes not yet parsed, and every record complete there is parsed from its own bounded range (a shard may
    // exceed the 2 GiB a single protobuf input stream can address, a record, <= 64 MiB of payload, never does). So
    // memory holds one record and one block, not the shard. The file's XXH3 is checked at the end, and a mismatch is
    // the one problem reported for the file (what the records showed is then moot).
    ShardFileReader stream(file, {{0, info.bytes()}});
    if (!stream.ok()) {
      p.add(file + ": cannot be read: " + stream.error());
      continue;
    }
    XXH3_state_t* file_hash = XXH3_createState();
    XXH3_64bits_reset(file_hash);
    std::string pending;  // bytes read and not yet parsed, from `at` on
    size_t at = 0;
    int64_t records = 0, parsed_bytes = 0;
    bool bad = false;
    Problems found;  // this file's record problems, reported only when its XXH3 matches
    auto parse_complete_records = [&](bool at_end) {
      while (!bad && at < pending.size()) {
        const size_t avail = pending.size() - at;
        const auto* head = reinterpret_cast<const uint8_t*>(pending.data()) + at;
        pbio::CodedInputStream header(head, static_cast<int>(std::min<size_t>(avail, 10)));
        uint32_t len = 0;
        const bool has_len = header.ReadVarint32(&len);
        if (!has_len && avail < 10 && !at_end) break;  // the length prefix continues in the next piece
        const size_t prefix = static_cast<size_t>(header.CurrentPosition());
        const int64_t left_in_file = info.bytes() - parsed_bytes - static_cast<int64_t>(prefix);
        if (!has_len || static_cast<int64_t>(len) > left_in_file || len > static_cast<uint32_t>(INT32_MAX)) {
          found.add(file + ": record " + std::to_string(records) + " does not parse");
          bad = true;
          break;
        }
        if (avail - prefix < len) {
          if (at_end) {
            found.add(file + ": record " + std::to_string(records) + " does not parse");
            bad = true;
          }
          break;  // the record continues in the next piece
        }
        ShardRecord rec;
        if (!rec.ParseFromArray(pending.data() + at + prefix, static_cast<int>(len))) {
          found.add(file + ": record " + std::to_string(records) + " does not parse");
          bad = true;
          break;
        }
        at += prefix + len;
        parsed_bytes += static_cast<int64_t>(prefix + len);
        ++records;
        if (rec.run_id() != m.run_id()) {
          found.add(file + ": belongs to run " + rec.run_id() + ", the manifest to run " + m.run_id() +
                    " (a manifest from another run?)");
          bad = true;
        } else if (rec.data().size() % sizeof(float) != 0 ||
                   rec.count() != static_cast<int64_t>(rec.data().size() / sizeof(float)) ||
                   XXH3_64bits(rec.data().data(), rec.data().size()) != rec.xxh3()) {
          found.add(file + ": record " + std::to_string(records - 1) + " (" + rec.buffer() + ") fails its XXH3 check");
          bad = true;
        } else if (rec.offset() < slice_begin || rec.offset() > slice_end - rec.count()) {
          found.add(file + ": record " + std::to_string(records - 1) + " lies outside rank " + std::to_string(r) +
                    "'s slice");
          bad = true;
        } else {
          covered[rec.buffer()] += rec.count();
          if (copy) {
            auto it = buffers->find(rec.buffer());
            if (it != buffers->end())
              std::memcpy(it->second.data() + rec.offset(), rec.data().data(), rec.data().size());
          }
        }
      }
      if (at > 0 && (at == pending.size() || at >= (size_t{16} << 20))) {  // drop what is parsed
        pending.erase(0, at);
        at = 0;
      }
    };
    const bool read_ok = stream.consume(0, info.bytes(), [&](const char* bytes, size_t n) {
      XXH3_64bits_update(file_hash, bytes, n);
      if (bad) return;
      pending.append(bytes, n);
      parse_complete_records(false);
    });
    if (read_ok) parse_complete_records(true);
    const bool hash_ok = read_ok && XXH3_64bits_digest(file_hash) == info.xxh3();
    XXH3_freeState(file_hash);
    if (!read_ok) {
      p.add(file + ": cannot be read whole (" + std::to_string(info.bytes()) + " bytes)");
      continue;
    }
    if (!hash_ok) {
      p.add(file + ": XXH3 of the file does not match the manifest (corrupted)");
      continue;
    }
    for (const std::string& line : found.lines) p.add(line);
    if (!bad && records != info.records())
      p.add(file + ": " + std::to_string(records) + " records, the manifest says " + std::to_string(info.records()));
  }
  if (buffers && !copy && p.lines.empty())  // not expected: a shard whose size was off is named above
    p.add((fs::path(path) / "manifest.pb").string() + ": numel " + std::to_string(numel) +
          " is more than the shard files hold");
  for (const std::string& b : m.buffers())
    if (p.lines.empty() && covered[b] != m.numel())
      p.add(path + ": buffer " + b + " covers " + std::to_string(covered[b]) + " of " + std::to_string(m.numel()) +
            " elements");
}

// The differences between a checkpoint and the state it would be loaded into.
void check_compatible(const std::string& path, const Manifest& m, const CheckpointState& into, Problems& p) {
  const Manifest& cur = into.meta;
  if (m.tensors_size() != cur.tensors_size()) {
    p.add(path + ": checkpoint of another model: " + std::to_string(m.tensors_size()) + " tensors, this model has " +
          std::to_string(cur.tensors_size()));
    return;
  }
  for (int i = 0; i < m.tensors_size(); ++i) {
    const TensorIndexEntry &a = m.tensors(i), &b = cur.tensors(i);
    std::vector<int64_t> sa(a.shape().begin(), a.shape().end()), sb(b.shape().begin(), b.shape().end());
    if (a.name() != b.name() || sa != sb || a.offset() != b.offset()) {
      p.add(path + ": checkpoint of another model: tensor " + std::to_string(i) + " is " + a.name() + " " +
            shape_str(sa) + ", this model has " + b.name() + " " + shape_str(sb));
      return;
    }
  }
  if (m.optimizer() != cur.optimizer())
    p.add(path + ": saved with optimizer " + m.optimizer() + ", this run uses " + cur.optimizer());
  std::vector<std::string> mb(m.buffers().begin(), m.buffers().end());
  std::vector<std::string> cb;
  for (const auto& b : into.buffers) cb.push_back(b.first);
  if (p.lines.empty() && mb != cb) p.add(path + ": state buffers differ from this run's optimizer state");
  // The buffers are copied into this run's: numel must be theirs, whatever the tensor index says.
  for (const auto& [name, tensor] : into.buffers) {
    const int64_t mine = into.numel >= 0 ? into.numel : tensor->numel();
    if (p.lines.empty() && mine != m.numel())
      p.add(path + ": checkpoint of another model: " + std::to_string(m.numel()) + " elements per buffer, this " +
            "model has " + std::to_string(mine) + " (" + name + ")");
  }
}

// Reads elements [tb, te) of every buffer in `buffers` (name -> te - tb floats) from the records of the shards
// that overlap them, located by ShardFileInfo.record_bytes; each record read is checked (parse, run id, buffer,
// range, XXH3). Problems are collected, not thrown.
void read_range(const std::string& path, const Manifest& m, int64_t tb, int64_t te,
                const std::map<std::string, std::span<float>>& buffers, Problems& p, LoadStats& stats) {
  const int world = m.world_size();
  if (m.shards_size() != world) {
    p.add((fs::path(path) / "manifest.pb").string() + ": lists " + std::to_string(m.shards_size()) +
          " shards for a world of " + std::to_string(world));
    return;
  }
  const int64_t numel = m.numel(), per_record = m.record_elements() > 0 ? m.record_elements() : default_record_elements();
  auto overlaps = [&](int s) {
    int64_t b = 0;
    for (int r = 0; r < s; ++r) b += numel / world + (r < numel % world ? 1 : 0);
    const int64_t e = b + numel / world + (s < numel % world ? 1 : 0);
    return std::max(b, tb) < std::min(e, te);
  };
  // A manifest copied from another run: when every shard this rank reads starts with one run id, and not the
  // manifest's, say that (the manifest is what is wrong), in one line, before sizes and hashes disagree.
  std::set<std::string> shard_ids;
  bool all_parse = true;
  for (int s = 0; s < world; ++s) {
    if (!overlaps(s)) continue;
    const std::string file = (fs::path(path) / m.shards(s).file()).string();
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) continue;
    const std::optional<std::string> id = shard_run_id(file);
    stats.bytes_read += std::min<int64_t>(256, static_cast<int64_t>(fs::file_size(file, ec)));
    if (id) shard_ids.insert(*id);
    all_parse = all_parse && id.has_value();
  }
  if (all_parse && shard_ids.size() == 1 && *shard_ids.begin() != m.run_id()) {
    p.add((fs::path(path) / "manifest.pb").string() + ": belongs to run " + m.run_id() + ", the shards to run " +
          *shard_ids.begin() + " (a manifest from another run?)");
    return;
  }
  std::map<std::string, int64_t> covered;
  int64_t ob = 0;
  for (int s = 0; s < world && p.lines.empty(); ++s) {
    const ShardFileInfo& info = m.shards(s);
    const int64_t count = numel / world + (s < numel % world ? 1 : 0), oe = ob + count;
    const int64_t lo = std::max(ob, tb), hi = std::min(oe, te);
    const int64_t shard_begin = ob;
    ob = oe;
    if (lo >= hi) continue;
    const std::string file = (fs::path(path) / info.file()).string();
    if (!shard_file_ok(file, info, p)) break;
    const auto ranges = record_ranges(shard_begin, count, per_record);
    int64_t total = 0;
    for (int64_t b : info.record_bytes()) total += b;
    if (info.record_bytes_size() != m.buffers_size() * std::ssize(ranges) || info.records() != info.record_bytes_size() ||
        total != info.bytes()) {
      p.add((fs::path(path) / "manifest.pb").string() + ": the record index of " + info.file() +
            " does not match its size or slice");
      break;
    }
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      p.add(file + ": cannot be read: " + errno_text());
      break;
    }
    // First the fields of every wanted record (small reads), checked; then their payloads in one stream
    // (direct_io.h: read ahead on a thread, O_DIRECT where the file system takes it), each piece hashed while in
    // cache and copied to its place.
    struct Wanted {
      int buffer, index;
      int64_t pos;      // of the record in the file
      RecordFields rec;  // its offset and count checked against the record index
    };
    std::vector<Wanted> wanted;
    int64_t at = 0;
    int k = 0;
    for (int b = 0; b < m.buffers_size() && p.lines.empty(); ++b) {
      for (const auto& [off, n] : ranges) {
        const int64_t len = info.record_bytes(k);
        const int index = k++;
        const int64_t pos = at;
        at += len;
        if (off >= hi || off + n <= lo) continue;  // a record outside the range is not read
        if (buffers.find(m.buffers(b)) == buffers.end()) continue;
        Wanted w{b, index, pos, {}};
        if (!read_record_fields(fd, pos, len, w.rec)) {
          p.add(file + ": record " + std::to_string(index) + " does not parse");
          break;
        }
        stats.bytes_read += len;
        ++stats.records;
        if (w.rec.run_id != m.run_id()) {
          p.add(file + ": belongs to run " + w.rec.run_id + ", the manifest to run " + m.run_id() +
                " (a manifest from another run?)");
          break;
        }
        if (w.rec.buffer != m.buffers(b) || w.rec.offset != off || w.rec.count != n ||
            w.rec.data_bytes != n * static_cast<int64_t>(sizeof(float))) {
          p.add(file + ": record " + std::to_string(index) + " (" + m.buffers(b) + ") fails its XXH3 or range check");
          break;
        }
        wanted.push_back(std::move(w));
      }
    }
    ::close(fd);
    if (!p.lines.empty()) break;
    std::vector<std::pair<int64_t, int64_t>> payloads;
    for (const Wanted& w : wanted) payloads.emplace_back(w.pos + w.rec.data_at, w.rec.data_bytes);
    ShardFileReader stream(file, payloads);
    if (!stream.ok()) {
      p.add(file + ": cannot be read: " + stream.error());
      break;
    }
    XXH3_state_t* hash = XXH3_createState();
    for (const Wanted& w : wanted) {
      const int64_t off = w.rec.offset, c0 = std::max(off, lo), c1 = std::min(off + w.rec.count, hi);
      // Bytes [d0, d1) of the payload go to the buffer from element c0 - tb on.
      const int64_t d0 = (c0 - off) * static_cast<int64_t>(sizeof(float)),
                    d1 = (c1 - off) * static_cast<int64_t>(sizeof(float));
      char* dest = reinterpret_cast<char*>(buffers.at(m.buffers(w.buffer)).data() + (c0 - tb));
      XXH3_64bits_reset(hash);
      int64_t seen = 0;
      const bool read_ok = stream.consume(w.pos + w.rec.data_at, w.rec.data_bytes, [&](const char* bytes, size_t n) {
        XXH3_64bits_update(hash, bytes, n);
        const int64_t lo_b = std::max(seen, d0), hi_b = std::min(seen + static_cast<int64_t>(n), d1);
        if (lo_b < hi_b) std::memcpy(dest + (lo_b - d0), bytes + (lo_b - seen), static_cast<size_t>(hi_b - lo_b));
        seen += static_cast<int64_t>(n);
      });
      if (!read_ok || XXH3_64bits_digest(hash) != w.rec.xxh3) {
        p.add(file + ": record " + std::to_string(w.index) + " (" + m.buffers(w.buffer) +
              ") fails its XXH3 or range check");
        break;
      }
      covered[m.buffers(w.buffer)] += c1 - c0;
    }
    XXH3_freeState(hash);
  }
  if (!p.lines.empty()) return;
  for (const auto& [name, buffer] : buffers)
    if (covered[name] != te - tb)
      p.add(path + ": buffer " + name + " covers " + std::to_string(covered[name]) + " of the " +
            std::to_string(te - tb) + " elements to load");
}

}  // namespace

Manifest read_manifest(const std::string& path) {
  const std::string file = (fs::path(path) / "manifest.pb").string();
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw BadInput(path, "no such checkpoint directory");
  if (!fs::exists(file, ec)) throw BadInput(file, "missing: not a complete checkpoint");
  if (!fs::is_regular_file(file, ec)) throw BadInput(file, "is not a regular file");
  const std::string bytes = read_file(file);
  ManifestFile mf;
  if (!mf.ParseFromString(bytes) || !mf.has_manifest()) throw BadInput(file, "does not parse as a manifest");
  if (XXH3_64bits(mf.manifest().data(), mf.manifest().size()) != mf.xxh3())
    throw BadInput(file, "XXH3 does not match its contents (corrupted)");
  Manifest m;
  if (!m.ParseFromString(mf.manifest())) throw BadInput(file, "does not parse as a manifest");
  if (m.format_version() != kFormatVersion)
    throw BadInput(file, "format version " + std::to_string(m.format_version()) + ", this build reads " +
                             std::to_string(kFormatVersion));
  if (m.numel() < 0) throw BadInput(file, "numel " + std::to_string(m.numel()) + " is negative");
  // Shard files are read from the checkpoint directory only: a name with a '/' could be a device or a FIFO
  // (/dev/zero, /dev/stdin) that a read never finishes.
  for (const ShardFileInfo& s : m.shards())
    if (s.file().empty() || s.file() == "." || s.file() == ".." || s.file().find('/') != std::string::npos)
      throw BadInput(file, "shard file name '" + s.file() + "' is not a file name in the checkpoint directory");
  return m;
}

std::vector<std::string> verify_checkpoint(const std::string& path) {
  Problems p;
  try {
    const Manifest m = read_manifest(path);
    read_shards(path, m, nullptr, p);
  } catch (const Error& e) {
    p.add(e.what());
  }
  return p.lines;
}

Manifest load_checkpoint(RankGroup ranks, const std::string& path, CheckpointState& into, LoadStats* stats) {
  Problems p;
  Manifest m;
  LoadStats local;
  std::map<std::string, std::vector<float>> staged;  // checkpoints without a record index
  std::map<std::string, std::unique_ptr<float[]>> staged_range;  // the others: this rank's range, not zero-filled
  std::map<std::string, std::span<float>> range;
  // What this rank reads: its slice of this world (replicated state is completed by an all-gather afterwards), or
  // the slice its sharded state holds.
  const int64_t held = into.buffers.empty() ? 0 : into.buffers.front().second->numel();
  const bool replicated = into.numel < 0 || (into.begin == 0 && held == into.numel);
  const std::vector<int64_t> counts = shard_counts(into.numel >= 0 ? into.numel : held, ranks.world_size());
  int64_t tb = into.begin;
  if (replicated) {
    tb = 0;
    for (int r = 0; r < ranks.rank(); ++r) tb += counts[r];
  }
  const int64_t te = tb + (replicated ? counts[ranks.rank()] : held);
  try {
    m = read_manifest(path);
    check_compatible(path, m, into, p);
    const bool indexed = m.shards_size() > 0 &&
                         std::all_of(m.shards().begin(), m.shards().end(),
                                     [](const ShardFileInfo& s) { return s.record_bytes_size() > 0 || s.records() == 0; });
    if (p.lines.empty() && indexed) {
      for (const auto& b : into.buffers) {
        staged_range[b.first].reset(new float[static_cast<size_t>(te - tb)]);  // every element is read or refused
        range[b.first] = std::span<float>(staged_range[b.first].get(), static_cast<size_t>(te - tb));
      }
      read_range(path, m, tb, te, range, p, local);
    } else if (p.lines.empty()) {  // a checkpoint without a record index: read whole, keep the range
      for (const auto& b : into.buffers) staged[b.first];  // sized by read_shards
      read_shards(path, m, &staged, p);
      for (auto& [name, v] : staged)
        if (p.lines.empty()) range[name] = std::span<float>(v.data() + tb, static_cast<size_t>(te - tb));
      for (const ShardFileInfo& s : m.shards()) local.bytes_read += s.bytes();
    }
  } catch (const Error& e) {
    p.add(e.what());
  }
  if (stats) *stats = local;
  // Every rank read and checked everything; they agree before any state changes.
  if (ranks.sum(p.lines.empty() ? 0 : 1, "checkpoint verification all-reduce") > 0) {
    if (!p.lines.empty()) throw Error(p.lines.front(), ErrorKind::kBadInput);
    Error e("checkpoint " + path + " failed verification on another rank", ErrorKind::kBadInput);
    e.set_secondary();
    throw e;
  }
  for (auto& [name, tensor] : into.buffers) {
    const std::span<float> src = range.at(name);
    std::memcpy(tensor->data_as<float>() + (tb - into.begin), src.data(), src.size() * sizeof(float));
    if (replicated)
      ranks.gather_slices(std::span<float>(tensor->data_as<float>(), static_cast<size_t>(tensor->numel())), counts,
                          "checkpoint load all-gather");
  }
  return m;
}

std::vector<float> read_checkpoint_buffer(const std::string& path, const std::string& buffer) {
  const Manifest m = read_manifest(path);
  std::map<std::string, std::vector<float>> staged;
  staged[buffer];  // sized by read_shards
  Problems p;
  read_shards(path, m, &staged, p);
  if (!p.lines.empty()) throw Error(p.lines.front(), ErrorKind::kBadInput);
  if (std::find(m.buffers().begin(), m.buffers().end(), buffer) == m.buffers().end())
    throw BadInput(path, "has no buffer '" + buffer + "'");
  return std::move(staged[buffer]);
}

}  // namespace ampdist

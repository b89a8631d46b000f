// Loading and verifying a checkpoint: read_manifest, verify_checkpoint, load_checkpoint (any world size onto any
// other: each rank reads only the records that overlap its slice) and read_checkpoint_buffer (checkpoint.h).
#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
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

std::string manifest_file(const std::string& path) { return (fs::path(path) / "manifest.pb").string(); }

// Rank r's slice length of a flat buffer of `numel` elements over `world` ranks (world >= 1), as
// shard_counts(numel, world)[r], computed per rank: world comes from the file, and a vector of `world` counts would
// allocate whatever the file says.
int64_t slice_count(int64_t numel, int world, int r) { return numel / world + (r < numel % world ? 1 : 0); }

// The line when the manifest does not list one shard per rank of its world.
std::optional<std::string> shard_count_problem(const std::string& path, const Manifest& m) {
  if (m.shards_size() == m.world_size()) return std::nullopt;
  return manifest_file(path) + ": lists " + std::to_string(m.shards_size()) + " shards for a world of " +
         std::to_string(m.world_size());
}

// A manifest copied from another run fails the size and hash checks of shards it never described: when every
// shard the reader looks at (`reads(s)`) starts with one run id, and not the manifest's, the one line that says what
// is wrong (the manifest); nullopt otherwise. Each look reads a few hundred bytes, added to *peeked when given.
std::optional<std::string> foreign_manifest(const std::string& path, const Manifest& m,
                                            const std::function<bool(int)>& reads, int64_t* peeked = nullptr) {
  std::set<std::string> shard_ids;
  bool all_parse = true;
  for (int s = 0; s < m.shards_size(); ++s) {
    if (!reads(s)) continue;
    const std::string file = (fs::path(path) / m.shards(s).file()).string();
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) continue;
    const std::optional<std::string> id = shard_run_id(file);
    if (peeked) *peeked += std::min<int64_t>(256, static_cast<int64_t>(fs::file_size(file, ec)));
    if (id) shard_ids.insert(*id);
    all_parse = all_parse && id.has_value();
  }
  if (!all_parse || shard_ids.size() != 1 || *shard_ids.begin() == m.run_id()) return std::nullopt;
  return manifest_file(path) + ": belongs to run " + m.run_id() + ", the shards to run " +
         *shard_ids.begin() + " (a manifest from another run?)";
}

// Sizes every entry of `buffers` to the manifest's numel, only when the shard files (distinct, of the sizes the
// manifest says) hold that much, so that a corrupt numel costs no more memory than the files do. False when they do
// not; then it adds a line, unless some shard file has another size than the manifest's (the reading names it).
bool size_buffers(const std::string& path, const Manifest& m, std::map<std::string, std::vector<float>>& buffers,
                  Problems& p) {
  std::set<std::string> files;
  int64_t held = 0;
  bool sizes_ok = true;
  for (const ShardFileInfo& info : m.shards()) {
    std::error_code ec;
    const fs::path file = fs::path(path) / info.file();
    if (!fs::is_regular_file(file, ec) || static_cast<int64_t>(fs::file_size(file, ec)) != info.bytes()) {
      sizes_ok = false;
      continue;
    }
    if (files.insert(info.file()).second) held += info.bytes();
  }
  if (m.numel() > held / static_cast<int64_t>(sizeof(float)) / std::max<int64_t>(1, std::ssize(buffers))) {
    if (sizes_ok)
      p.add(manifest_file(path) + ": numel " + std::to_string(m.numel()) + " in " +
            std::to_string(buffers.size()) + " buffer(s) is more than the shard files hold (" + std::to_string(held) +
            " bytes)");
    return false;
  }
  for (auto& [name, buffer] : buffers) buffer.assign(static_cast<size_t>(m.numel()), 0.0f);
  return true;
}

// One shard file's records as its bytes arrive (feed, then finish at the end of the file): each length-prefixed
// record is parsed from its own bounded range once complete (a shard may exceed the 2 GiB a single protobuf input
// stream can address; a record, <= 64 MiB of payload, never does), and checked for the manifest's run id, its own
// XXH3 and rank `rank`'s slice [slice_begin, slice_end). A record's elements are added to `covered` and, with
// `copy_into`, copied into that buffer. The first bad record stops the parsing.
class ShardRecordParser {
 public:
  ShardRecordParser(std::string file, const ShardFileInfo& info, const std::string& run_id, int rank,
                    int64_t slice_begin, int64_t slice_end, std::map<std::string, int64_t>& covered,
                    std::map<std::string, std::vector<float>>* copy_into)
      : file_(std::move(file)), info_(info), run_id_(run_id), rank_(rank), slice_begin_(slice_begin),
        slice_end_(slice_end), covered_(covered), copy_into_(copy_into) {}

  void feed(const char* bytes, size_t n) {
    if (bad_) return;
    pending_.append(bytes, n);
    parse(false);
  }
  void finish() { parse(true); }

  bool bad() const { return bad_; }
  int64_t records() const { return records_; }
  const Problems& found() const { return found_; }

 private:
  void fail(const std::string& what) {
    found_.add(file_ + ": record " + std::to_string(records_) + " " + what);
    bad_ = true;
  }

  void parse(bool at_end) {
    while (!bad_ && at_ < pending_.size()) {
      const size_t avail = pending_.size() - at_;
      pbio::CodedInputStream header(reinterpret_cast<const uint8_t*>(pending_.data()) + at_,
                                    static_cast<int>(std::min<size_t>(avail, 10)));
      uint32_t len = 0;
      const bool has_len = header.ReadVarint32(&len);
      if (!has_len && avail < 10 && !at_end) break;  // the length prefix continues in the next piece
      const size_t prefix = static_cast<size_t>(header.CurrentPosition());
      const int64_t left_in_file = info_.bytes() - parsed_bytes_ - static_cast<int64_t>(prefix);
      if (!has_len || static_cast<int64_t>(len) > left_in_file || len > static_cast<uint32_t>(INT32_MAX))
        return fail("does not parse");
      if (avail - prefix < len) {
        if (at_end) fail("does not parse");
        break;  // the record continues in the next piece
      }
      ShardRecord rec;
      if (!rec.ParseFromArray(pending_.data() + at_ + prefix, static_cast<int>(len))) return fail("does not parse");
      at_ += prefix + len;
      parsed_bytes_ += static_cast<int64_t>(prefix + len);
      take(rec);
    }
    if (at_ > 0 && (at_ == pending_.size() || at_ >= (size_t{16} << 20))) {  // drop what is parsed
      pending_.erase(0, at_);
      at_ = 0;
    }
  }

  void take(const ShardRecord& rec) {
    if (rec.run_id() != run_id_) {
      found_.add(file_ + ": belongs to run " + rec.run_id() + ", the manifest to run " + run_id_ +
                 " (a manifest from another run?)");
      bad_ = true;
    } else if (rec.data().size() % sizeof(float) != 0 ||
               rec.count() != static_cast<int64_t>(rec.data().size() / sizeof(float)) ||
               XXH3_64bits(rec.data().data(), rec.data().size()) != rec.xxh3()) {
      fail("(" + rec.buffer() + ") fails its XXH3 check");
    } else if (rec.offset() < slice_begin_ || rec.offset() > slice_end_ - rec.count()) {
      fail("lies outside rank " + std::to_string(rank_) + "'s slice");
    } else {
      covered_[rec.buffer()] += rec.count();
      if (copy_into_) {
        auto it = copy_into_->find(rec.buffer());
        if (it != copy_into_->end())
          std::memcpy(it->second.data() + rec.offset(), rec.data().data(), rec.data().size());
      }
    }
    ++records_;
  }

  const std::string file_;
  const ShardFileInfo& info_;
  const std::string& run_id_;
  const int rank_;
  const int64_t slice_begin_, slice_end_;
  std::map<std::string, int64_t>& covered_;
  std::map<std::string, std::vector<float>>* copy_into_;
  std::string pending_;  // bytes read and not yet parsed, from at_ on
  size_t at_ = 0;
  int64_t records_ = 0, parsed_bytes_ = 0;
  bool bad_ = false;
  Problems found_;
};

// Streams one shard file through once (direct_io.h, as a load reads it): each piece goes into the file's XXH3 and
// into the record parser, so memory holds one record and one block, not the shard. The file's XXH3 is checked at the
// end, and a mismatch is the one problem reported for the file (what the records showed is then moot).
void read_shard(const std::string& file, const ShardFileInfo& info, ShardRecordParser& parser, Problems& p) {
  ShardFileReader stream(file, {{0, info.bytes()}});
  if (!stream.ok()) return p.add(file + ": cannot be read: " + stream.error());
  XXH3_state_t* file_hash = XXH3_createState();
  XXH3_64bits_reset(file_hash);
  const bool read_ok = stream.consume(0, info.bytes(), [&](const char* bytes, size_t n) {
    XXH3_64bits_update(file_hash, bytes, n);
    parser.feed(bytes, n);
  });
  if (read_ok) parser.finish();
  const bool hash_ok = read_ok && XXH3_64bits_digest(file_hash) == info.xxh3();
  XXH3_freeState(file_hash);
  if (!read_ok) return p.add(file + ": cannot be read whole (" + std::to_string(info.bytes()) + " bytes)");
  if (!hash_ok) return p.add(file + ": XXH3 of the file does not match the manifest (corrupted)");
  for (const std::string& line : parser.found().lines) p.add(line);
  if (!parser.bad() && parser.records() != info.records())
    p.add(file + ": " + std::to_string(parser.records()) + " records, the manifest says " +
          std::to_string(info.records()));
}

// Reads every shard of a checkpoint, checking it against the manifest; when `buffers` is non-null, sizes each of
// its entries (name -> full buffer) to numel and fills it. Problems are collected, not thrown.
void read_shards(const std::string& path, const Manifest& m, std::map<std::string, std::vector<float>>* buffers,
                 Problems& p) {
  const int world = m.world_size();
  const int64_t numel = m.numel();
  if (const auto problem = shard_count_problem(path, m)) p.add(*problem);
  if (const auto foreign = foreign_manifest(path, m, [](int) { return true; })) return p.add(*foreign);
  const size_t lines_before = p.lines.size();
  const bool copy = buffers != nullptr && size_buffers(path, m, *buffers, p);
  if (p.lines.size() > lines_before) return;  // numel is more than the files hold: that is the problem
  std::map<std::string, int64_t> covered;
  int64_t begin = 0;
  for (int r = 0; r < m.shards_size(); ++r) {
    const ShardFileInfo& info = m.shards(r);
    const std::string file = (fs::path(path) / info.file()).string();
    const int64_t slice_begin = begin, slice_end = begin + (r < world ? slice_count(numel, world, r) : 0);
    begin = slice_end;
    if (!shard_file_ok(file, info, p)) continue;
    ShardRecordParser parser(file, info, m.run_id(), r, slice_begin, slice_end, covered, copy ? buffers : nullptr);
    read_shard(file, info, parser, p);
  }
  if (buffers && !copy && p.lines.empty())  // not expected: a shard whose size was off is named above
    p.add(manifest_file(path) + ": numel " + std::to_string(numel) +
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
// range, XXH3). Problems are collected, not thrown; the first one ends the reading.
class RangeReader {
 public:
  RangeReader(const std::string& path, const Manifest& m, int64_t tb, int64_t te,
              const std::map<std::string, std::span<float>>& buffers, Problems& p, LoadStats& stats)
      : path_(path), m_(m), tb_(tb), te_(te), buffers_(buffers), p_(p), stats_(stats) {}

  void read() {
    if (const auto problem = shard_count_problem(path_, m_)) return p_.add(*problem);
    const int world = m_.world_size();
    const int64_t numel = m_.numel();
    auto overlaps = [&](int s) {
      int64_t b = 0;
      for (int r = 0; r < s; ++r) b += slice_count(numel, world, r);
      return std::max(b, tb_) < std::min(b + slice_count(numel, world, s), te_);
    };
    if (const auto foreign = foreign_manifest(path_, m_, overlaps, &stats_.bytes_read)) return p_.add(*foreign);
    int64_t begin = 0;
    for (int s = 0; s < world && p_.lines.empty(); ++s) {
      const int64_t count = slice_count(numel, world, s);
      if (std::max(begin, tb_) < std::min(begin + count, te_)) read_shard(m_.shards(s), begin, count);
      begin += count;
    }
    if (!p_.lines.empty()) return;
    for (const auto& [name, buffer] : buffers_)
      if (covered_[name] != te_ - tb_)
        p_.add(path_ + ": buffer " + name + " covers " + std::to_string(covered_[name]) + " of the " +
               std::to_string(te_ - tb_) + " elements to load");
  }

 private:
  struct Wanted {
    int buffer, index;
    int64_t pos;       // of the record in the file
    RecordFields rec;  // its offset and count checked against the record index
  };

  // The shard of rank slice [shard_begin, shard_begin + count): first the fields of every wanted record (small
  // reads), checked; then their payloads in one stream.
  void read_shard(const ShardFileInfo& info, int64_t shard_begin, int64_t count) {
    const std::string file = (fs::path(path_) / info.file()).string();
    if (!shard_file_ok(file, info, p_)) return;
    const int64_t per_record = m_.record_elements() > 0 ? m_.record_elements() : default_record_elements();
    const auto ranges = record_ranges(shard_begin, count, per_record);
    int64_t total = 0;
    for (int64_t b : info.record_bytes()) total += b;
    if (info.record_bytes_size() != m_.buffers_size() * std::ssize(ranges) ||
        info.records() != info.record_bytes_size() || total != info.bytes())
      return p_.add(manifest_file(path_) + ": the record index of " + info.file() + " does not match its size or slice");
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return p_.add(file + ": cannot be read: " + errno_text());
    const std::vector<Wanted> wanted = wanted_records(fd, file, info, ranges);
    ::close(fd);
    if (p_.lines.empty()) read_payloads(file, wanted, shard_begin, count);
  }

  // The fields of every record in `ranges` (the shard's record ranges, per buffer in order) that overlaps [tb, te)
  // of a buffer being loaded, each checked for its run id and against the record index.
  std::vector<Wanted> wanted_records(int fd, const std::string& file, const ShardFileInfo& info,
                                     const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    std::vector<Wanted> wanted;
    int64_t at = 0;
    int k = 0;
    for (int b = 0; b < m_.buffers_size(); ++b) {
      for (const auto& [off, n] : ranges) {
        const int64_t len = info.record_bytes(k);
        const int index = k++;
        const int64_t pos = at;
        at += len;
        if (off >= te_ || off + n <= tb_) continue;  // a record outside the range is not read
        if (buffers_.find(m_.buffers(b)) == buffers_.end()) continue;
        Wanted w{b, index, pos, {}};
        if (!read_record_fields(fd, pos, len, w.rec)) {
          p_.add(file + ": record " + std::to_string(index) + " does not parse");
          return {};
        }
        stats_.bytes_read += len;
        ++stats_.records;
        if (w.rec.run_id != m_.run_id()) {
          p_.add(file + ": belongs to run " + w.rec.run_id + ", the manifest to run " + m_.run_id() +
                 " (a manifest from another run?)");
          return {};
        }
        if (w.rec.buffer != m_.buffers(b) || w.rec.offset != off || w.rec.count != n ||
            w.rec.data_bytes != n * static_cast<int64_t>(sizeof(float))) {
          p_.add(file + ": record " + std::to_string(index) + " (" + m_.buffers(b) + ") fails its XXH3 or range check");
          return {};
        }
        wanted.push_back(std::move(w));
      }
    }
    return wanted;
  }

  // The wanted records' payloads in one stream (direct_io.h: read ahead on a thread, O_DIRECT where the file system
  // takes it), each piece hashed while in cache and its part within [tb, te) copied to its place.
  void read_payloads(const std::string& file, const std::vector<Wanted>& wanted, int64_t shard_begin, int64_t count) {
    const int64_t lo = std::max(shard_begin, tb_), hi = std::min(shard_begin + count, te_);
    std::vector<std::pair<int64_t, int64_t>> payloads;
    for (const Wanted& w : wanted) payloads.emplace_back(w.pos + w.rec.data_at, w.rec.data_bytes);
    ShardFileReader stream(file, payloads);
    if (!stream.ok()) return p_.add(file + ": cannot be read: " + stream.error());
    XXH3_state_t* hash = XXH3_createState();
    for (const Wanted& w : wanted) {
      const int64_t off = w.rec.offset, c0 = std::max(off, lo), c1 = std::min(off + w.rec.count, hi);
      // Bytes [d0, d1) of the payload go to the buffer from element c0 - tb on.
      const int64_t d0 = (c0 - off) * static_cast<int64_t>(sizeof(float)),
                    d1 = (c1 - off) * static_cast<int64_t>(sizeof(float));
      char* dest = reinterpret_cast<char*>(buffers_.at(m_.buffers(w.buffer)).data() + (c0 - tb_));
      XXH3_64bits_reset(hash);
      int64_t seen = 0;
      const bool read_ok = stream.consume(w.pos + w.rec.data_at, w.rec.data_bytes, [&](const char* bytes, size_t n) {
        XXH3_64bits_update(hash, bytes, n);
        const int64_t lo_b = std::max(seen, d0), hi_b = std::min(seen + static_cast<int64_t>(n), d1);
        if (lo_b < hi_b) std::memcpy(dest + (lo_b - d0), bytes + (lo_b - seen), static_cast<size_t>(hi_b - lo_b));
        seen += static_cast<int64_t>(n);
      });
      if (!read_ok || XXH3_64bits_digest(hash) != w.rec.xxh3) {
        p_.add(file + ": record " + std::to_string(w.index) + " (" + m_.buffers(w.buffer) +
               ") fails its XXH3 or range check");
        break;
      }
      covered_[m_.buffers(w.buffer)] += c1 - c0;
    }
    XXH3_freeState(hash);
  }

  const std::string& path_;
  const Manifest& m_;
  const int64_t tb_, te_;
  const std::map<std::string, std::span<float>>& buffers_;
  Problems& p_;
  LoadStats& stats_;
  std::map<std::string, int64_t> covered_;
};

}  // namespace

Manifest read_manifest(const std::string& path) {
  const std::string file = manifest_file(path);
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
      RangeReader(path, m, tb, te, range, p, local).read();
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

#include "runtime/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>  // renameat2
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "runtime/core/flat_layout.h"  // shard_counts
#include "runtime/core/error.h"

namespace ampdist {

static_assert(std::endian::native == std::endian::little, "shard payloads are little-endian FP32");

namespace fs = std::filesystem;
namespace pbio = google::protobuf::io;

namespace {

constexpr int kFormatVersion = 1;

std::string shard_name(int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard_%05d_of_%05d.pb", rank, world);
  return buf;
}

std::string errno_text() { return std::strerror(errno); }

// Appends protobuf's base-128 varint of v (a record's length prefix, a varint field's value).
void append_varint(std::string& out, uint64_t v) {
  uint8_t buf[10];
  const uint8_t* end = pbio::CodedOutputStream::WriteVarint64ToArray(v, buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(end - buf));
}

// Writes all of `data` to `fd`; false with errno set on failure (a full disk included).
bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Writes `contents` to `path` (O_TRUNC), fsynced. Throws Error naming the file.
void write_file_durably(const std::string& path, const std::string& contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(path + ": cannot create: " + errno_text());
  const bool ok = write_all(fd, contents.data(), contents.size()) && ::fsync(fd) == 0;
  const std::string err = ok ? "" : errno_text();
  ::close(fd);
  if (!ok) throw Error(path + ": write failed: " + err);
}

std::string read_file(const std::string& path) {
  // One read() of the whole file into a buffer sized from its length (a streambuf iterator costs ~8 s of CPU per
  // GiB, which made loading CPU-bound).
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw BadInput(path, "cannot be read (missing?)");
  const std::streamsize size = in.tellg();
  if (size < 0) throw BadInput(path, "cannot be read");
  std::string s(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(s.data(), size)) throw BadInput(path, "read failed");
  return s;
}

// One shard: records of the slice [begin, begin + count) of every buffer, in buffer order.
struct ShardResult {
  int64_t bytes = 0, records = 0;
  uint64_t xxh3 = 0;
  std::vector<int64_t> record_bytes;  // each record's bytes, varint length prefix included, in file order
};

int64_t default_record_elements() { return kMaxRecordBytes / static_cast<int64_t>(sizeof(float)); }

// Records of each buffer over [begin, begin + count) in chunks of per_record elements: (offset, count) in order.
std::vector<std::pair<int64_t, int64_t>> record_ranges(int64_t begin, int64_t count, int64_t per_record) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t off = begin; off < begin + count; off += per_record) out.emplace_back(off, std::min(per_record, begin + count - off));
  return out;
}

// crash: truncate the shard halfway and SIGKILL this process; fail_errno != 0: fail the first write with it;
// pause_s > 0: sleep that long with every record written and before the fsync (a slow disk).
// The state's tensors hold elements [state.begin, ...) of the flat buffers.
ShardResult write_shard(const std::string& path, const CheckpointState& state, int64_t begin, int64_t count,
                        int64_t per_record, bool crash, int fail_errno, double pause_s) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(path + ": cannot create: " + errno_text());
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  ShardResult r;
  std::string head, trailer;
  try {
    for (const auto& [name, tensor] : state.buffers) {
      const float* data = tensor->data_as<float>() - state.begin;  // indexed by flat element
      for (const auto& [off, n] : record_ranges(begin, count, per_record)) {
        // The bytes are exactly ShardRecord{run_id, buffer, offset, count, data, xxh3} serialised length-delimited
        // (proto2 writes set fields in field-number order), but the payload goes from the state to the file
        // without a copy: its XXH3 first, then the header, then the payload chunk by chunk, each chunk added to the
        // file's XXH3 while it is in cache and written from there, then the xxh3 field.
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
        if (fail_errno != 0) errno = fail_errno;
        if (fail_errno != 0 || !write_all(fd, head.data(), head.size()))
          throw Error(path + ": write failed: " + errno_text());
        XXH3_64bits_update(h, head.data(), head.size());
        constexpr size_t kChunk = size_t{1} << 20;
        for (size_t at = 0; at < payload_bytes; at += kChunk) {
          const size_t len = std::min(kChunk, payload_bytes - at);
          XXH3_64bits_update(h, payload + at, len);
          if (!write_all(fd, payload + at, len)) throw Error(path + ": write failed: " + errno_text());
        }
        if (!write_all(fd, trailer.data(), trailer.size())) throw Error(path + ": write failed: " + errno_text());
        XXH3_64bits_update(h, trailer.data(), trailer.size());
        const int64_t total = static_cast<int64_t>(head.size() + payload_bytes + trailer.size());
        r.bytes += total;
        r.record_bytes.push_back(total);
        ++r.records;
      }
    }
    if (crash) {
      // Fault injection: die with the shard half written, as a killed rank would leave it.
      if (::ftruncate(fd, r.bytes / 2) != 0) throw Error(path + ": truncate failed");
      ::fsync(fd);
      std::raise(SIGKILL);
    }
    if (pause_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause_s));
    if (::fsync(fd) != 0) throw Error(path + ": fsync failed: " + errno_text());
  } catch (...) {
    ::close(fd);
    XXH3_freeState(h);
    throw;
  }
  ::close(fd);
  r.xxh3 = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return r;
}

int64_t step_of(const std::string& dirname) {
  if (dirname.rfind("step_", 0) != 0 || dirname.size() != 13) return -1;
  for (size_t i = 5; i < dirname.size(); ++i)
    if (dirname[i] < '0' || dirname[i] > '9') return -1;
  return std::stoll(dirname.substr(5));
}

// Every complete checkpoint (step, path) under dir, ascending by step.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = step_of(e.path().filename().string());
    if (s >= 0 && fs::exists(e.path() / "manifest.pb", ec)) out.emplace_back(s, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The run id of a shard file's first record (read from its first bytes only), when it parses that far.
std::optional<std::string> shard_run_id(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  char head[256];
  in.read(head, sizeof head);
  pbio::CodedInputStream cis(reinterpret_cast<const uint8_t*>(head), static_cast<int>(in.gcount()));
  uint32_t len = 0, n = 0;
  std::string id;
  if (!cis.ReadVarint32(&len) || cis.ReadTag() != ((1u << 3) | 2u) || !cis.ReadVarint32(&n) || n > 128 ||
      !cis.ReadString(&id, static_cast<int>(n)))
    return std::nullopt;
  return id;
}

struct Problems {
  std::vector<std::string> lines;
  void add(const std::string& s) { lines.push_back(s); }
};

// Whether a shard file exists, is a regular file and has the size the manifest records; adds the problem if not.
bool shard_file_ok(const std::string& file, const ShardFileInfo& info, Problems& p) {
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    p.add(file + ": missing shard");
    return false;
  }
  if (!fs::is_regular_file(file, ec)) {
    p.add(file + ": not a regular file");
    return false;
  }
  const auto size = static_cast<int64_t>(fs::file_size(file, ec));
  if (size != info.bytes()) {
    p.add(file + ": " + std::to_string(size) + " bytes, the manifest says " + std::to_string(info.bytes()) +
          " (truncated or overwritten)");
    return false;
  }
  return true;
}

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
    std::string bytes;
    try {
      bytes = read_file(file);
    } catch (const Error& e) {
      p.add(e.what());
      continue;
    }
    if (XXH3_64bits(bytes.data(), bytes.size()) != info.xxh3()) {
      p.add(file + ": XXH3 of the file does not match the manifest (corrupted)");
      continue;
    }
    // Record by record, each parsed from its own bounded range: a shard may exceed the 2 GiB a single protobuf
    // input stream can address, a record (<= 64 MiB of payload) never does.
    int64_t records = 0;
    bool bad = false;
    for (size_t pos = 0; !bad && pos < bytes.size();) {
      const auto* at = reinterpret_cast<const uint8_t*>(bytes.data()) + pos;
      pbio::CodedInputStream header(at, static_cast<int>(std::min<size_t>(bytes.size() - pos, 10)));
      uint32_t len = 0;
      ShardRecord rec;
      const bool has_len = header.ReadVarint32(&len);
      const size_t start = pos + static_cast<size_t>(header.CurrentPosition());
      if (!has_len || len > bytes.size() - start || len > static_cast<uint32_t>(INT32_MAX) ||
          !rec.ParseFromArray(bytes.data() + start, static_cast<int>(len))) {
        p.add(file + ": record " + std::to_string(records) + " does not parse");
        bad = true;
        break;
      }
      pos = start + len;
      ++records;
      if (rec.run_id() != m.run_id()) {
        p.add(file + ": belongs to run " + rec.run_id() + ", the manifest to run " + m.run_id() +
              " (a manifest from another run?)");
        bad = true;
      } else if (rec.data().size() % sizeof(float) != 0 ||
                 rec.count() != static_cast<int64_t>(rec.data().size() / sizeof(float)) ||
                 XXH3_64bits(rec.data().data(), rec.data().size()) != rec.xxh3()) {
        p.add(file + ": record " + std::to_string(records - 1) + " (" + rec.buffer() + ") fails its XXH3 check");
        bad = true;
      } else if (rec.offset() < slice_begin || rec.offset() > slice_end - rec.count()) {
        p.add(file + ": record " + std::to_string(records - 1) + " lies outside rank " + std::to_string(r) +
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
// A ShardRecord's fields as read_record_fields finds them: the payload is located (data_at: its first byte, from
// the start of the length-delimited record), not read.
struct RecordFields {
  std::string run_id, buffer;
  int64_t offset = -1, count = -1;
  int64_t data_at = -1, data_bytes = -1;
  uint64_t xxh3 = 0;
};

// Reads the length-delimited ShardRecord of `len` bytes at `pos` of `fd` without its payload: the length prefix
// and the fields before the payload (protobuf's order: run_id, buffer, offset, count, then data), then, after the
// payload, the xxh3 field. False when the bytes are not such a record of exactly `len` bytes (an unknown, repeated or
// misplaced field included: the writer writes each field once, in this order).
bool read_record_fields(int fd, int64_t pos, int64_t len, RecordFields& r) {
  char head[1024];  // run_id and buffer are at most 256 bytes each
  const int64_t want = std::min<int64_t>(len, sizeof head);
  if (len <= 0 || ::pread(fd, head, static_cast<size_t>(want), pos) != want) return false;
  pbio::CodedInputStream in(reinterpret_cast<const uint8_t*>(head), static_cast<int>(want));
  uint32_t rec_len = 0;
  if (!in.ReadVarint32(&rec_len) || in.CurrentPosition() + static_cast<int64_t>(rec_len) != len) return false;
  int last = 0;
  for (;;) {
    const uint32_t tag = in.ReadTag();
    const int field = static_cast<int>(tag >> 3);
    if (tag == 0 || field <= last) return false;
    last = field;
    uint64_t v = 0;
    uint32_t n = 0;
    switch (field) {
      case ShardRecord::kRunIdFieldNumber:
        if ((tag & 7) != 2 || !in.ReadVarint32(&n) || n > 256 || !in.ReadString(&r.run_id, static_cast<int>(n))) return false;
        break;
      case ShardRecord::kBufferFieldNumber:
        if ((tag & 7) != 2 || !in.ReadVarint32(&n) || n > 256 || !in.ReadString(&r.buffer, static_cast<int>(n))) return false;
        break;
      case ShardRecord::kOffsetFieldNumber:
        if ((tag & 7) != 0 || !in.ReadVarint64(&v)) return false;
        r.offset = static_cast<int64_t>(v);
        break;
      case ShardRecord::kCountFieldNumber:
        if ((tag & 7) != 0 || !in.ReadVarint64(&v)) return false;
        r.count = static_cast<int64_t>(v);
        break;
      case ShardRecord::kDataFieldNumber: {
        if ((tag & 7) != 2 || !in.ReadVarint32(&n)) return false;
        r.data_at = in.CurrentPosition();
        r.data_bytes = n;
        const int64_t rest = len - (r.data_at + r.data_bytes);  // the xxh3 field: tag and varint, 2 to 11 bytes
        if (rest < 2 || rest > 11) return false;
        uint8_t tail[11];
        if (::pread(fd, tail, static_cast<size_t>(rest), pos + r.data_at + r.data_bytes) != rest) return false;
        pbio::CodedInputStream t(tail, static_cast<int>(rest));
        if (t.ReadTag() != (ShardRecord::kXxh3FieldNumber << 3 | 0) || !t.ReadVarint64(&r.xxh3) ||
            t.CurrentPosition() != rest)
          return false;
        return true;
      }
      default:
        return false;
    }
  }
}

void read_range(const std::string& path, const Manifest& m, int64_t tb, int64_t te,
                std::map<std::string, std::vector<float>>& buffers, Problems& p, LoadStats& stats) {
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
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) {
      p.add(file + ": cannot be read: " + errno_text());
      break;
    }
    int64_t at = 0;
    int k = 0;
    std::string chunk;
    XXH3_state_t* hash = XXH3_createState();
    for (int b = 0; b < m.buffers_size() && p.lines.empty(); ++b) {
      for (const auto& [off, n] : ranges) {
        const int64_t len = info.record_bytes(k);
        const int index = k++;
        const int64_t pos = at;
        at += len;
        if (off >= hi || off + n <= lo) continue;  // a record outside the range is not read
        auto it = buffers.find(m.buffers(b));
        if (it == buffers.end()) continue;
        // The record is read in pieces, never whole: its fields up to the payload, then the payload in 1 MiB chunks,
        // each hashed and copied to its place while in cache, then the xxh3 field.
        RecordFields rec;
        if (!read_record_fields(fd, pos, len, rec)) {
          p.add(file + ": record " + std::to_string(index) + " does not parse");
          break;
        }
        stats.bytes_read += len;
        ++stats.records;
        if (rec.run_id != m.run_id()) {
          p.add(file + ": belongs to run " + rec.run_id + ", the manifest to run " + m.run_id() +
                " (a manifest from another run?)");
          break;
        }
        const bool shape_ok = rec.buffer == m.buffers(b) && rec.offset == off && rec.count == n &&
                              rec.data_bytes == n * static_cast<int64_t>(sizeof(float));
        const int64_t c0 = std::max(off, lo), c1 = std::min(off + n, hi);
        // Bytes [d0, d1) of the payload go to the buffer from element c0 - tb on.
        const int64_t d0 = (c0 - off) * static_cast<int64_t>(sizeof(float)),
                      d1 = (c1 - off) * static_cast<int64_t>(sizeof(float));
        char* dest = reinterpret_cast<char*>(it->second.data() + (c0 - tb));
        XXH3_64bits_reset(hash);
        constexpr int64_t kChunk = int64_t{1} << 20;
        chunk.resize(static_cast<size_t>(std::min<int64_t>(kChunk, std::max<int64_t>(rec.data_bytes, 1))));
        bool read_ok = shape_ok;
        for (int64_t at_data = 0; read_ok && at_data < rec.data_bytes; at_data += kChunk) {
          const int64_t clen = std::min(kChunk, rec.data_bytes - at_data);
          read_ok = ::pread(fd, chunk.data(), static_cast<size_t>(clen), pos + rec.data_at + at_data) == clen;
          if (!read_ok) break;
          XXH3_64bits_update(hash, chunk.data(), static_cast<size_t>(clen));
          const int64_t lo_b = std::max(at_data, d0), hi_b = std::min(at_data + clen, d1);
          if (lo_b < hi_b)
            std::memcpy(dest + (lo_b - d0), chunk.data() + (lo_b - at_data), static_cast<size_t>(hi_b - lo_b));
        }
        if (!read_ok || XXH3_64bits_digest(hash) != rec.xxh3) {
          p.add(file + ": record " + std::to_string(index) + " (" + m.buffers(b) + ") fails its XXH3 or range check");
          break;
        }
        covered[m.buffers(b)] += c1 - c0;
      }
    }
    XXH3_freeState(hash);
    ::close(fd);
  }
  if (!p.lines.empty()) return;
  for (const auto& [name, buffer] : buffers)
    if (covered[name] != te - tb)
      p.add(path + ": buffer " + name + " covers " + std::to_string(covered[name]) + " of the " +
            std::to_string(te - tb) + " elements to load");
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

SaveTarget prepare_save(Communicator& comm, const CheckpointState& state, const std::string& dir) {
  const int rank = comm.rank(), world = comm.world_size();
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
  comm.barrier("checkpoint directory barrier");
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
                      faults->slow_save().rank() == rank;
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

std::string commit_save(Communicator& comm, const SaveTarget& t, const Manifest& meta,
                        const std::vector<std::string>& buffer_names, const ShardWrite& mine, int keep_last,
                        std::vector<std::string>* warnings) {
  const int rank = comm.rank(), world = comm.world_size();
  std::string error = mine.error;
  // Everyone learns whether every shard is on disk, and which rank failed with what, before anything is published.
  const std::vector<uint64_t> errnos =
      comm.allgather_u64(error.empty() ? 0 : (mine.err ? mine.err : EIO), "checkpoint status gather");
  int64_t failed = 0;
  std::string who;
  for (int r = 0; r < world; ++r) {
    if (errnos[r] == 0) continue;
    ++failed;
    if (who.empty())
      who = "rank " + std::to_string(r) + " could not write its shard: " + std::strerror(static_cast<int>(errnos[r]));
  }
  const std::vector<uint64_t> bytes = comm.allgather_u64(static_cast<uint64_t>(mine.bytes), "checkpoint shard sizes");
  const std::vector<uint64_t> records = comm.allgather_u64(static_cast<uint64_t>(mine.records), "checkpoint shard records");
  const std::vector<uint64_t> hashes = comm.allgather_u64(mine.xxh3, "checkpoint shard hashes");
  // Every record's length, for readers that seek: the same number of gathers on every rank (the most records any
  // rank writes, which every rank can compute), each rank giving 0 past its own.
  std::vector<std::vector<int64_t>> record_bytes(world);
  if (failed == 0) {
    for (int64_t k = 0; k < t.most_records; ++k) {
      const int64_t len = k < std::ssize(mine.record_bytes) ? mine.record_bytes[k] : 0;
      const std::vector<uint64_t> all = comm.allgather_u64(static_cast<uint64_t>(len), "checkpoint record sizes");
      for (int r = 0; r < world; ++r)
        if (all[r] > 0) record_bytes[r].push_back(static_cast<int64_t>(all[r]));
    }
  }
  if (failed > 0) {
    // Nothing of this save is kept (it may be what filled the disk); nothing older was touched.
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(t.tmp, ec);
    }
    throw Error("checkpoint " + t.final_path + " not saved: " + (who.empty() ? error : who) +
                (failed > 1 ? " (and " + std::to_string(failed - 1) + " more)" : ""))
        .set_collective();
  }

  if (rank == 0) {
    try {
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
        s->set_bytes(static_cast<int64_t>(bytes[r]));
        s->set_records(static_cast<int64_t>(records[r]));
        s->set_xxh3(hashes[r]);
        for (int64_t b : record_bytes[r]) s->add_record_bytes(b);
      }
      ManifestFile mf;
      mf.set_manifest(m.SerializeAsString());
      mf.set_xxh3(XXH3_64bits(mf.manifest().data(), mf.manifest().size()));
      write_file_durably((fs::path(t.tmp) / "manifest.pb").string(), mf.SerializeAsString());
      fsync_path(t.tmp);
      // A re-save of the same step replaces a whole checkpoint; a damaged one is evidence and is moved aside.
      if (fs::exists(t.final_path)) {
        const std::string problem = whole_checkpoint_problem(t.final_path);
        if (problem.empty()) {
          fs::remove_all(t.final_path);
        } else {
          const std::string aside = move_aside_damaged(t.final_path);
          if (warnings)
            warnings->push_back(t.final_path + " was damaged (" + problem + "): moved aside to " + aside +
                                ", not written over");
        }
      }
      fs::rename(t.tmp, t.final_path);
      fsync_path(t.dir);
      const std::string latest_tmp = (fs::path(t.dir) / ".latest.tmp").string();
      write_file_durably(latest_tmp, t.name + "\n");
      fs::rename(latest_tmp, fs::path(t.dir) / "latest");
      fsync_path(t.dir);
      if (keep_last > 0) {
        auto all = complete_checkpoints(t.dir);
        for (size_t i = 0; i + keep_last < all.size(); ++i) {
          // Pruning removes whole checkpoints only (manifest and shard sizes checked, not every byte).
          const std::string problem = whole_checkpoint_problem(all[i].second);
          if (problem.empty()) {
            fs::remove_all(all[i].second);
          } else {
            const std::string aside = move_aside_damaged(all[i].second);
            if (warnings)
              warnings->push_back(all[i].second + " is damaged (" + problem + "): moved aside to " + aside +
                                  " instead of pruned");
          }
        }
      }
    } catch (const std::exception& e) {
      error = "publishing checkpoint " + t.final_path + " failed: " + e.what();
    }
  }
  int64_t published[1] = {rank == 0 && !error.empty() ? 1 : 0};
  comm.allreduce_i64(published, ReduceOp::kSum, "checkpoint publish all-reduce");
  if (published[0] > 0)  // rank 0 holds the reason, and rank 0 reports a collective error
    throw Error(rank == 0 && !error.empty() ? error : "checkpoint " + t.final_path + " not published").set_collective();
  return t.final_path;
}

std::string save_checkpoint(Communicator& comm, const CheckpointState& state, const std::string& dir, int keep_last,
                            const FaultConfig* faults, std::vector<std::string>* warnings) {
  const SaveTarget t = prepare_save(comm, state, dir);
  const ShardWrite mine = write_own_shard(t, state, comm.rank(), comm.world_size(), faults);
  std::vector<std::string> names;
  for (const auto& b : state.buffers) names.push_back(b.first);
  return commit_save(comm, t, state.meta, names, mine, keep_last, warnings);
}

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

Manifest load_checkpoint(Communicator& comm, const std::string& path, CheckpointState& into, LoadStats* stats) {
  Problems p;
  Manifest m;
  LoadStats local;
  std::map<std::string, std::vector<float>> staged;
  // What this rank reads: its slice of this world (replicated state is completed by an all-gather afterwards), or
  // the slice its sharded state holds.
  const int64_t held = into.buffers.empty() ? 0 : into.buffers.front().second->numel();
  const bool replicated = into.numel < 0 || (into.begin == 0 && held == into.numel);
  const std::vector<int64_t> counts = shard_counts(into.numel >= 0 ? into.numel : held, comm.world_size());
  int64_t tb = into.begin;
  if (replicated) {
    tb = 0;
    for (int r = 0; r < comm.rank(); ++r) tb += counts[r];
  }
  const int64_t te = tb + (replicated ? counts[comm.rank()] : held);
  try {
    m = read_manifest(path);
    check_compatible(path, m, into, p);
    const bool indexed = m.shards_size() > 0 &&
                         std::all_of(m.shards().begin(), m.shards().end(),
                                     [](const ShardFileInfo& s) { return s.record_bytes_size() > 0 || s.records() == 0; });
    if (p.lines.empty() && indexed) {
      for (const auto& b : into.buffers) staged[b.first].assign(static_cast<size_t>(te - tb), 0.0f);
      read_range(path, m, tb, te, staged, p, local);
    } else if (p.lines.empty()) {  // a checkpoint without a record index: read whole, keep the range
      for (const auto& b : into.buffers) staged[b.first];  // sized by read_shards
      read_shards(path, m, &staged, p);
      for (auto& [name, v] : staged)
        if (p.lines.empty()) v = std::vector<float>(v.begin() + tb, v.begin() + te);
      for (const ShardFileInfo& s : m.shards()) local.bytes_read += s.bytes();
    }
  } catch (const Error& e) {
    p.add(e.what());
  }
  if (stats) *stats = local;
  // Every rank read and checked everything; they agree before any state changes.
  int64_t bad[1] = {p.lines.empty() ? 0 : 1};
  comm.allreduce_i64(bad, ReduceOp::kSum, "checkpoint verification all-reduce");
  if (bad[0] > 0) {
    if (!p.lines.empty()) throw Error(p.lines.front(), ErrorKind::kBadInput);
    Error e("checkpoint " + path + " failed verification on another rank", ErrorKind::kBadInput);
    e.set_secondary();
    throw e;
  }
  for (auto& [name, tensor] : into.buffers) {
    const std::vector<float>& src = staged.at(name);
    std::memcpy(tensor->data_as<float>() + (tb - into.begin), src.data(), src.size() * sizeof(float));
    if (replicated && comm.world_size() > 1)
      comm.allgather_inplace_async(tensor->data(), counts, DType::kFloat32, "checkpoint load all-gather")->wait();
  }
  return m;
}

std::optional<std::string> find_latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  const fs::path latest = fs::path(dir) / "latest";
  if (fs::exists(latest, ec)) {
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    const fs::path p = fs::path(dir) / name;
    if (step_of(name) >= 0 && verify_checkpoint(p.string()).empty()) return p.string();
  }
  auto all = complete_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (verify_checkpoint(it->second).empty()) return it->second;
  return std::nullopt;
}

std::string whole_checkpoint_problem(const std::string& path) {
  try {
    const Manifest m = read_manifest(path);
    if (m.shards_size() != m.world_size())
      return (fs::path(path) / "manifest.pb").string() + ": lists " + std::to_string(m.shards_size()) +
             " shards for world size " + std::to_string(m.world_size());
    std::error_code ec;
    for (const ShardFileInfo& s : m.shards()) {
      const fs::path f = fs::path(path) / s.file();
      if (!fs::is_regular_file(f, ec)) return f.string() + ": missing";
      const auto size = static_cast<int64_t>(fs::file_size(f, ec));
      if (size != s.bytes())
        return f.string() + ": " + std::to_string(size) + " bytes, the manifest lists " + std::to_string(s.bytes());
    }
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

ResumeScan scan_for_resume(const std::string& dir) {
  std::vector<std::string> order;
  std::error_code ec;
  const fs::path latest = fs::path(dir) / "latest";
  if (fs::exists(latest, ec)) {
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    if (step_of(name) >= 0 && fs::is_directory(fs::path(dir) / name, ec)) order.push_back((fs::path(dir) / name).string());
  }
  // Every step_* directory, a manifest or not: one without is damaged too (a save publishes the manifest before the
  // directory gets its step_* name).
  std::vector<std::pair<int64_t, std::string>> all;
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const int64_t s = step_of(e.path().filename().string());
      if (s >= 0 && e.is_directory(ec)) all.emplace_back(s, e.path().string());
    }
  std::sort(all.begin(), all.end());
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (std::find(order.begin(), order.end(), it->second) == order.end()) order.push_back(it->second);
  ResumeScan out;
  for (const std::string& path : order) {
    std::string problem = whole_checkpoint_problem(path);
    if (problem.empty())
      out.candidates.push_back(path);
    else
      out.damaged.emplace_back(path, std::move(problem));
  }
  return out;
}

bool is_moved_aside(const std::string& dirname) {
  const size_t dot = dirname.find(".damaged");
  if (dot != 13 || step_of(dirname.substr(0, 13)) < 0) return false;
  const std::string rest = dirname.substr(dot + 8);  // "" or ".N"
  return rest.empty() || (rest.size() > 1 && rest[0] == '.' &&
                          std::all_of(rest.begin() + 1, rest.end(), [](char c) { return c >= '0' && c <= '9'; }));
}

std::string move_aside_damaged(const std::string& path) {
  const fs::path from = fs::path(path).lexically_normal();
  // RENAME_NOREPLACE: never onto anything already there (an earlier damaged copy of the same step keeps its name).
  for (int n = 1;; ++n) {
    const std::string to = from.string() + ".damaged" + (n == 1 ? "" : "." + std::to_string(n));
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
      fsync_path(from.parent_path().string());
      return to;
    }
    if (errno != EEXIST || n >= 1000)
      throw Error("cannot move the damaged checkpoint " + from.string() + " aside to " + to + ": " + errno_text());
  }
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

#include "runtime/checkpoint/shard_format.h"

#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/checkpoint/checkpoint.h"  // kMaxRecordBytes
#include "runtime/core/error.h"

namespace ampdist::ckpt {

namespace fs = std::filesystem;
namespace pbio = google::protobuf::io;

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

int64_t default_record_elements() { return kMaxRecordBytes / static_cast<int64_t>(sizeof(float)); }

// Records of each buffer over [begin, begin + count) in chunks of per_record elements: (offset, count) in order.
std::vector<std::pair<int64_t, int64_t>> record_ranges(int64_t begin, int64_t count, int64_t per_record) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t off = begin; off < begin + count; off += per_record) out.emplace_back(off, std::min(per_record, begin + count - off));
  return out;
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

}  // namespace ampdist::ckpt

// The pieces of the checkpoint format and of its durable file I/O that the writer (checkpoint_writer.cc), the
// reader (checkpoint_reader.cc) and resume discovery (discovery.cc) share. Internal to runtime/checkpoint/: the
// interface is checkpoint.h. A shard is a sequence of length-delimited ShardRecord protobufs
// (proto/ampdist/checkpoint.proto); errors are Error / BadInput naming the file, or lines of Problems.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ampdist/checkpoint.pb.h"

namespace ampdist::ckpt {

static_assert(std::endian::native == std::endian::little, "shard payloads are little-endian FP32");

inline constexpr int kFormatVersion = 1;

// ---- durable file I/O ------------------------------------------------------------------------------------------
std::string errno_text();  // strerror(errno)
// Writes all of `data` to `fd`; false with errno set on failure (a full disk included).
bool write_all(int fd, const char* data, size_t n);
// fsync of a file or directory by path (for a directory: its entries); nothing when it cannot be opened.
void fsync_path(const std::string& path);
// Writes `contents` to `path` (O_TRUNC), fsynced. Throws Error naming the file.
void write_file_durably(const std::string& path, const std::string& contents);
// The whole file, in one read. Throws BadInput naming the file.
std::string read_file(const std::string& path);

// ---- names and records -----------------------------------------------------------------------------------------
// "shard_RRRRR_of_WWWWW.pb".
std::string shard_name(int rank, int world);
// Appends protobuf's base-128 varint of v (a record's length prefix, a varint field's value).
void append_varint(std::string& out, uint64_t v);
// Elements per record when the state does not say: kMaxRecordBytes of FP32.
int64_t default_record_elements();
// Records of each buffer over [begin, begin + count) in chunks of per_record elements: (offset, count) in order.
std::vector<std::pair<int64_t, int64_t>> record_ranges(int64_t begin, int64_t count, int64_t per_record);
// The run id of a shard file's first record (read from its first bytes only), when it parses that far.
std::optional<std::string> shard_run_id(const std::string& file);
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
bool read_record_fields(int fd, int64_t pos, int64_t len, RecordFields& r);

// ---- problems and discovery ------------------------------------------------------------------------------------
// What is wrong with a checkpoint, one line each (collected, not thrown).
struct Problems {
  std::vector<std::string> lines;
  void add(const std::string& s) { lines.push_back(s); }
};
// Whether a shard file exists, is a regular file and has the size the manifest records; adds the problem if not.
bool shard_file_ok(const std::string& file, const ShardFileInfo& info, Problems& p);
// The step of a directory named step_NNNNNNNN, or -1.
int64_t step_of(const std::string& dirname);
// Every complete checkpoint (step, path) under dir, ascending by step.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& dir);

}  // namespace ampdist::ckpt

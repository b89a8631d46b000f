// The checkpoint files' streaming I/O (runtime/checkpoint/direct_io.h): what the writer leaves in the file and what
// the reader hands back are exactly the bytes given, whatever their sizes against the 4096-byte alignment and the
// 8 MiB blocks, with O_DIRECT (where the test directory's file system takes it) and without.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "runtime/checkpoint/direct_io.h"
#include "runtime/core/error.h"

namespace ampdist::ckpt {
namespace {

namespace fs = std::filesystem;

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class DirectIo : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ampdist_direct_io_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// Sizes around the alignment and the block: the tail block is padded for O_DIRECT and cut back by ftruncate.
TEST_P(DirectIo, WriterLeavesExactlyTheAppendedBytes) {
  const size_t block = kStreamBlockBytes;
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, block - 1, block, block + 4097,
                   2 * block + 123}) {
    SCOPED_TRACE(n);
    const std::string want = random_bytes(n, static_cast<uint32_t>(n));
    const std::string path = (dir_ / "shard.pb").string();
    {
      ShardFileWriter w(path, GetParam());
      if (!GetParam()) {
        EXPECT_FALSE(w.direct());
      }
      // Pieces of uneven sizes, as the shard writer appends a record's header, payload chunks and trailer.
      size_t at = 0, piece = 7;
      while (at < n) {
        const size_t len = std::min(piece, n - at);
        w.append(want.data() + at, len);
        at += len;
        piece = piece * 3 + 1001;
      }
      EXPECT_EQ(w.bytes(), static_cast<int64_t>(n));
      w.finish();
    }
    EXPECT_EQ(fs::file_size(path), n);
    EXPECT_TRUE(file_bytes(path) == want);
  }
}

TEST_P(DirectIo, ReaderHandsBackEachPlannedRangeInOrder) {
  const size_t block = kStreamBlockBytes;
  const size_t n = 2 * block + 5000;
  const std::string want = random_bytes(n, 7);
  const std::string path = (dir_ / "shard.pb").string();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(want.data(), static_cast<std::streamsize>(n));
  }
  // Unaligned starts and ends, one across a block boundary, an empty one, one ending at the end of the file.
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {3, 100}, {4090, 12}, {5000, 0}, {static_cast<int64_t>(block) - 17, 40000}, {static_cast<int64_t>(n) - 777, 777}};
  ShardFileReader r(path, ranges, GetParam());
  ASSERT_TRUE(r.ok()) << r.error();
  if (!GetParam()) {
    EXPECT_FALSE(r.direct());
  }
  for (const auto& [off, len] : ranges) {
    std::string got;
    ASSERT_TRUE(r.consume(off, len, [&](const char* p, size_t k) { got.append(p, k); })) << off;
    EXPECT_TRUE(got == want.substr(static_cast<size_t>(off), static_cast<size_t>(len))) << off;
  }
  // Nothing is planned after the last range.
  EXPECT_FALSE(r.consume(0, 1, [](const char*, size_t) {}));
}

TEST_P(DirectIo, ReaderRefusesARangePastTheEndAndOneOutOfOrder) {
  const std::string path = (dir_ / "short.pb").string();
  {
    std::ofstream out(path, std::ios::binary);
    out << random_bytes(10000, 3);
  }
  ShardFileReader past(path, {{9000, 2000}}, GetParam());
  ASSERT_TRUE(past.ok());
  EXPECT_FALSE(past.consume(9000, 2000, [](const char*, size_t) {}));  // a truncated shard

  ShardFileReader order(path, {{0, 10}, {100, 10}}, GetParam());
  EXPECT_FALSE(order.consume(100, 10, [](const char*, size_t) {}));
  EXPECT_FALSE(order.consume(0, 10, [](const char*, size_t) {}));  // after a refusal nothing more is read
}

TEST_P(DirectIo, AMissingFileAndAFullDiskAreErrorsNamingTheFile) {
  ShardFileReader missing((dir_ / "absent.pb").string(), {{0, 1}}, GetParam());
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("No such file"), std::string::npos) << missing.error();
  EXPECT_THROW(ShardFileWriter((dir_ / "no_dir" / "x.pb").string(), GetParam()), Error);

  // /dev/full refuses every write with ENOSPC, as a full disk does.
  try {
    ShardFileWriter w("/dev/full", GetParam());
    const std::string bytes = random_bytes(kStreamBlockBytes + 10, 1);
    w.append(bytes.data(), bytes.size());
    w.finish();
    FAIL() << "a write to /dev/full succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: write failed: No space left on device"), std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, DirectIo, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Direct" : "Buffered"; });

}  // namespace
}  // namespace ampdist::ckpt

// Regression tests for the bugs the fuzz targets found (tests/fuzz/, inputs in tests/fuzz/regressions/): each test
// gives the library the checkpoint of one such input and expects a clean ampdist::Error of kind kBadInput, or a
// listed problem, where the library used to crash, allocate what the file said or read forever.
//
// The checkpoints are built from the committed 1-rank reference checkpoint tests/fuzz/data/ckpt_sgd_1rank (SGD with
// momentum: buffers master and momentum, 51 elements each, one shard of 2 records), with the manifest rewrapped so
// that its XXH3 matches and, where a shard changes, the manifest's size, hash and record count of it updated: the
// same files the fuzz harness writes for those inputs.
#include <gtest/gtest.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/unit/solo_comm.h"
#include "ampdist/checkpoint.pb.h"
#include "comm/communicator.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"

namespace ampdist {
namespace {

namespace fs = std::filesystem;
namespace pbio = google::protobuf::io;

const fs::path kReference = fs::path(__FILE__).parent_path().parent_path() / "fuzz" / "data" / "ckpt_sgd_1rank";
const char* kShard = "shard_00000_of_00001.pb";

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

using testing::SoloComm;  // one rank alone: load_checkpoint's collectives are identities

class FuzzRegressionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kReference / "manifest.pb")) << kReference;
    dir_ = fs::temp_directory_path() /
           ("ampdist_fuzz_regression_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    manifest_ = read_manifest(kReference.string());
    records_ = parse_records(read_bytes(kReference / kShard));
    ASSERT_EQ(manifest_.numel(), 51);
    ASSERT_EQ(records_.size(), 2u);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::vector<ShardRecord> parse_records(const std::string& shard) {
    std::vector<ShardRecord> out;
    pbio::CodedInputStream cis(reinterpret_cast<const uint8_t*>(shard.data()), static_cast<int>(shard.size()));
    uint32_t len = 0;
    while (cis.ReadVarint32(&len)) {
      ShardRecord r;
      const auto limit = cis.PushLimit(static_cast<int>(len));
      EXPECT_TRUE(r.ParseFromCodedStream(&cis));
      cis.PopLimit(limit);
      out.push_back(r);
    }
    return out;
  }

  // Writes `m` as manifest.pb with the right XXH3.
  void write_manifest(const Manifest& m) {
    ManifestFile mf;
    mf.set_manifest(m.SerializeAsString());
    mf.set_xxh3(XXH3_64bits(mf.manifest().data(), mf.manifest().size()));
    write_bytes(dir_ / "manifest.pb", mf.SerializeAsString());
  }

  // The reference shard, unchanged, with manifest `m`.
  void write_with_reference_shard(const Manifest& m) {
    fs::copy_file(kReference / kShard, dir_ / kShard, fs::copy_options::overwrite_existing);
    write_manifest(m);
  }

  // A shard of `records` (each record's XXH3 recomputed) and manifest `m` updated to describe it.
  void write_with_records(Manifest m, std::vector<ShardRecord> records) {
    std::string shard;
    {
      pbio::StringOutputStream sos(&shard);
      pbio::CodedOutputStream cos(&sos);
      for (ShardRecord& r : records) {
        r.set_xxh3(XXH3_64bits(r.data().data(), r.data().size()));
        cos.WriteVarint32(static_cast<uint32_t>(r.ByteSizeLong()));
        r.SerializeWithCachedSizes(&cos);
      }
    }
    write_bytes(dir_ / kShard, shard);
    ShardFileInfo* info = m.mutable_shards(0);
    info->set_bytes(static_cast<int64_t>(shard.size()));
    info->set_xxh3(XXH3_64bits(shard.data(), shard.size()));
    info->set_records(static_cast<int64_t>(records.size()));
    write_manifest(m);
  }

  std::string path() const { return dir_.string(); }

  // Loads into a state shaped as the reference model (51-element buffers master and momentum).
  void load_into_reference_model() {
    std::vector<Tensor> tensors;
    CheckpointState state;
    state.meta = manifest_;
    for (int i = 0; i < manifest_.buffers_size(); ++i) tensors.push_back(Tensor::zeros({51}, DType::kFloat32));
    for (int i = 0; i < manifest_.buffers_size(); ++i)
      state.buffers.emplace_back(manifest_.buffers(i), &tensors[static_cast<size_t>(i)]);
    SoloComm comm;
    load_checkpoint(comm, path(), state);
  }

  fs::path dir_;
  Manifest manifest_;
  std::vector<ShardRecord> records_;
};

// Expects `f` to throw ampdist::Error of kind kBadInput whose message contains `needle`.
template <typename F>
void expect_bad_input(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown, expected one containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

bool any_contains(const std::vector<std::string>& lines, const std::string& needle) {
  for (const std::string& l : lines)
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

TEST_F(FuzzRegressionTest, ReferenceCheckpointVerifies) {
  write_with_reference_shard(manifest_);
  EXPECT_TRUE(verify_checkpoint(path()).empty());
  EXPECT_EQ(read_checkpoint_buffer(path(), "master").size(), 51u);
  load_into_reference_model();
}

// regressions/fuzz_checkpoint/fuzzer_numel_read_checkpoint_buffer_oom, numel_huge: read_checkpoint_buffer and
// load_checkpoint allocated numel floats per buffer, from the manifest, before reading a shard (std::bad_alloc,
// or the OOM killer).
TEST_F(FuzzRegressionTest, HugeNumelIsRefusedBeforeAllocating) {
  Manifest m = manifest_;
  m.set_numel(int64_t{1} << 40);
  write_with_reference_shard(m);
  EXPECT_FALSE(verify_checkpoint(path()).empty());
  expect_bad_input([&] { read_checkpoint_buffer(path(), "master"); }, "more than the shard files hold");
  expect_bad_input([&] { load_into_reference_model(); }, "elements per buffer");
}

// regressions/fuzz_checkpoint/numel_negative: a negative numel became a huge size_t (std::length_error).
TEST_F(FuzzRegressionTest, NegativeNumelIsRefused) {
  Manifest m = manifest_;
  m.set_numel(-5);
  write_with_reference_shard(m);
  expect_bad_input([&] { read_manifest(path()); }, "numel -5 is negative");
  expect_bad_input([&] { read_checkpoint_buffer(path(), "master"); }, "numel -5 is negative");
  EXPECT_EQ(verify_checkpoint(path()).size(), 1u);
}

// regressions/fuzz_checkpoint/world_size_huge: verify allocated world_size slice counts (16 GB for 2e9).
TEST_F(FuzzRegressionTest, HugeWorldSizeIsAProblemNotAnAllocation) {
  Manifest m = manifest_;
  m.set_world_size(2000000000);
  write_with_reference_shard(m);
  EXPECT_TRUE(any_contains(verify_checkpoint(path()), "lists 1 shards for a world of 2000000000"));
  expect_bad_input([&] { read_checkpoint_buffer(path(), "master"); }, "world of 2000000000");
}

// regressions/fuzz_checkpoint/shard_dev_zero: a shard named "/dev/zero" whose manifest size is -1 (what
// file_size says of a device) was read until memory ran out; a FIFO would block forever.
TEST_F(FuzzRegressionTest, ShardOutsideTheDirectoryIsRefused) {
  for (const char* name : {"/dev/zero", "../shard_00000_of_00001.pb", "", ".", ".."}) {
    Manifest m = manifest_;
    m.mutable_shards(0)->set_file(name);
    m.mutable_shards(0)->set_bytes(-1);
    write_with_reference_shard(m);
    expect_bad_input([&] { read_manifest(path()); }, "is not a file name in the checkpoint directory");
    EXPECT_EQ(verify_checkpoint(path()).size(), 1u) << name;
  }
}

// The same through a link in the checkpoint directory: not a regular file, never read.
TEST_F(FuzzRegressionTest, ShardThatIsNotARegularFileIsAProblem) {
  Manifest m = manifest_;
  m.mutable_shards(0)->set_bytes(-1);
  write_manifest(m);
  fs::create_symlink("/dev/zero", dir_ / kShard);
  EXPECT_TRUE(any_contains(verify_checkpoint(path()), "not a regular file"));
  expect_bad_input([&] { read_checkpoint_buffer(path(), "master"); }, "not a regular file");
}

// regressions/fuzz_checkpoint/record_count_overflow: count * 4 overflowed int64 (undefined behaviour) and wrapped
// to the data size, so the record passed its size check.
TEST_F(FuzzRegressionTest, RecordCountOverflowIsAProblem) {
  std::vector<ShardRecord> r = records_;
  r[0].set_count((int64_t{1} << 62) + r[0].count());
  write_with_records(manifest_, r);
  EXPECT_TRUE(any_contains(verify_checkpoint(path()), "record 0 (master) fails its XXH3 check"));
  expect_bad_input([&] { read_checkpoint_buffer(path(), "master"); }, "fails its XXH3 check");
}

// regressions/fuzz_checkpoint/record_offset_overflow: offset + count overflowed int64, passed the slice check, and
// the record was copied to buffer + offset (a write far outside the buffer).
TEST_F(FuzzRegressionTest, RecordOffsetOverflowIsAProblem) {
  std::vector<ShardRecord> r = records_;
  r[0].set_offset(INT64_MAX - 2);
  write_with_records(manifest_, r);
  EXPECT_TRUE(any_contains(verify_checkpoint(path()), "record 0 lies outside rank 0's slice"));
  expect_bad_input([&] { read_checkpoint_buffer(path(), "master"); }, "outside rank 0's slice");
  expect_bad_input([&] { load_into_reference_model(); }, "outside rank 0's slice");
}

// regressions/fuzz_checkpoint/numel_plus16_load_overflow: a whole, verifying checkpoint of 67 elements per buffer
// with the reference model's tensor index: load_checkpoint compared the tensors but not numel, and copied 67 floats
// into each 51-element buffer (heap overflow).
TEST_F(FuzzRegressionTest, LoadRefusesANumelOtherThanTheModels) {
  Manifest m = manifest_;
  m.set_numel(67);
  std::vector<ShardRecord> r = records_;
  for (ShardRecord& rec : r) {
    rec.set_count(67);
    rec.set_data(rec.data() + std::string(16 * sizeof(float), '\0'));
  }
  write_with_records(m, r);
  EXPECT_TRUE(verify_checkpoint(path()).empty());
  EXPECT_EQ(read_checkpoint_buffer(path(), "master").size(), 67u);
  expect_bad_input([&] { load_into_reference_model(); }, "67 elements per buffer, this model has 51");
}

}  // namespace
}  // namespace ampdist

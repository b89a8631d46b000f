// libFuzzer target: the checkpoint manifest and shard reader (runtime/checkpoint/checkpoint.h).
//
// Two reference checkpoints made by `ampdist train` (tests/fuzz/data/: ckpt_sgd_1rank, 1 shard, buffers master and
// momentum; ckpt_adamw_2ranks, 2 shards, master, exp_avg, exp_avg_sq; 51 elements each) provide the valid files.
// The input's byte 0 is flags, the rest is one file:
//   bits 0-1  mode
//     0: the rest is manifest.pb as it is on disk (a ManifestFile);
//     1: the rest is a serialized Manifest; the harness wraps it in a ManifestFile with the right XXH3, so
//        mutations get past the manifest's hash to the fields (world size, numel, shard list, buffers, ...);
//     2: the rest is a shard file; the harness writes the reference manifest with that shard's size, XXH3 and
//        record count, so mutations get past the shard's file hash to the record parser;
//     3: as 2, and the harness also recomputes each record's XXH3 over its data (records that parse), so
//        mutations get past the record hashes to the offset, count and coverage checks and the copies.
//   bits 2-3  modes 0, 1: which reference shard files are in the directory: bit 2 the 1-rank one's, bit 3 the
//             2-rank one's; the 2-rank checkpoint is the reference for loading when only bit 3 is set.
//             modes 2, 3: 0 or 1: the 1-rank checkpoint's shard 0 is replaced; 2: the 2-rank checkpoint's shard
//             0; 3: its shard 1.
//   bits 4-7  modes 2, 3: a signed nibble v (-8 .. 7); 16 * v is added to the manifest's numel (16 elements: more
//             than the 64-byte rounding of tensor allocations, so a copy past a buffer's end reaches ASan).
// Each input then goes through read_manifest, verify_checkpoint, read_checkpoint_buffer("master") and
// load_checkpoint (one rank, into a state shaped as the reference model). ampdist::Error is the expected outcome
// of bad input; any other exception, a crash, a sanitizer report, a hang or a huge allocation is a finding, and so
// are an Error escaping verify_checkpoint (it lists problems) and a checkpoint that verify_checkpoint passes but
// read_checkpoint_buffer rejects.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ampdist/checkpoint.pb.h"
#include "comm/communicator.h"
#include "fuzz_common.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"

namespace {

namespace pbio = google::protobuf::io;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_checkpoint: %s\n", what.c_str());
  std::abort();
}

// One rank alone: the collectives load_checkpoint uses are identities.
class SoloComm : public ampdist::Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::unique_ptr<ampdist::Work> allreduce_async(void*, int64_t, ampdist::DType, ampdist::ReduceOp,
                                                 const std::string& what) override {
    finding("unexpected collective " + what);
  }
  std::unique_ptr<ampdist::Work> reduce_scatter_async(const void*, void*, std::span<const int64_t>, ampdist::DType,
                                                      const std::string& what) override {
    finding("unexpected collective " + what);
  }
  std::unique_ptr<ampdist::Work> allgather_inplace_async(void*, std::span<const int64_t>, ampdist::DType,
                                                         const std::string& what) override {
    finding("unexpected collective " + what);
  }
  void allreduce_f64(std::span<double>, ampdist::ReduceOp, const std::string&) override {}
  void allreduce_i64(std::span<int64_t>, ampdist::ReduceOp, const std::string&) override {}
  std::vector<uint64_t> allgather_u64(uint64_t value, const std::string&) override { return {value}; }
  void barrier(const std::string&) override {}
  [[noreturn]] void abort(int) override { finding("Communicator::abort"); }
  void set_step(int64_t) override {}
  const ampdist::CommStats& stats() const override { return stats_; }

 private:
  ampdist::CommStats stats_;
};

struct Reference {
  std::string dir;
  ampdist::Manifest manifest;
  std::vector<std::pair<std::string, std::string>> shards;  // file name, bytes
  std::vector<ampdist::Tensor> tensors;                     // the load target's buffers
  ampdist::CheckpointState state;                           // the load target: the reference model
};

Reference load_reference(const std::string& name) {
  Reference r;
  r.dir = std::string(AMPDIST_SOURCE_DIR) + "/tests/fuzz/data/" + name;
  r.manifest = ampdist::read_manifest(r.dir);
  for (const ampdist::ShardFileInfo& s : r.manifest.shards())
    r.shards.emplace_back(s.file(), ampdist_fuzz::read_whole(r.dir + "/" + s.file()));
  r.state.meta = r.manifest;
  for (int i = 0; i < r.manifest.buffers_size(); ++i)
    r.tensors.push_back(ampdist::Tensor::zeros({r.manifest.numel()}, ampdist::DType::kFloat32));
  return r;
}

// The two references, built once; state.buffers point into tensors, so they are filled in place.
std::vector<Reference>& references() {
  static std::vector<Reference> refs = [] {
    std::vector<Reference> v;
    v.push_back(load_reference("ckpt_sgd_1rank"));
    v.push_back(load_reference("ckpt_adamw_2ranks"));
    for (Reference& r : v)
      for (int i = 0; i < r.manifest.buffers_size(); ++i)
        r.state.buffers.emplace_back(r.manifest.buffers(i), &r.tensors[static_cast<size_t>(i)]);
    return v;
  }();
  return refs;
}

std::string wrap_manifest(const std::string& manifest_bytes) {
  ampdist::ManifestFile mf;
  mf.set_manifest(manifest_bytes);
  mf.set_xxh3(XXH3_64bits(manifest_bytes.data(), manifest_bytes.size()));
  return mf.SerializeAsString();
}

// Length-delimited chunks of a shard file, as the reader walks them.
int64_t count_records(const std::string& shard) {
  pbio::CodedInputStream cis(reinterpret_cast<const uint8_t*>(shard.data()), static_cast<int>(shard.size()));
  int64_t n = 0;
  uint32_t len = 0;
  while (cis.ReadVarint32(&len) && len <= static_cast<uint32_t>(INT32_MAX) && cis.Skip(static_cast<int>(len))) ++n;
  return n;
}

// The shard with each record that parses re-serialized with xxh3 = XXH3(data); other bytes kept as they are.
std::string fix_record_hashes(const std::string& shard) {
  std::string out;
  pbio::CodedInputStream cis(reinterpret_cast<const uint8_t*>(shard.data()), static_cast<int>(shard.size()));
  uint32_t len = 0;
  while (true) {
    const int start = cis.CurrentPosition();
    if (!cis.ReadVarint32(&len)) break;
    const int body = cis.CurrentPosition();
    if (len > shard.size() - static_cast<size_t>(body)) {
      out.append(shard, static_cast<size_t>(start));  // a record cut short: the rest, as it is
      return out;
    }
    ampdist::ShardRecord rec;
    if (rec.ParseFromArray(shard.data() + body, static_cast<int>(len))) {
      rec.set_xxh3(XXH3_64bits(rec.data().data(), rec.data().size()));
      std::string enc;
      {
        pbio::StringOutputStream sos(&enc);
        pbio::CodedOutputStream cos(&sos);
        cos.WriteVarint32(static_cast<uint32_t>(rec.ByteSizeLong()));
        rec.SerializeWithCachedSizes(&cos);
      }
      out += enc;
    } else {
      out.append(shard, static_cast<size_t>(start), static_cast<size_t>(body - start) + len);
    }
    cis.Skip(static_cast<int>(len));
  }
  out.append(shard, static_cast<size_t>(cis.CurrentPosition()));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ampdist_fuzz::quiet_protobuf();
  references();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const int mode = flags & 3, ref = (flags >> 2) & 3;
  const int delta = 16 * (static_cast<int8_t>(flags & 0xF0) >> 4);
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<Reference>& refs = references();
  const std::string dir = ampdist_fuzz::scratch_dir("checkpoint") + "/step_00000004";
  ampdist_fuzz::reset_dir(dir);

  Reference* base = nullptr;
  if (mode <= 1) {
    for (int i = 0; i < 2; ++i)
      if (ref & (1 << i))
        for (const auto& [file, bytes] : refs[static_cast<size_t>(i)].shards)
          ampdist_fuzz::write_file(dir + "/" + file, bytes);
    base = &refs[ref == 2 ? 1 : 0];
    ampdist_fuzz::write_file(dir + "/manifest.pb", mode == 0 ? body : wrap_manifest(body));
  } else {
    base = &refs[ref <= 1 ? 0 : 1];
    const size_t replaced = ref == 3 ? 1 : 0;
    const std::string shard = mode == 3 ? fix_record_hashes(body) : body;
    ampdist::Manifest m = base->manifest;
    m.set_numel(m.numel() + delta);
    for (size_t i = 0; i < base->shards.size(); ++i) {
      const auto& [file, bytes] = base->shards[i];
      ampdist_fuzz::write_file(dir + "/" + file, i == replaced ? shard : bytes);
    }
    ampdist::ShardFileInfo* info = m.mutable_shards(static_cast<int>(replaced));
    info->set_bytes(static_cast<int64_t>(shard.size()));
    info->set_xxh3(XXH3_64bits(shard.data(), shard.size()));
    info->set_records(count_records(shard));
    ampdist_fuzz::write_file(dir + "/manifest.pb", wrap_manifest(m.SerializeAsString()));
  }

  bool verified = false;
  try {
    verified = ampdist::verify_checkpoint(dir).empty();
  } catch (const ampdist::Error& e) {
    finding(std::string("verify_checkpoint threw instead of listing the problem: ") + e.what());
  }
  try {
    const ampdist::Manifest m = ampdist::read_manifest(dir);
    const bool has_master = std::find(m.buffers().begin(), m.buffers().end(), "master") != m.buffers().end();
    try {
      const std::vector<float> master = ampdist::read_checkpoint_buffer(dir, "master");
      if (static_cast<int64_t>(master.size()) != m.numel()) finding("read_checkpoint_buffer: size is not numel");
    } catch (const ampdist::Error& e) {
      if (verified && has_master)
        finding(std::string("verify_checkpoint passed, read_checkpoint_buffer failed: ") + e.what());
    }
  } catch (const ampdist::Error&) {
  }
  SoloComm comm;
  try {
    (void)ampdist::load_checkpoint(comm, dir, base->state);
  } catch (const ampdist::Error&) {
  }
  return 0;
}

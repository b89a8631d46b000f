#include "launch/ckpt_command.h"

#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"
#include "runtime/train/loop.h"  // hex16

namespace ampdist {
namespace {

namespace fs = std::filesystem;

void print_error(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "ampdist: error: %s\n", message.c_str());
  std::fflush(stderr);
}

// Runs one tool, turning its exceptions into the one error line and the exit code.
template <typename F>
int guarded(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    print_error(e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
}

bool is_step_dir(const fs::path& p) {
  const std::string n = p.filename().string();
  if (n.rfind("step_", 0) != 0 || n.size() != 13) return false;
  return std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The step_* directories directly under `dir`, ascending.
std::vector<std::string> step_dirs(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_step_dir(e.path()) && e.is_directory(ec)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool has_manifest(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "manifest.pb", ec);
}

// PATH as a checkpoint: itself when it holds a manifest, else the newest complete checkpoint under it.
std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw BadInput(path, "no such checkpoint directory");
  if (has_manifest(path)) return path;
  if (std::optional<std::string> latest = find_latest_checkpoint(path)) return *latest;
  if (!step_dirs(path).empty())
    throw BadInput(path, "no complete checkpoint verifies (see ampdist ckpt verify " + path + ")");
  throw BadInput(path, "not a checkpoint (no manifest.pb) nor a directory of checkpoints");
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

Shape shape_of(const TensorIndexEntry& t) { return Shape(t.shape().begin(), t.shape().end()); }

// Rows of cells printed as a table with left-aligned text and right-aligned numbers (cells that start with a digit).
void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  for (size_t k = 0; k < rows.size(); ++k) {
    std::string line;
    for (size_t i = 0; i < rows[k].size(); ++i) {
      const std::string& c = rows[k][i];
      const bool num = k > 0 && !c.empty() && c[0] >= '0' && c[0] <= '9' && c.find('[') == std::string::npos;
      line += "  " + (num ? fmt::format("{:>{}}", c, width[i]) : fmt::format("{:<{}}", c, width[i]));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::cout << line << "\n";
  }
}

// Writes `n` bytes, false with errno set on failure.
bool write_all(std::FILE* f, const void* data, size_t n) { return std::fwrite(data, 1, n, f) == n; }

}  // namespace

int run_ckpt_inspect(const CkptArgs& args) {
  return guarded([&] {
    const std::string path = resolve_checkpoint(args.path);
    const Manifest m = read_manifest(path);
    std::string buffers;
    for (const std::string& b : m.buffers()) buffers += (buffers.empty() ? "" : ", ") + b;
    const auto& sc = m.scaler();
    std::cout << "checkpoint: " << path << "\n";
    std::cout << fmt::format("step: {}\n", m.step());
    std::cout << fmt::format("epoch: {} (step {} of the epoch)\n", m.epoch(), m.step_in_epoch());
    std::cout << fmt::format("world size at save: {}\n", m.world_size());
    std::cout << fmt::format("precision: {}\n", lower(DTypeName_Name(m.precision())));
    std::cout << fmt::format("global batch size: {}\n", m.global_batch_size());
    std::cout << fmt::format("config: {}\n", m.config().name());
    std::cout << fmt::format("run id: {}\n", m.run_id());
    std::cout << fmt::format("optimizer: {} (step count {})\n", m.optimizer(), m.optimizer_step_count());
    std::cout << fmt::format("loss scale: {:g} (growth tracker {}, hysteresis tracker {}, skipped steps {})\n",
                             sc.scale(), sc.growth_tracker(), sc.hysteresis_tracker(), sc.skipped_steps());
    std::cout << fmt::format("master weights hash: {}\n", hex16(m.master_xxh3()));
    std::cout << fmt::format("buffers: {} ({} elements each)\n", buffers, m.numel());
    if (m.buffer_tensors_size() > 0)
      std::cout << fmt::format("model buffers: {} tensors, {} values (BatchNorm running statistics, in the manifest)\n",
                               m.buffer_tensors_size(), m.buffer_values_size());

    std::cout << fmt::format("tensors: {}\n", m.tensors_size());
    std::vector<std::vector<std::string>> rows{{"name", "shape", "numel", "offset"}};
    for (const TensorIndexEntry& t : m.tensors())
      rows.push_back({t.name(), shape_str(shape_of(t)), std::to_string(t.numel()), std::to_string(t.offset())});
    print_table(rows);

    int64_t total = 0;
    rows = {{"file", "bytes", "records"}};
    for (const ShardFileInfo& s : m.shards()) {
      rows.push_back({s.file(), std::to_string(s.bytes()), std::to_string(s.records())});
      total += s.bytes();
    }
    std::cout << fmt::format("shards: {} ({} bytes)\n", m.shards_size(), total);
    print_table(rows);
    std::cout << std::flush;
    return 0;
  });
}

int run_ckpt_verify(const CkptArgs& args) {
  return guarded([&] {
    std::error_code ec;
    if (!fs::is_directory(args.path, ec)) throw BadInput(args.path, "no such checkpoint directory");
    // A directory of checkpoints (no manifest of its own, step_* inside): every one of them.
    std::vector<std::string> paths = has_manifest(args.path) ? std::vector<std::string>{} : step_dirs(args.path);
    if (paths.empty()) paths.push_back(args.path);
    int code = 0;
    for (const std::string& path : paths) {
      const std::vector<std::string> problems = verify_checkpoint(path);
      if (!problems.empty()) {
        for (const std::string& p : problems) print_error(p);
        code = 1;
        continue;
      }
      const Manifest m = read_manifest(path);
      int64_t bytes = static_cast<int64_t>(fs::file_size(fs::path(path) / "manifest.pb", ec));
      for (const ShardFileInfo& s : m.shards()) bytes += s.bytes();
      std::cout << fmt::format("ok: {} ({} shards, {} bytes verified)\n", path, m.shards_size(), bytes)
                << std::flush;
    }
    return code;
  });
}

int run_ckpt_export(const CkptArgs& args) {
  static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");
  return guarded([&] {
    if (args.format != "safetensors")
      throw BadInput("--format", "only safetensors is supported, got '" + args.format + "'");
    if (args.output.empty()) throw BadInput("-o", "an output file is required");
    std::error_code ec;
    if (fs::is_directory(args.output, ec)) throw BadInput(args.output, "is a directory (-o names the output file)");
    const std::string path = resolve_checkpoint(args.path);
    const Manifest m = read_manifest(path);
    const std::vector<float> master = read_checkpoint_buffer(path, "master");
    const std::string manifest_file = (fs::path(path) / "manifest.pb").string();

    // Header: tensors in the manifest's order, their data back to back in the same order.
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    header["__metadata__"] = {{"step", std::to_string(m.step())}, {"run_id", m.run_id()}, {"format", "pt"}};
    std::set<std::string> names;
    int64_t pos = 0;  // bytes
    for (const TensorIndexEntry& t : m.tensors()) {
      const Shape shape = shape_of(t);
      // The product in checked arithmetic: a crafted manifest must not overflow it into a plausible size.
      const int64_t limit = static_cast<int64_t>(master.size());
      int64_t numel = 1;
      bool fits = true;
      for (int64_t d : shape) {
        if (d < 0 || __builtin_mul_overflow(numel, d, &numel) || numel > limit) fits = false;
        if (!fits) break;
      }
      if (!fits) numel = -1;
      if (t.name().empty() || t.name() == "__metadata__" || !names.insert(t.name()).second)
        throw BadInput(manifest_file, "tensor name '" + t.name() + "' is empty, reserved or repeated");
      if (numel < 0 || numel != t.numel() || t.offset() < 0 || t.offset() > limit - numel)
        throw BadInput(manifest_file, "tensor " + t.name() + " " + shape_str(shape) + " at offset " +
                                          std::to_string(t.offset()) + " does not fit the master buffer of " +
                                          std::to_string(master.size()) + " elements");
      const int64_t bytes = numel * static_cast<int64_t>(sizeof(float));
      header[t.name()] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {pos, pos + bytes}}};
      pos += bytes;
    }
    // Model buffers (BatchNorm running statistics) from the manifest, after the parameters, under their names;
    // num_batches_tracked as PyTorch keeps it: an int64 scalar (shape []).
    const int64_t buffer_limit = m.buffer_values_size();
    std::vector<std::vector<unsigned char>> buffer_data;
    for (const TensorIndexEntry& t : m.buffer_tensors()) {
      const Shape shape = shape_of(t);
      if (t.name().empty() || t.name() == "__metadata__" || !names.insert(t.name()).second)
        throw BadInput(manifest_file, "buffer name '" + t.name() + "' is empty, reserved or repeated");
      if (t.numel() < 0 || t.numel() != shape_numel(shape) || t.offset() < 0 || t.offset() > buffer_limit - t.numel())
        throw BadInput(manifest_file, "buffer " + t.name() + " does not fit the manifest's buffer values");
      const float* v = m.buffer_values().data() + t.offset();
      std::vector<unsigned char> bytes;
      const bool counter = t.name().size() >= 20 && t.name().ends_with(".num_batches_tracked") && t.numel() == 1;
      if (counter) {
        const int64_t n = static_cast<int64_t>(v[0]);
        bytes.resize(sizeof n);
        std::memcpy(bytes.data(), &n, sizeof n);
        header[t.name()] = {{"dtype", "I64"}, {"shape", Shape{}}, {"data_offsets", {pos, pos + 8}}};
      } else {
        bytes.resize(static_cast<size_t>(t.numel()) * sizeof(float));
        std::memcpy(bytes.data(), v, bytes.size());
        header[t.name()] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {pos, pos + static_cast<int64_t>(bytes.size())}}};
      }
      pos += static_cast<int64_t>(bytes.size());
      buffer_data.push_back(std::move(bytes));
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
    const uint64_t header_len = text.size();

    const std::string tmp = args.output + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw BadInput(args.output, "cannot create " + tmp + ": " + std::strerror(errno));
    bool ok = write_all(f, &header_len, sizeof header_len) && write_all(f, text.data(), text.size());
    for (const TensorIndexEntry& t : m.tensors())
      ok = ok && write_all(f, master.data() + t.offset(), static_cast<size_t>(t.numel()) * sizeof(float));
    for (const auto& b : buffer_data) ok = ok && write_all(f, b.data(), b.size());
    ok = ok && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
    const std::string err = ok ? "" : std::strerror(errno);
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) {
      fs::remove(tmp, ec);
      throw Error(tmp + ": write failed: " + (err.empty() ? std::strerror(errno) : err));
    }
    fs::rename(tmp, args.output, ec);
    if (ec) {
      const std::string why = ec.message();
      fs::remove(tmp, ec);
      throw Error(args.output + ": cannot rename " + tmp + " to it: " + why);
    }
    std::cout << fmt::format("exported {} tensors ({} parameters, {} buffers, step {}) from {} to {} ({} bytes)\n",
                             m.tensors_size() + m.buffer_tensors_size(), m.numel(), m.buffer_tensors_size(),
                             m.step(), path, args.output, 8 + header_len + pos)
              << std::flush;
    return 0;
  });
}

}  // namespace ampdist

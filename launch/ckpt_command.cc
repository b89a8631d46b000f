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
#include "runtime/checkpoint/pretrained.h"
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

// The step_* directories directly under `dir`, and the damaged ones a run moved aside (step_*.damaged*), ascending.
std::vector<std::string> step_dirs(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if ((is_step_dir(e.path()) || is_moved_aside(e.path().filename().string())) && e.is_directory(ec))
      out.push_back(e.path().string());
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

namespace {

// One tensor of an export: its name in the file, shape, and its elements (FP32) in file order.
struct ExportTensor {
  std::string name;
  Shape shape;
  std::vector<float> data;  // filled only for tensors that are not a plain range of the master buffer
  const float* src = nullptr;
  int64_t numel = 0;
  std::string dtype = "F32";
  std::vector<unsigned char> raw;  // the stored bytes of a tensor that is not FP32 (dtype), else empty
};

// Writes `tensors` as one safetensors file at `file` (via file.tmp, fsync, rename). Returns the bytes written.
int64_t write_safetensors(const std::string& file, const std::vector<ExportTensor>& tensors,
                          const nlohmann::ordered_json& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = metadata;
  int64_t pos = 0;  // bytes
  for (const ExportTensor& t : tensors) {
    const int64_t bytes = t.raw.empty() ? t.numel * static_cast<int64_t>(sizeof(float)) : static_cast<int64_t>(t.raw.size());
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {pos, pos + bytes}}};
    pos += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const uint64_t header_len = text.size();
  std::error_code ec;
  const std::string tmp = file + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw BadInput(file, "cannot create " + tmp + ": " + std::strerror(errno));
  bool ok = write_all(f, &header_len, sizeof header_len) && write_all(f, text.data(), text.size());
  for (const ExportTensor& t : tensors) {
    if (!t.raw.empty())
      ok = ok && write_all(f, t.raw.data(), t.raw.size());
    else
      ok = ok && write_all(f, t.src ? t.src : t.data.data(), static_cast<size_t>(t.numel) * sizeof(float));
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const std::string err = ok ? "" : std::strerror(errno);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    fs::remove(tmp, ec);
    throw Error(tmp + ": write failed: " + (err.empty() ? std::strerror(errno) : err));
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw Error(file + ": cannot rename " + tmp + " to it: " + why);
  }
  return static_cast<int64_t>(8 + header_len) + pos;
}

void write_text_file(const std::string& file, const std::string& text) {
  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (!f) throw BadInput(file, std::string("cannot create: ") + std::strerror(errno));
  bool ok = write_all(f, text.data(), text.size()) && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw Error(file + ": write failed: " + std::strerror(errno));
}

}  // namespace

namespace {

// The master buffer's tensors in the manifest's order (their data point into `master`), checked against it: names
// unique and not reserved, sizes in checked arithmetic inside the buffer. hf: Hugging Face GPT-2's names and layout
// (the padded vocabulary rows dropped, Conv1D weights transposed). Adds each name to `names` and the parameters to
// `params`. Throws BadInput naming manifest_file.
std::vector<ExportTensor> export_parameters(const Manifest& m, const std::vector<float>& master, bool hf,
                                            const std::string& manifest_file, std::set<std::string>& names,
                                            int64_t& params) {
  const GptConfig& g = m.config().model().gpt();
  std::vector<ExportTensor> out;
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
    ExportTensor e{t.name(), shape, {}, master.data() + t.offset(), numel, "F32", {}};
    if (hf) {
      e.name = hf_gpt2_name(t.name());
      if (t.name() == "wte.weight" && shape.size() == 2 && shape[0] > g.vocab_size()) {
        e.shape[0] = g.vocab_size();  // the padded rows are not part of the model
        e.numel = e.shape[0] * e.shape[1];
      } else if (hf_gpt2_conv1d(t.name()) && shape.size() == 2) {
        // Conv1D stores [in, out]: the transpose of ampdist's Linear [out, in].
        const int64_t rows = shape[0], cols = shape[1];
        e.shape = {cols, rows};
        e.data.resize(static_cast<size_t>(numel));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) e.data[static_cast<size_t>(c * rows + r)] = e.src[r * cols + c];
        e.src = nullptr;
      }
    }
    params += e.numel;
    out.push_back(std::move(e));
  }
  return out;
}

// The model buffers (BatchNorm running statistics) from the manifest, after the parameters, under their names;
// num_batches_tracked as PyTorch keeps it: an int64 scalar (shape []).
void export_buffers(const Manifest& m, const std::string& manifest_file, std::set<std::string>& names,
                    std::vector<ExportTensor>& out) {
  const int64_t buffer_limit = m.buffer_values_size();
  for (const TensorIndexEntry& t : m.buffer_tensors()) {
    const Shape shape = shape_of(t);
    if (t.name().empty() || t.name() == "__metadata__" || !names.insert(t.name()).second)
      throw BadInput(manifest_file, "buffer name '" + t.name() + "' is empty, reserved or repeated");
    if (t.numel() < 0 || t.numel() != shape_numel(shape) || t.offset() < 0 || t.offset() > buffer_limit - t.numel())
      throw BadInput(manifest_file, "buffer " + t.name() + " does not fit the manifest's buffer values");
    const float* v = m.buffer_values().data() + t.offset();
    ExportTensor e{t.name(), shape, {}, v, t.numel(), "F32", {}};
    if (t.name().ends_with(".num_batches_tracked") && t.numel() == 1) {
      const int64_t n = static_cast<int64_t>(v[0]);
      e.shape = {};
      e.dtype = "I64";
      e.raw.resize(sizeof n);
      std::memcpy(e.raw.data(), &n, sizeof n);
      e.src = nullptr;
    }
    out.push_back(std::move(e));
  }
}

// A Hugging Face model directory (model.safetensors, config.json), written next to its final name and renamed into
// place; whatever fails (a full disk, a rename), the half-written directory goes. Returns the safetensors bytes.
int64_t write_hf_directory(const std::string& output, const std::vector<ExportTensor>& out,
                           const nlohmann::ordered_json& meta, const GptConfig& g) {
  std::error_code ec;
  const fs::path final_dir(output);
  const fs::path tmp = final_dir.string() + ".tmp";
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw BadInput(output, "cannot create " + tmp.string() + ": " + ec.message());
  int64_t bytes = 0;
  try {  // as the single file's .tmp goes
    bytes = write_safetensors((tmp / "model.safetensors").string(), out, meta);
    write_text_file((tmp / "config.json").string(), hf_gpt2_config_json(g));
    if (fs::exists(final_dir, ec)) fs::remove(final_dir, ec);  // an empty directory (the caller checked)
    fs::rename(tmp, final_dir, ec);
    if (ec) throw Error(output + ": cannot rename " + tmp.string() + " to it: " + ec.message());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  return bytes;
}

}  // namespace

int run_ckpt_export(const CkptArgs& args) {
  static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");
  return guarded([&] {
    if (args.format != "safetensors" && args.format != "hf")
      throw BadInput("--format", "must be safetensors or hf, got '" + args.format + "'");
    const bool hf = args.format == "hf";
    if (args.output.empty()) throw BadInput("-o", "an output file is required");
    std::error_code ec;
    if (!hf && fs::is_directory(args.output, ec))
      throw BadInput(args.output, "is a directory (-o names the output file)");
    if (hf && fs::exists(args.output, ec) && !(fs::is_directory(args.output, ec) && fs::is_empty(args.output, ec)))
      throw BadInput(args.output, "exists and is not an empty directory (-o names the new model directory)");
    const std::string path = resolve_checkpoint(args.path);
    const Manifest m = read_manifest(path);
    if (hf && !m.config().model().has_gpt())
      throw BadInput(path, "--format hf writes a GPT-2 model; this checkpoint's model is not a gpt");
    const std::vector<float> master = read_checkpoint_buffer(path, "master");
    const std::string manifest_file = (fs::path(path) / "manifest.pb").string();
    // Tensors in the manifest's order, their data back to back in the same order, then the model buffers.
    std::set<std::string> names;
    int64_t params = 0;
    std::vector<ExportTensor> out = export_parameters(m, master, hf, manifest_file, names, params);
    export_buffers(m, manifest_file, names, out);
    const nlohmann::ordered_json meta = {{"step", std::to_string(m.step())}, {"run_id", m.run_id()}, {"format", "pt"}};
    if (!hf) {
      const int64_t bytes = write_safetensors(args.output, out, meta);
      std::cout << fmt::format("exported {} tensors ({} parameters, {} buffers, step {}) from {} to {} ({} bytes)\n",
                               out.size(), params, m.buffer_tensors_size(), m.step(), path, args.output, bytes)
                << std::flush;
      return 0;
    }
    const int64_t bytes = write_hf_directory(args.output, out, meta, m.config().model().gpt());
    std::cout << fmt::format("exported {} tensors ({} parameters, step {}) from {} to {} as a Hugging Face GPT-2 "
                             "model (config.json, model.safetensors: {} bytes)\n",
                             out.size(), params, m.step(), path, args.output, bytes)
              << std::flush;
    return 0;
  });
}

}  // namespace ampdist

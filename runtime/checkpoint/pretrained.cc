#include "runtime/checkpoint/pretrained.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace ampdist {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kHfPrefix = "transformer.";
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // safetensors' own limit (100 MB)

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

std::string shape_text(const Shape& s) { return shape_str(s); }

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw BadInput(path, std::string("cannot open: ") + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    json j = json::parse(ss.str());
    if (!j.is_object()) throw BadInput(path, "is not a JSON object");
    return j;
  } catch (const json::exception& e) {
    throw BadInput(path, std::string("is not valid JSON: ") + e.what());
  }
}

// A causal-mask buffer of Hugging Face's GPT2Attention ("h.3.attn.bias", "h.3.attn.masked_bias"): not a parameter.
bool is_hf_mask_buffer(const std::string& n) {
  return starts_with(n, "h.") && (ends_with(n, ".attn.bias") || ends_with(n, ".attn.masked_bias"));
}

}  // namespace

// ---- safetensors ------------------------------------------------------------------------------------------------

namespace {

// The JSON header of a mapped safetensors file of `size` bytes: 8 bytes of little-endian length n, then n bytes of
// JSON object. Sets n. Throws BadInput naming the file.
json parse_safetensors_header(const std::string& path, const unsigned char* bytes, size_t size, uint64_t& n) {
  n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
  const bool looks_json = size > 8 && bytes[8] == '{';
  if (n < 2 || n > kMaxHeaderBytes || !looks_json)
    throw BadInput(path, "not a safetensors file: the first 8 bytes give a header length of " + std::to_string(n) +
                             (looks_json ? "" : " and no JSON header follows"));
  if (8 + n > size)
    throw BadInput(path, "truncated: its header needs " + std::to_string(8 + n) + " bytes, the file has " +
                             std::to_string(size));
  json header;
  try {
    header = json::parse(std::string(reinterpret_cast<const char*>(bytes + 8), n));
  } catch (const json::exception& e) {
    throw BadInput(path, std::string("not a safetensors file: its header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw BadInput(path, "not a safetensors file: its header is not a JSON object");
  return header;
}

// One header entry `name` -> `t` ({dtype, shape, data_offsets}) of a file of `file_size` bytes whose data section
// (`data_bytes` long, after a header of `header_bytes`) starts at `data`. Sets `span` to its data offsets. Throws
// BadInput naming the file and the tensor.
SafetensorsEntry parse_safetensors_entry(const std::string& path, const std::string& name, const json& t,
                                         const unsigned char* data, uint64_t data_bytes, uint64_t header_bytes,
                                         size_t file_size, std::pair<uint64_t, uint64_t>& span) {
  auto bad = [&](const std::string& what) { return BadInput(path, "tensor " + name + ": " + what); };
  if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets") ||
      !t["dtype"].is_string() || !t["shape"].is_array() || !t["data_offsets"].is_array() ||
      t["data_offsets"].size() != 2)
    throw bad("not a safetensors entry (needs dtype, shape and data_offsets [begin, end])");
  SafetensorsEntry e;
  e.name = name;
  const std::string dt = t["dtype"];
  if (dt == "F32") e.dtype = DType::kFloat32;
  else if (dt == "F16") e.dtype = DType::kFloat16;
  else if (dt == "BF16") e.dtype = DType::kBFloat16;
  else throw bad("dtype " + dt + " is not read (F32, F16 and BF16 are)");
  e.numel = 1;
  for (const json& d : t["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
      throw bad("shape " + t["shape"].dump() + " is not a list of sizes");
    e.shape.push_back(d.get<int64_t>());
    e.numel *= e.shape.back();
    if (e.numel > (int64_t{1} << 40)) throw bad("shape " + t["shape"].dump() + " is too large");
  }
  const json& off = t["data_offsets"];
  if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw bad("data_offsets " + off.dump() + " are not byte offsets");
  const uint64_t b = off[0], en = off[1];
  const uint64_t need = static_cast<uint64_t>(e.numel) * dtype_size(e.dtype);
  if (en < b || en - b != need)
    throw bad("data_offsets " + off.dump() + " span " + std::to_string(en < b ? 0 : en - b) + " bytes, its " + dt +
              " shape " + shape_text(e.shape) + " needs " + std::to_string(need));
  if (en > data_bytes)
    throw BadInput(path, "truncated: tensor " + name + " needs " + std::to_string(8 + header_bytes + en) +
                             " bytes, the file has " + std::to_string(file_size));
  e.data = data + b;
  span = {b, en};
  return e;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw BadInput(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw BadInput(path, "is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw BadInput(path, "not a safetensors file: " + std::to_string(size_) +
                             " bytes, shorter than the 8-byte header length");
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw BadInput(path, std::string("cannot map: ") + std::strerror(errno));
  }
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    uint64_t n = 0;
    const json header = parse_safetensors_header(path, bytes, size_, n);
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      tensors_.push_back(parse_safetensors_entry(path, it.key(), it.value(), bytes + 8 + n, size_ - 8 - n, n, size_,
                                                 spans.emplace_back()));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first < spans[i - 1].second)
        throw BadInput(path, "not a valid safetensors file: two tensors' data_offsets overlap");
  } catch (...) {
    ::munmap(map_, size_);  // a refused file: no destructor runs for a constructor that throws
    map_ = nullptr;
    throw;
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

void widen_to_fp32(const unsigned char* src, DType dtype, int64_t first, int64_t n, float* out) {
  const size_t es = dtype_size(dtype);
  const unsigned char* p = src + static_cast<size_t>(first) * es;
  if (dtype == DType::kFloat32) {
    std::memcpy(out, p, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, p + i * 2, 2);
    if (dtype == DType::kFloat16) {
      out[i] = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
    } else {
      const uint32_t w = static_cast<uint32_t>(bits) << 16;  // bf16 is the top half of an FP32
      std::memcpy(&out[i], &w, 4);
    }
  }
}

// ---- Hugging Face GPT-2 names --------------------------------------------------------------------------------------

std::string hf_gpt2_name(const std::string& n) { return n == "lm_head.weight" ? n : kHfPrefix + n; }

bool hf_gpt2_conv1d(const std::string& n) {
  return starts_with(n, "h.") && (ends_with(n, ".attn.c_attn.weight") || ends_with(n, ".attn.c_proj.weight") ||
                                  ends_with(n, ".mlp.c_fc.weight") || ends_with(n, ".mlp.c_proj.weight"));
}

int64_t padded_vocab_size(const GptConfig& cfg) {
  const int64_t m = std::max(1, cfg.padded_vocab_multiple());
  return (cfg.vocab_size() + m - 1) / m * m;
}

std::string hf_gpt2_config_json(const GptConfig& g) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = g.vocab_size();
  j["n_positions"] = g.seq_len();
  j["n_ctx"] = g.seq_len();
  j["n_embd"] = g.n_embd();
  j["n_layer"] = g.n_layer();
  j["n_head"] = g.n_head();
  j["n_inner"] = nullptr;  // 4 * n_embd
  j["activation_function"] = "gelu_new";  // the tanh approximation, kernels/math.h's gelu
  j["resid_pdrop"] = g.dropout();
  j["embd_pdrop"] = g.dropout();
  j["attn_pdrop"] = 0.0;  // ampdist drops the residual branches, not attention probabilities
  j["layer_norm_epsilon"] = 1e-5;
  j["initializer_range"] = 0.02;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = g.tie_embeddings();
  j["bos_token_id"] = g.vocab_size() - 1;  // GPT-2's <|endoftext|> is its last id
  j["eos_token_id"] = g.vocab_size() - 1;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

namespace {

// config.json of a Hugging Face GPT-2 against model.gpt.
void check_hf_config(const std::string& path, const GptConfig& g) {
  const json j = read_json(path);
  auto num = [&](const char* key, int64_t want, const char* field) {
    if (!j.contains(key)) throw BadInput(path, std::string("has no ") + key + " (model.gpt." + field + " is " +
                                                   std::to_string(want) + ")");
    if (!j[key].is_number_integer() || j[key].get<int64_t>() != want)
      throw BadInput(path, std::string(key) + " is " + j[key].dump() + ", model.gpt." + field + " is " +
                               std::to_string(want));
  };
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    throw BadInput(path, "model_type is " + j["model_type"].dump() + ", not \"gpt2\"");
  num("n_layer", g.n_layer(), "n_layer");
  num("n_head", g.n_head(), "n_head");
  num("n_embd", g.n_embd(), "n_embd");
  num("n_positions", g.seq_len(), "seq_len");
  num("vocab_size", g.vocab_size(), "vocab_size");
  if (j.contains("n_inner") && !j["n_inner"].is_null() &&
      !(j["n_inner"].is_number_integer() && j["n_inner"].get<int64_t>() == 4 * int64_t{g.n_embd()}))
    throw BadInput(path, "n_inner is " + j["n_inner"].dump() + ", ampdist's MLP is 4 * n_embd = " +
                             std::to_string(4 * g.n_embd()));
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw BadInput(path, "activation_function is \"" + act + "\", ampdist's GELU is the tanh form (gelu_new)");
  const double eps = j.contains("layer_norm_epsilon") && j["layer_norm_epsilon"].is_number()
                         ? j["layer_norm_epsilon"].get<double>()
                         : 1e-5;
  if (std::fabs(eps - 1e-5) > 1e-12)
    throw BadInput(path, "layer_norm_epsilon is " + std::to_string(eps) + ", ampdist's LayerNorm uses 1e-5");
  for (const char* flag : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (j.contains(flag) && j[flag].is_boolean() && j[flag].get<bool>())
      throw BadInput(path, std::string(flag) + " is true, which ampdist's attention does not do");
  if (j.contains("scale_attn_weights") && j["scale_attn_weights"].is_boolean() && !j["scale_attn_weights"].get<bool>())
    throw BadInput(path, "scale_attn_weights is false, ampdist's attention scales by 1/sqrt(head size)");
  const bool tie = j.value("tie_word_embeddings", true);
  if (tie != g.tie_embeddings())
    throw BadInput(path, std::string("tie_word_embeddings is ") + (tie ? "true" : "false") +
                             ", model.gpt.tie_embeddings is " + (g.tie_embeddings() ? "true" : "false"));
}

}  // namespace

// ---- PretrainedSource ------------------------------------------------------------------------------------------

namespace {

using SafetensorsFiles = std::vector<std::unique_ptr<SafetensorsFile>>;

// model.safetensors.index.json of directory `dir`: opens every shard file its weight_map names (each once) and
// checks that each holds the tensors mapped to it.
void open_indexed_files(const fs::path& dir, const std::string& index, SafetensorsFiles& files) {
  const json j = read_json(index);
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) throw BadInput(index, "has no weight_map object");
  std::error_code ec;
  std::map<std::string, size_t> shard_of_file;
  std::vector<std::pair<std::string, std::string>> mapped;  // tensor, shard file name
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) throw BadInput(index, "weight_map entry " + it.key() + " is not a file name");
    const std::string file = it.value();
    if (file.find('/') != std::string::npos || file == "." || file == "..")
      throw BadInput(index, "weight_map entry " + it.key() + " names " + file + ", not a file of this directory");
    if (!shard_of_file.count(file)) {
      const std::string shard = (dir / file).string();
      if (!fs::exists(shard, ec))
        throw BadInput(index, "maps tensor " + it.key() + " to " + file + ", which does not exist");
      shard_of_file[file] = files.size();
      files.push_back(std::make_unique<SafetensorsFile>(shard));
    }
    mapped.emplace_back(it.key(), file);
  }
  for (const auto& [tensor, file] : mapped) {
    const auto& ts = files[shard_of_file[file]]->tensors();
    const bool has = std::any_of(ts.begin(), ts.end(), [&](const SafetensorsEntry& e) { return e.name == tensor; });
    if (!has) throw BadInput((dir / file).string(), "has no tensor " + tensor + " (the index maps it here)");
  }
}

// Opens the source's safetensors files: a file, or a Hugging Face model directory (config.json checked against
// `gpt` when given, then model.safetensors or the files of its index). Returns the directory's config.json, or ""
// for a file.
std::string open_source(const std::string& path, const GptConfig* gpt, SafetensorsFiles& files) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (!fs::exists(path, ec)) throw BadInput(path, "no such file or directory (model.init_from)");
    files.push_back(std::make_unique<SafetensorsFile>(path));
    return "";
  }
  const fs::path dir(path);
  const std::string config_json = (dir / "config.json").string();
  const std::string single = (dir / "model.safetensors").string();
  const std::string index = (dir / "model.safetensors.index.json").string();
  if (!fs::exists(config_json, ec))
    throw BadInput(path, "has no config.json (a Hugging Face model directory holds config.json and "
                         "model.safetensors or model.safetensors.index.json)");
  if (fs::exists(single, ec))
    files.push_back(std::make_unique<SafetensorsFile>(single));
  else if (fs::exists(index, ec))
    open_indexed_files(dir, index, files);
  else
    throw BadInput(path, "has neither model.safetensors nor model.safetensors.index.json");
  if (gpt) {
    try {
      check_hf_config(config_json, *gpt);
    } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type
      throw BadInput(config_json, std::string("is not a GPT-2 config: ") + e.what());
    }
  }
  return config_json;
}

// A source tensor, the file that holds it, and whether the model takes it.
struct Found {
  const SafetensorsEntry* e;
  const std::string* file;
  bool used = false;
};

// Every source tensor by its name in the files; a name in two files is refused.
std::map<std::string, Found> tensors_by_raw_name(const SafetensorsFiles& files) {
  std::map<std::string, Found> by_raw;
  for (const auto& f : files)
    for (const SafetensorsEntry& e : f->tensors())
      if (!by_raw.emplace(e.name, Found{&e, &f->path()}).second)
        throw BadInput(f->path(), "tensor " + e.name + " is also in another shard");
  return by_raw;
}

// Whether a GPT source uses Hugging Face names (see the header): a model directory, a "transformer." name, or
// block 0's c_attn stored as Conv1D [C, 3C].
bool uses_hf_names(const std::map<std::string, Found>& by_raw, bool model_directory, const GptConfig& gpt) {
  if (model_directory) return true;
  for (const auto& [n, f] : by_raw)
    if (starts_with(n, kHfPrefix)) return true;
  if (gpt.n_layer() <= 0) return false;
  const int64_t C = gpt.n_embd();
  auto it = by_raw.find("h.0.attn.c_attn.weight");
  return it != by_raw.end() && it->second.e->shape == Shape{C, 3 * C};
}

// The source tensors by ampdist name (Hugging Face's prefix taken off when `hf`; its attention mask buffers marked
// used and left out).
std::map<std::string, Found*> tensors_by_name(std::map<std::string, Found>& by_raw, bool hf) {
  std::map<std::string, Found*> by_name;
  for (auto& [raw, f] : by_raw) {
    std::string n = raw;
    if (hf && starts_with(n, kHfPrefix)) n = n.substr(std::strlen(kHfPrefix));
    if (hf && is_hf_mask_buffer(n)) {
      f.used = true;  // a buffer, not a weight
      continue;
    }
    if (!by_name.emplace(n, &f).second) throw BadInput(*f.file, "holds both " + n + " and " + kHfPrefix + n);
  }
  return by_name;
}

// A tied model's lm_head.weight (transformers' tied copy of wte): accepted, and marked used, when it equals wte's
// rows. Returns whether there was one.
bool accept_tied_head(std::map<std::string, Found*>& by_name, const GptConfig& gpt) {
  auto lm = by_name.find("lm_head.weight");
  auto wte = by_name.find("wte.weight");
  if (lm == by_name.end() || wte == by_name.end()) return false;
  const int64_t V = gpt.vocab_size(), C = gpt.n_embd();
  const SafetensorsEntry& a = *lm->second->e;
  const SafetensorsEntry& b = *wte->second->e;
  if (a.shape != Shape{V, C})
    throw BadInput(*lm->second->file, "tensor " + a.name + " has shape " + shape_text(a.shape) +
                                          ", the tied model needs " + shape_text(Shape{V, C}));
  std::vector<float> x(static_cast<size_t>(C)), y(static_cast<size_t>(C));
  for (int64_t r = 0; r < V; ++r) {
    widen_to_fp32(a.data, a.dtype, r * C, C, x.data());
    widen_to_fp32(b.data, b.dtype, r * C, C, y.data());
    if (std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0)
      throw BadInput(*lm->second->file, "tensor " + a.name + " differs from " + b.name + " (row " +
                                            std::to_string(r) + "), but model.gpt.tie_embeddings is true");
  }
  lm->second->used = true;
  return true;
}

}  // namespace

PretrainedSource::PretrainedSource(const std::string& path, const FlatLayout& layout, const GptConfig* gpt)
    : layout_(layout) {
  const std::string config_json = open_source(path, gpt, files_);
  std::map<std::string, Found> by_raw = tensors_by_raw_name(files_);
  const std::string where = files_.size() == 1 ? files_[0]->path() : path;
  hf_ = gpt && uses_hf_names(by_raw, !config_json.empty(), *gpt);
  std::map<std::string, Found*> by_name = tensors_by_name(by_raw, hf_);

  const int64_t V = gpt ? gpt->vocab_size() : 0;
  map_.resize(layout_.size());
  for (size_t i = 0; i < layout_.size(); ++i) {
    const FlatEntry& le = layout_[i];
    const std::string shown = hf_ ? hf_gpt2_name(le.name) : le.name;
    auto it = by_name.find(le.name);
    if (it == by_name.end())
      throw BadInput(where, "has no tensor " + shown + " " + shape_text(le.shape) + ", which the model needs");
    Found& f = *it->second;
    Source& s = map_[i];
    s.entry = f.e;
    s.transposed = hf_ && hf_gpt2_conv1d(le.name);
    Shape want = le.shape;
    if (s.transposed) std::swap(want[0], want[1]);
    s.rows = want.empty() ? 1 : want[0];
    const bool padded_wte = gpt && le.name == "wte.weight" && le.shape.size() == 2 && le.shape[0] != V;
    bool ok = f.e->shape == want;
    if (!ok && padded_wte && f.e->shape == Shape{V, le.shape[1]}) {
      ok = true;  // the unpadded table: rows from V on start at 0
      s.rows = V;
    }
    if (!ok && padded_wte && hf_) want[0] = V;  // Hugging Face files hold the unpadded vocabulary
    if (!ok)
      throw BadInput(*f.file, "tensor " + f.e->name + " has shape " + shape_text(f.e->shape) + ", the model needs " +
                                  shape_text(want) + (s.transposed ? " (Conv1D: [in, out])" : ""));
    f.used = true;
  }
  used_ = layout_.size();
  if (gpt && gpt->tie_embeddings() && accept_tied_head(by_name, *gpt)) ++used_;
  for (const auto& [raw, f] : by_raw)
    if (!f.used)
      throw BadInput(*f.file, "tensor " + raw + " " + shape_text(f.e->shape) + " is not a parameter of this model");
}

PretrainedSource::~PretrainedSource() = default;

void PretrainedSource::read(size_t i, int64_t first, int64_t count, float* out) const {
  const FlatEntry& le = layout_[i];
  const Source& s = map_.at(i);
  if (!s.transposed) {
    const int64_t have = s.entry ? s.entry->numel : 0;
    const int64_t n = std::clamp<int64_t>(have - first, 0, count);
    if (n > 0) widen_to_fp32(s.entry->data, s.entry->dtype, first, n, out);
    std::fill(out + n, out + count, 0.0f);
    return;
  }
  // ampdist [out, in] element (r, c) is the source's [in, out] element (c, r).
  const int64_t rows = le.shape[0], cols = le.shape[1];
  for (int64_t k = 0; k < count; ++k) {
    const int64_t e = first + k, r = e / cols, c = e % cols;
    widen_to_fp32(s.entry->data, s.entry->dtype, c * rows + r, 1, out + k);
  }
}

}  // namespace ampdist

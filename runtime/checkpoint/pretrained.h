// Pretrained weights in, Hugging Face GPT-2 weights out: safetensors files and Hugging Face model directories.
//
// safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N bytes of
// JSON {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {...}}, then the data section, each
// tensor row-major little-endian at [8 + N + begin, 8 + N + end). Read here: F32, F16 and BF16 (widened exactly to
// FP32); any other dtype is refused.
//
// A pretrained source (model.init_from) is one of
//   - a .safetensors file;
//   - a Hugging Face model directory: config.json plus model.safetensors, or plus model.safetensors.index.json whose
//     weight_map names the shard (model-0000N-of-0000M.safetensors) of every tensor; every shard must exist.
// Tensor names are ampdist's (the flat layout's, e.g. "h.0.attn.c_attn.weight", Linear weights [out, in]) or, for a
// GPT model, Hugging Face GPT-2's: the same names with an optional "transformer." prefix, the four Conv1D matrices
// (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) stored [in, out], i.e. transposed against ampdist's Linear, the
// causal-mask buffers "h.N.attn.bias" / "h.N.attn.masked_bias" ignored, and "lm_head.weight" of a tied model
// (transformers' tied copy of wte) accepted only when it equals wte. Which naming a source uses: Hugging Face's
// when it is a directory with config.json, when any name starts with "transformer.", or when the first block's
// c_attn weight is [C, 3C]; ampdist's otherwise (an ampdist safetensors export, or a raw GPT-2 file of unprefixed
// names whose Conv1D shapes tell them apart).
//
// Checks, each a BadInput naming the file (and the tensor or config.json field): not a safetensors file, a
// truncated file, an unsupported dtype, overlapping or out-of-range data offsets; a tensor the model needs that is
// missing, one the model does not have (extra), or a shape that differs; config.json's n_layer, n_head, n_embd,
// n_positions (= model.gpt.seq_len), vocab_size, activation (gelu_new / gelu_pytorch_tanh), layer_norm_epsilon
// (1e-5), n_inner (null or 4 n_embd) and tie_word_embeddings against model.gpt. A padded vocabulary
// (model.gpt.padded_vocab_multiple): the source's wte has vocab_size rows (Hugging Face) or vocab_size or the
// padded count (ampdist); rows beyond vocab_size start at 0.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampdist/config.pb.h"
#include "runtime/core/flat_layout.h"
#include "runtime/core/tensor.h"

namespace ampdist {

// One tensor of a safetensors file: where its bytes are in the mapping.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;  // F32, F16 or BF16
  Shape shape;
  const unsigned char* data = nullptr;  // row-major little-endian
  int64_t numel = 0;
};

// A safetensors file mapped read-only. Throws BadInput(path, ...) for a file that is not safetensors, is truncated,
// or holds a tensor of another dtype.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<SafetensorsEntry> tensors_;
};

// Widens n elements of `src` (dtype `dtype`) starting at element `first` to FP32 (exact).
void widen_to_fp32(const unsigned char* src, DType dtype, int64_t first, int64_t n, float* out);

// The Hugging Face name of an ampdist GPT tensor ("h.0.ln_1.weight" -> "transformer.h.0.ln_1.weight",
// "lm_head.weight" stays), and whether Hugging Face stores it as a Conv1D weight ([in, out]).
std::string hf_gpt2_name(const std::string& ampdist_name);
bool hf_gpt2_conv1d(const std::string& ampdist_name);
// config.json of a Hugging Face GPT2LMHeadModel for `cfg` (vocab_size unpadded, n_positions = seq_len).
std::string hf_gpt2_config_json(const GptConfig& cfg);
// The padded vocabulary of `cfg`: vocab_size rounded up to a multiple of padded_vocab_multiple (1: none).
int64_t padded_vocab_size(const GptConfig& cfg);

// The weights of a pretrained source for a model with flat layout `layout` (gpt: the GPT config, or null for
// another model, which then takes ampdist names only), checked in full on construction (headers and shapes: no
// weight is read before read()). Every rank opens the source itself: the checks need no communication, so every
// rank refuses a bad source alike before any collective. Throws BadInput as listed above.
class PretrainedSource {
 public:
  PretrainedSource(const std::string& path, const FlatLayout& layout, const GptConfig* gpt);
  ~PretrainedSource();
  // "hugging face" or "ampdist".
  const char* naming() const { return hf_ ? "hugging face" : "ampdist"; }
  // Elements [first, first + count) of layout tensor i, in ampdist's layout (row-major of its shape), FP32.
  void read(size_t i, int64_t first, int64_t count, float* out) const;
  // Source tensors read (without the ignored mask buffers) and files opened.
  size_t tensors_used() const { return used_; }
  size_t files() const { return files_.size(); }

 private:
  struct Source {
    const SafetensorsEntry* entry = nullptr;  // null: all zeros
    bool transposed = false;                  // stored [in, out] for an ampdist [out, in]
    int64_t rows = 0;                         // rows of the ampdist tensor present in the source (padded vocab)
  };
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<Source> map_;  // per layout tensor
  FlatLayout layout_;
  bool hf_ = false;
  size_t used_ = 0;
};

}  // namespace ampdist

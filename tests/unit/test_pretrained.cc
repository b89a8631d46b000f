// Pretrained sources (runtime/checkpoint/pretrained.h): the layout of the original GPT-2 files (Hugging Face names
// without the "transformer." prefix, Conv1D matrices [in, out], causal-mask buffers), 16-bit widening, refusals.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/checkpoint/pretrained.h"
#include "runtime/nn/gpt.h"

namespace ampdist {
namespace {

struct T {
  std::string dtype;  // F32, BF16, I64
  Shape shape;
};

// A safetensors file whose tensor k (in name order) holds element e = k * 100 + e, or e + 1 in a BF16 tensor (small
// integers, exact in bf16's 8 significant bits, so widening must give them back exactly).
std::string write_file(const std::string& name, const std::map<std::string, T>& tensors) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  std::string data;
  int k = 0;
  for (const auto& [n, t] : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const size_t es = t.dtype == "F32" ? 4 : t.dtype == "I64" ? 8 : 2;
    const size_t begin = data.size();
    for (int64_t e = 0; e < numel; ++e) {
      const float v = static_cast<float>(t.dtype == "BF16" ? e + 1 : k * 100 + e);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      if (es == 4) data.append(reinterpret_cast<const char*>(&bits), 4);
      else if (es == 2) data.append(reinterpret_cast<const char*>(&bits) + 2, 2);  // bf16: the top half
      else data.append(8, '\0');
    }
    h[n] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
    ++k;
  }
  std::string text = h.dump();
  const uint64_t len = text.size();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(&len, 8, 1, f);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fwrite(data.data(), 1, data.size(), f);
  std::fclose(f);
  return path;
}

GptConfig tiny() {
  GptConfig c;
  c.set_n_layer(1);
  c.set_n_head(1);
  c.set_n_embd(2);
  c.set_seq_len(2);
  c.set_vocab_size(3);
  return c;
}

FlatLayout layout_of(const GptConfig& c) {
  GptModel model(c, Autocast(DType::kFloat32), 0);
  std::vector<Parameter*> params;
  model.collect_parameters(params);
  return flat_layout(params);
}

// The original GPT-2 file's names and shapes (C = 2, V = 3, T = 2), wpe in bf16, plus its mask buffer.
std::map<std::string, T> gpt2_file() {
  return {{"wte.weight", {"F32", {3, 2}}},          {"wpe.weight", {"BF16", {2, 2}}},
          {"h.0.ln_1.weight", {"F32", {2}}},        {"h.0.ln_1.bias", {"F32", {2}}},
          {"h.0.attn.c_attn.weight", {"F32", {2, 6}}}, {"h.0.attn.c_attn.bias", {"F32", {6}}},
          {"h.0.attn.c_proj.weight", {"F32", {2, 2}}}, {"h.0.attn.c_proj.bias", {"F32", {2}}},
          {"h.0.ln_2.weight", {"F32", {2}}},        {"h.0.ln_2.bias", {"F32", {2}}},
          {"h.0.mlp.c_fc.weight", {"F32", {2, 8}}}, {"h.0.mlp.c_fc.bias", {"F32", {8}}},
          {"h.0.mlp.c_proj.weight", {"F32", {8, 2}}}, {"h.0.mlp.c_proj.bias", {"F32", {2}}},
          {"ln_f.weight", {"F32", {2}}},            {"ln_f.bias", {"F32", {2}}},
          {"h.0.attn.bias", {"F32", {1, 1, 2, 2}}}};
}

// The value write_file stored at element e of the tensor `name` of `file`, as FP32.
float stored(const std::map<std::string, T>& file, const std::string& name, int64_t e) {
  int k = 0;
  for (const auto& [n, t] : file) {
    if (n == name) {
      const float v = static_cast<float>(t.dtype == "BF16" ? e + 1 : k * 100 + e);
      return v;
    }
    ++k;
  }
  return -1.0f;
}

std::vector<float> read_all(const PretrainedSource& s, const FlatLayout& l, size_t i) {
  std::vector<float> out(static_cast<size_t>(l[i].numel()));
  s.read(i, 0, l[i].numel(), out.data());
  return out;
}

TEST(Pretrained, OriginalGpt2LayoutIsTransposedWidenedAndItsMaskBufferIgnored) {
  const GptConfig c = tiny();
  const FlatLayout l = layout_of(c);
  const auto file = gpt2_file();
  const PretrainedSource s(write_file("ampdist_gpt2_orig.safetensors", file), l, &c);
  EXPECT_STREQ(s.naming(), "hugging face");  // told apart by c_attn's [C, 3C]
  EXPECT_EQ(s.tensors_used(), l.size());
  for (size_t i = 0; i < l.size(); ++i) {
    const std::vector<float> got = read_all(s, l, i);
    const FlatEntry& e = l[i];
    if (hf_gpt2_conv1d(e.name)) {
      // ampdist [out, in] element (r, col) is the file's [in, out] element (col, r), square c_proj included.
      const int64_t rows = e.shape[0], cols = e.shape[1];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t q = 0; q < cols; ++q)
          EXPECT_EQ(got[static_cast<size_t>(r * cols + q)], stored(file, e.name, q * rows + r)) << e.name;
    } else {
      for (int64_t k = 0; k < e.numel(); ++k)
        EXPECT_EQ(got[static_cast<size_t>(k)], stored(file, e.name, k)) << e.name << " (wpe is bf16, widened)";
    }
  }
}

TEST(Pretrained, PaddedVocabularyRowsStartAtZero) {
  GptConfig c = tiny();
  c.set_padded_vocab_multiple(4);  // 3 -> 4 rows
  const FlatLayout l = layout_of(c);
  ASSERT_EQ(l[0].shape, (Shape{4, 2}));
  const auto file = gpt2_file();
  const PretrainedSource s(write_file("ampdist_gpt2_pad.safetensors", file), l, &c);
  const std::vector<float> wte = read_all(s, l, 0);
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(wte[static_cast<size_t>(k)], stored(file, "wte.weight", k));
  EXPECT_EQ(wte[6], 0.0f);
  EXPECT_EQ(wte[7], 0.0f);
}

TEST(Pretrained, RefusalsNameTheFileAndTensor) {
  const GptConfig c = tiny();
  const FlatLayout l = layout_of(c);
  auto message = [&](const std::map<std::string, T>& file, const std::string& name) {
    try {
      PretrainedSource s(write_file(name, file), l, &c);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto f = gpt2_file();
  f["h.0.extra"] = {"F32", {2}};
  EXPECT_NE(message(f, "ampdist_pt_extra.safetensors").find("ampdist_pt_extra.safetensors: tensor h.0.extra [2] is "
                                                            "not a parameter of this model"),
            std::string::npos);
  f = gpt2_file();
  f["ln_f.bias"] = {"I64", {2}};
  EXPECT_NE(message(f, "ampdist_pt_i64.safetensors").find("tensor ln_f.bias: dtype I64 is not read"),
            std::string::npos);
  f = gpt2_file();
  f.erase("ln_f.bias");
  EXPECT_NE(message(f, "ampdist_pt_missing.safetensors").find("has no tensor transformer.ln_f.bias [2]"),
            std::string::npos);
}

}  // namespace
}  // namespace ampdist

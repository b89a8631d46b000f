// Token data for language models: byte-level text, uint16 token files, and windows over a token stream.
//
// Token file: llm.c's layout (karpathy/llm.c dev/data), a header of 256 little-endian int32 — magic 20240520,
// version 1, token count, and here the vocabulary size in slot 3 (0 in llm.c's files, read as 65536) — then the
// tokens as little-endian uint16.
//
// Text corpus: each file is a run of documents. A fortune file (Debian's /usr/share/games/fortunes/*) separates
// its entries by lines holding only "%"; each entry, with its "%" line, is a document. A file without such lines
// is one document. A document goes to validation when XXH3-64 of its bytes mod 2^20 is below val_fraction * 2^20:
// the split depends on the text only, not on file order or a seed. Tokens are the bytes (vocabulary 256).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampdist/config.pb.h"
#include "runtime/data/dataset.h"

namespace ampdist {

constexpr int32_t kTokenFileMagic = 20240520;  // llm.c
constexpr int32_t kTokenFileVersion = 1;
constexpr int64_t kTokenHeaderInts = 256;

struct TokenStream {
  std::vector<uint16_t> tokens;
  int32_t vocab_size = 0;
};

// Reads a token file. Throws Error (bad input) naming the file for a missing or short file, a wrong magic or
// version, a count that does not match the file's size, or a token >= the vocabulary size.
TokenStream read_token_file(const std::string& path);
// Writes a token file (to path + ".tmp", then renamed). Throws Error naming the file on an I/O error.
void write_token_file(const std::string& path, const TokenStream& s);

struct TextSplit {
  std::vector<uint16_t> train, val;
  int64_t train_documents = 0, val_documents = 0, files = 0;
};
// The byte tokens of `paths` (files, or directories whose regular files are read in name order, skipping *.dat
// index files and symbolic links such as fortune's *.u8), split by documents as above. Throws Error (bad input)
// naming the path for a missing path, an unreadable file, val_fraction outside [0, 1), or no text at all.
TextSplit split_text(const std::vector<std::string>& paths, double val_fraction);

// Windows of seq_len + 1 tokens of a token stream: window i starts at token i * stride. A sample's features are
// the window's tokens as FP32 (exact for ids < 2^24) followed by its index i split into low 16 bits and the rest
// (gpt.h's input rows); its label is 0 (the targets are inside the features).
class TokenWindowDataset : public Dataset {
 public:
  // Throws Error (bad input) naming `where` when the stream is shorter than one window or a token >= vocab_size.
  TokenWindowDataset(std::shared_ptr<const std::vector<uint16_t>> tokens, int64_t seq_len, int64_t stride,
                     int32_t vocab_size, const std::string& where);
  int64_t size() const override { return windows_; }
  int64_t feature_dim() const override { return seq_len_ + 3; }
  int32_t classes() const override { return vocab_; }
  void get(int64_t index, float* features, int32_t* label) const override;

 private:
  std::shared_ptr<const std::vector<uint16_t>> tokens_;
  int64_t seq_len_, stride_, windows_;
  int32_t vocab_;
};

// Unigram entropy in nats of `tokens` (the loss of the best model that ignores context), with counts from `fit`
// (the training stream) smoothed by adding 1 to each of the vocab_size counts.
double unigram_cross_entropy(const std::vector<uint16_t>& fit, const std::vector<uint16_t>& tokens,
                             int32_t vocab_size);

// The train and validation windows of data { tokens {...} } or data { text {...} } for a model of seq_len and
// vocab_size. Throws Error (bad input) naming the field or file.
DatasetPair load_token_datasets(const DataConfig& cfg, int64_t seq_len, int32_t vocab_size);

}  // namespace ampdist

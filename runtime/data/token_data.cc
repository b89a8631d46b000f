#include "runtime/data/token_data.h"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "runtime/core/error.h"

namespace ampdist {

namespace fs = std::filesystem;

namespace {

int32_t le32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
                              (uint32_t{p[3]} << 24));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw BadInput(path, std::string("cannot open: ") + std::strerror(errno));
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw BadInput(path, "read error");
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TokenStream read_token_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw BadInput(path, "no such token file (make one with `ampdist prepare-text`)");
  if (fs::is_directory(path, ec)) throw BadInput(path, "is a directory, expected a token file");
  const std::string bytes = read_file(path);
  const size_t header = static_cast<size_t>(kTokenHeaderInts) * 4;
  if (bytes.size() < header)
    throw BadInput(path, "truncated: " + std::to_string(bytes.size()) + " bytes, a token file header is " +
                             std::to_string(header));
  const auto* h = reinterpret_cast<const unsigned char*>(bytes.data());
  if (le32(h) != kTokenFileMagic)
    throw BadInput(path, "bad magic " + std::to_string(le32(h)) + ", expected " + std::to_string(kTokenFileMagic) +
                             " (llm.c token file)");
  if (le32(h + 4) != kTokenFileVersion)
    throw BadInput(path, "version " + std::to_string(le32(h + 4)) + ", expected " +
                             std::to_string(kTokenFileVersion) + " (uint16 tokens)");
  const int64_t count = le32(h + 8);
  TokenStream s;
  s.vocab_size = le32(h + 12) == 0 ? 65536 : le32(h + 12);
  if (count < 0 || s.vocab_size < 0 || s.vocab_size > 65536)
    throw BadInput(path, "header says " + std::to_string(count) + " tokens of a vocabulary of " +
                             std::to_string(s.vocab_size));
  const size_t want = header + static_cast<size_t>(count) * 2;
  if (bytes.size() != want)
    throw BadInput(path, "header says " + std::to_string(count) + " tokens = " + std::to_string(want) +
                             " bytes with the header, file has " + std::to_string(bytes.size()));
  s.tokens.resize(static_cast<size_t>(count));
  const unsigned char* p = h + header;
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t t = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
    if (t >= s.vocab_size)
      throw BadInput(path, "token " + std::to_string(t) + " at position " + std::to_string(i) +
                               " is outside the vocabulary of " + std::to_string(s.vocab_size));
    s.tokens[static_cast<size_t>(i)] = t;
  }
  return s;
}

void write_token_file(const std::string& path, const TokenStream& s) {
  if (s.tokens.size() > static_cast<size_t>(INT32_MAX))
    throw BadInput(path, std::to_string(s.tokens.size()) + " tokens do not fit the header's int32 count");
  std::vector<unsigned char> out(static_cast<size_t>(kTokenHeaderInts) * 4 + s.tokens.size() * 2, 0);
  auto put = [&](size_t slot, int32_t v) {
    for (int b = 0; b < 4; ++b) out[slot * 4 + b] = static_cast<unsigned char>(static_cast<uint32_t>(v) >> (8 * b));
  };
  put(0, kTokenFileMagic);
  put(1, kTokenFileVersion);
  put(2, static_cast<int32_t>(s.tokens.size()));
  put(3, s.vocab_size);
  unsigned char* p = out.data() + kTokenHeaderInts * 4;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    p[2 * i] = static_cast<unsigned char>(s.tokens[i] & 0xFF);
    p[2 * i + 1] = static_cast<unsigned char>(s.tokens[i] >> 8);
  }
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw BadInput(tmp, std::string("cannot create: ") + std::strerror(errno));
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    std::remove(tmp.c_str());
    throw Error(tmp + ": write failed: " + std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(path + ": rename from " + tmp + " failed: " + ec.message());
}

TextSplit split_text(const std::vector<std::string>& paths, double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw ConfigInput("data.text.val_fraction must be in [0, 1), got " + std::to_string(val_fraction));
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (!fs::exists(p, ec)) throw BadInput(p, "no such file or directory (Debian's fortunes package installs "
                                              "/usr/share/games/fortunes)");
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> in_dir;
      for (const auto& e : fs::directory_iterator(p, ec)) {
        const std::string name = e.path().string();
        if (e.is_symlink() || !e.is_regular_file() || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
        in_dir.push_back(name);
      }
      if (ec) throw BadInput(p, "cannot list: " + ec.message());
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.push_back(p);
    }
  }
  TextSplit out;
  const uint64_t threshold = static_cast<uint64_t>(val_fraction * double(1 << 20));
  auto add_doc = [&](const char* b, size_t n) {
    if (n == 0) return;
    const bool val = (XXH3_64bits(b, n) & ((1u << 20) - 1)) < threshold;
    std::vector<uint16_t>& dst = val ? out.val : out.train;
    (val ? out.val_documents : out.train_documents) += 1;
    for (size_t i = 0; i < n; ++i) dst.push_back(static_cast<unsigned char>(b[i]));
  };
  for (const std::string& path : files) {
    const std::string text = read_file(path);
    ++out.files;
    // Documents end after each line that is exactly "%" (fortune's separator), and at the end of the file.
    size_t start = 0, line = 0;
    while (line < text.size()) {
      size_t eol = text.find('\n', line);
      const size_t next = eol == std::string::npos ? text.size() : eol + 1;
      const size_t len = (eol == std::string::npos ? text.size() : eol) - line;
      if (len == 1 && text[line] == '%') {
        add_doc(text.data() + start, next - start);
        start = next;
      }
      line = next;
    }
    add_doc(text.data() + start, text.size() - start);
  }
  if (out.train.empty())
    throw paths.empty() ? ConfigInput("data.text.paths: no training text found")
                        : BadInput(paths[0], "no training text found");
  return out;
}

TokenWindowDataset::TokenWindowDataset(std::shared_ptr<const std::vector<uint16_t>> tokens, int64_t seq_len,
                                       int64_t stride, int32_t vocab_size, const std::string& where)
    : tokens_(std::move(tokens)), seq_len_(seq_len), stride_(stride), vocab_(vocab_size) {
  if (seq_len_ <= 0 || stride_ <= 0) throw BadInput(where, "seq_len and stride must be > 0");
  const int64_t n = static_cast<int64_t>(tokens_->size());
  if (n < seq_len_ + 1)
    throw BadInput(where, std::to_string(n) + " tokens, fewer than one window of seq_len + 1 = " +
                              std::to_string(seq_len_ + 1));
  windows_ = (n - seq_len_ - 1) / stride_ + 1;
  if (windows_ >= (int64_t{1} << 32)) throw BadInput(where, "more than 2^32 windows");
  for (size_t i = 0; i < tokens_->size(); ++i)
    if ((*tokens_)[i] >= vocab_)
      throw BadInput(where, "token " + std::to_string((*tokens_)[i]) + " at position " + std::to_string(i) +
                                " is outside model.gpt.vocab_size " + std::to_string(vocab_));
}

void TokenWindowDataset::get(int64_t index, float* features, int32_t* label) const {
  AMPDIST_CHECK(index >= 0 && index < windows_, "window " + std::to_string(index) + " of " + std::to_string(windows_));
  const uint16_t* t = tokens_->data() + index * stride_;
  for (int64_t j = 0; j <= seq_len_; ++j) features[j] = static_cast<float>(t[j]);
  features[seq_len_ + 1] = static_cast<float>(index & 0xFFFF);
  features[seq_len_ + 2] = static_cast<float>(index >> 16);
  *label = 0;
}

double unigram_cross_entropy(const std::vector<uint16_t>& fit, const std::vector<uint16_t>& tokens,
                             int32_t vocab_size) {
  std::vector<double> counts(static_cast<size_t>(vocab_size), 1.0);
  for (uint16_t t : fit) counts[t] += 1.0;
  const double total = static_cast<double>(fit.size()) + vocab_size;
  double nll = 0.0;
  for (uint16_t t : tokens) nll -= std::log(counts[t] / total);
  return tokens.empty() ? 0.0 : nll / static_cast<double>(tokens.size());
}

DatasetPair load_token_datasets(const DataConfig& cfg, int64_t seq_len, int32_t vocab_size) {
  std::shared_ptr<std::vector<uint16_t>> train, val;
  int64_t stride = 0;
  std::string train_where, val_where;
  if (cfg.has_tokens()) {
    const TokenFileConfig& c = cfg.tokens();
    if (c.train().empty()) throw ConfigInput("data.tokens.train must name a token file");
    if (c.val().empty()) throw ConfigInput("data.tokens.val must name a token file");
    TokenStream t = read_token_file(c.train()), v = read_token_file(c.val());
    train = std::make_shared<std::vector<uint16_t>>(std::move(t.tokens));
    val = std::make_shared<std::vector<uint16_t>>(std::move(v.tokens));
    stride = c.stride();
    train_where = c.train();
    val_where = c.val();
  } else if (cfg.has_text()) {
    const TextDatasetConfig& c = cfg.text();
    if (c.paths().empty()) throw ConfigInput("data.text.paths must name at least one file or directory");
    TextSplit s = split_text({c.paths().begin(), c.paths().end()}, c.val_fraction());
    train = std::make_shared<std::vector<uint16_t>>(std::move(s.train));
    val = std::make_shared<std::vector<uint16_t>>(std::move(s.val));
    stride = c.stride();
    train_where = "data.text (training split)";
    val_where = "data.text (validation split)";
  } else {
    throw ConfigInput("data: a gpt model reads data { tokens { ... } } or data { text { ... } }");
  }
  if (stride < 0) throw ConfigInput("data stride must be >= 0, got " + std::to_string(stride));
  DatasetPair p;
  p.train = std::make_shared<TokenWindowDataset>(train, seq_len, stride > 0 ? stride : seq_len, vocab_size,
                                                 train_where);
  p.test = std::make_shared<TokenWindowDataset>(val, seq_len, seq_len, vocab_size, val_where);
  return p;
}

}  // namespace ampdist

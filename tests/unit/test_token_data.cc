// Token files, the document split of text corpora and windows over a token stream.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/token_data.h"

namespace ampdist {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/ampdist_tokens_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return (path / name).string();
  }
};

TEST(TokenData, TokenFileRoundTripsInLlmcLayout) {
  TempDir d;
  TokenStream s{{0, 1, 255, 300, 65535}, 65536};
  const std::string p = (d.path / "t.bin").string();
  write_token_file(p, s);
  EXPECT_EQ(fs::file_size(p), 256u * 4u + 5u * 2u);
  std::ifstream f(p, std::ios::binary);
  int32_t header[4];
  f.read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 5);
  const TokenStream r = read_token_file(p);
  EXPECT_EQ(r.tokens, s.tokens);
  EXPECT_EQ(r.vocab_size, 65536);
}

TEST(TokenData, BadTokenFilesNameTheFile) {
  TempDir d;
  const std::string p = (d.path / "t.bin").string();
  write_token_file(p, TokenStream{{1, 2, 3}, 256});
  fs::resize_file(p, fs::file_size(p) - 1);
  try {
    read_token_file(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  const std::string bad = d.file("bad.bin", std::string(1024 + 2, '\0'));
  EXPECT_THROW(read_token_file(bad), Error);
  write_token_file(p, TokenStream{{1, 2, 200}, 100});  // a token beyond the vocabulary
  EXPECT_THROW(read_token_file(p), Error);
}

TEST(TokenData, FortuneFilesSplitByDocumentContent) {
  TempDir d;
  std::string text, first, second;
  for (int i = 0; i < 200; ++i) {
    const std::string doc = "fortune number " + std::to_string(i) + "\n%\n";
    text += doc;
    (i < 100 ? first : second) += doc;
  }
  d.file("quotes", text);
  d.file("quotes.dat", "index bytes that must be skipped");
  fs::create_symlink(d.path / "quotes", d.path / "quotes.u8");
  const TextSplit s = split_text({d.path.string()}, 0.25);
  EXPECT_EQ(s.files, 1);
  EXPECT_EQ(s.train_documents + s.val_documents, 200);
  EXPECT_EQ(s.train.size() + s.val.size(), text.size()) << "every byte in exactly one split";
  // 200 documents, each in validation with probability 0.25 by its hash: 50 +- 6 sd; +-4 sd.
  EXPECT_NEAR(static_cast<double>(s.val_documents), 50.0, 25.0);
  // The split depends on the text only: the same documents in another file order split the same way.
  TempDir d2;
  d2.file("b", first);
  d2.file("a", second);
  const TextSplit s2 = split_text({d2.path.string()}, 0.25);
  EXPECT_EQ(s2.val_documents, s.val_documents);
  EXPECT_EQ(s2.val.size(), s.val.size());
  EXPECT_THROW(split_text({(d.path / "missing").string()}, 0.1), Error);
}

TEST(TokenData, WindowsCarryTokensAndTheirIndex) {
  auto tokens = std::make_shared<std::vector<uint16_t>>();
  for (int i = 0; i < 100; ++i) tokens->push_back(static_cast<uint16_t>(i % 50));
  TokenWindowDataset ds(tokens, 8, 8, 50, "test");
  EXPECT_EQ(ds.size(), (100 - 9) / 8 + 1);
  EXPECT_EQ(ds.feature_dim(), 11);
  std::vector<float> f(11);
  int32_t label = -1;
  ds.get(3, f.data(), &label);
  for (int j = 0; j <= 8; ++j) EXPECT_EQ(f[j], static_cast<float>((24 + j) % 50));
  EXPECT_EQ(f[9], 3.0f);
  EXPECT_EQ(f[10], 0.0f);
  EXPECT_EQ(label, 0);
  EXPECT_THROW(TokenWindowDataset(tokens, 8, 8, 40, "test"), Error) << "token 49 >= vocab 40";
  EXPECT_THROW(TokenWindowDataset(tokens, 100, 8, 50, "test"), Error) << "shorter than one window";
}

TEST(TokenData, UnigramCrossEntropyOfUniformBytes) {
  std::vector<uint16_t> t;
  for (int r = 0; r < 10; ++r)
    for (int i = 0; i < 4; ++i) t.push_back(static_cast<uint16_t>(i));
  // Counts 10 + 1 for 4 symbols and 1 for the other 252: p = 11 / 296 for each seen symbol.
  EXPECT_NEAR(unigram_cross_entropy(t, t, 256), -std::log(11.0 / 296.0), 1e-12);
}

}  // namespace
}  // namespace ampdist

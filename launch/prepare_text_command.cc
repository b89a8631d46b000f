#include "launch/prepare_text_command.h"

#include <spdlog/fmt/fmt.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "runtime/core/error.h"
#include "runtime/data/token_data.h"

namespace ampdist {

int run_prepare_text(const PrepareTextArgs& args) {
  try {
    TextSplit s = split_text(args.paths, args.val_fraction);
    if (s.val.empty())
      throw BadInput("--val-fraction", "no document went to validation (" + std::to_string(args.val_fraction) +
                                           " of " + std::to_string(s.train_documents) + " documents)");
    std::error_code ec;
    std::filesystem::create_directories(args.out, ec);
    if (ec) throw BadInput(args.out, "cannot create directory: " + ec.message());
    const double unigram = unigram_cross_entropy(s.train, s.val, 256);
    TokenStream t{std::move(s.train), 256}, v{std::move(s.val), 256};
    write_token_file(args.out + "/train.bin", t);
    write_token_file(args.out + "/val.bin", v);
    std::cout << fmt::format("files: {}\n", s.files);
    std::cout << fmt::format("train: {} tokens ({} documents) -> {}/train.bin\n", t.tokens.size(), s.train_documents,
                             args.out);
    std::cout << fmt::format("val: {} tokens ({} documents) -> {}/val.bin\n", v.tokens.size(), s.val_documents,
                             args.out);
    std::cout << fmt::format("unigram baseline (validation, train counts): {:.4f} nat/token\n", unigram);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "ampdist: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampdist: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace ampdist

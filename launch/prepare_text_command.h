// `ampdist prepare-text PATH... --out DIR [--val-fraction 0.1]`: byte-level tokens (vocabulary 256) of text files
// (or directories of them, e.g. Debian's /usr/share/games/fortunes), split by documents into DIR/train.bin and
// DIR/val.bin (llm.c's uint16 token files; runtime/data/token_data.h describes the split and the format). Prints
// the counts and the unigram baseline of the validation split. Single process; exit 2 for bad input.
#pragma once

#include <string>
#include <vector>

namespace ampdist {

struct PrepareTextArgs {
  std::vector<std::string> paths;
  std::string out;
  double val_fraction = 0.1;
};

int run_prepare_text(const PrepareTextArgs& args);

}  // namespace ampdist

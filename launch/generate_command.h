// `ampdist generate --checkpoint PATH --prompt "..." --tokens N [--temperature T] [--top-k K] [--seed S]
// [--precision fp32|fp16|bf16]`: text from a trained gpt checkpoint. The prompt's bytes are the context (the last
// seq_len tokens of it at each step); each new token is sample_next_token (gpt.h) of the last position's logits
// with u from the Philox stream {seed, (token number, 0, 0), sampling}, so a seed gives the same text every time.
// The forward runs under autocast in the given working dtype (default: the checkpoint's precision) with no loss
// scaler. PATH: a step_* directory or a run's checkpoints/ directory (its newest). Prints prompt + continuation.
// Single process; exit 2 for bad input (a checkpoint of another model, a prompt byte outside the vocabulary).
#pragma once

#include <cstdint>
#include <string>

namespace ampdist {

struct GenerateArgs {
  std::string checkpoint;
  std::string prompt;
  int64_t tokens = 200;
  float temperature = 0.8f;
  int top_k = 40;
  uint64_t seed = 1;
  std::string precision;  // empty: the checkpoint's
  std::string device;     // cpu, cuda or auto (default: AMPDIST_DEVICE, else auto)
};

int run_generate(const GenerateArgs& args);

}  // namespace ampdist

// `ampdist generate --checkpoint PATH (--prompt "..." | --prompt-ids 1,2,3) --tokens N [--temperature T]
// [--top-k K] [--seed S] [--precision fp32|fp16|bf16] [--kv-cache on|off] [--timing]`: text from a trained gpt
// checkpoint. A byte-level model (vocab_size 256) takes --prompt's bytes and prints text; any other vocabulary
// (GPT-2's 50257: no tokenizer ships here) takes --prompt-ids and prints the prompt's and the generated token ids,
// space-separated on one line (an empty prompt starts from id vocab_size - 1, GPT-2's <|endoftext|>). The context
// is the last seq_len tokens at each step; each new token is sample_next_token (gpt.h) of the last position's logits
// over the vocab_size real ids (never a padded one) with u from the Philox stream {seed, (token number, 0, 0),
// sampling}, so a seed gives the same tokens every time. With the KV cache (the default) the prompt's window runs
// once (GptModel::prefill) and every new token is one position's forward (GptModel::decode); once the window holds
// seq_len tokens it slides, and each later token runs the whole window again, as without the cache. --timing prints
// the time per generated token to stderr.
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
  std::string prompt_ids;  // "1,2,3"
  std::string kv_cache = "on";
  bool timing = false;
  int64_t tokens = 200;
  float temperature = 0.8f;
  int top_k = 40;
  uint64_t seed = 1;
  std::string precision;  // empty: the checkpoint's
  std::string device;     // cpu, cuda or auto (default: AMPDIST_DEVICE, else auto)
};

int run_generate(const GenerateArgs& args);

}  // namespace ampdist

#include "launch/generate_command.h"

#include <chrono>
#include <cstdlib>
#include <sstream>

#include "runtime/core/device.h"
#include "runtime/train/config.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/amp/master_weights.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/core/error.h"
#include "runtime/core/rng.h"
#include "runtime/kernels/kernels.h"
#include "runtime/nn/gpt.h"
#include "runtime/train/config.h"

namespace ampdist {

namespace {

std::string resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw BadInput(path, "no such checkpoint directory");
  if (fs::exists(fs::path(path) / "manifest.pb", ec)) return path;
  if (auto p = find_latest_checkpoint(path)) return *p;
  throw BadInput(path, "no complete checkpoint here (expected manifest.pb or step_* directories)");
}

DType parse_precision(const std::string& p, DTypeName saved) {
  if (p.empty()) return resolve_dtype(saved, Device::kCPU);
  const std::string& name = p;
  if (name == "fp32") return DType::kFloat32;
  if (name == "fp16") return DType::kFloat16;
  if (name == "bf16") return DType::kBFloat16;
  throw BadInput("--precision", "must be fp32, fp16 or bf16, got \"" + name + "\"");
}

}  // namespace

namespace {

// The prompt as token ids: --prompt-ids (comma-separated, each in [0, vocab_size); none: GPT-2's <|endoftext|>, the
// last id) when `ids`, else --prompt's bytes (none: a newline). Echoes the prompt to stdout as it will be continued.
// Throws BadInput naming the option.
std::vector<int32_t> prompt_tokens(const GenerateArgs& args, const GptConfig& g, bool ids) {
  std::vector<int32_t> tokens;
  if (ids) {
    std::stringstream ss(args.prompt_ids);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t used = 0;
      long long v = -1;
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != item.size() || v < 0 || v >= g.vocab_size())
        throw BadInput("--prompt-ids", "\"" + item + "\" is not a token id in [0, " +
                                           std::to_string(g.vocab_size()) + ")");
      tokens.push_back(static_cast<int32_t>(v));
    }
    if (tokens.empty()) tokens.push_back(g.vocab_size() - 1);  // GPT-2's <|endoftext|>
    for (size_t i = 0; i < tokens.size(); ++i) std::printf("%s%d", i ? " " : "", tokens[i]);
  } else {
    for (unsigned char c : args.prompt) {
      if (c >= g.vocab_size())
        throw BadInput("--prompt", "byte " + std::to_string(c) + " is outside the vocabulary of " +
                                       std::to_string(g.vocab_size()));
      tokens.push_back(c);
    }
    if (tokens.empty()) tokens.push_back('\n');  // an empty prompt starts a new line
    std::fwrite(args.prompt.data(), 1, args.prompt.size(), stdout);
  }
  return tokens;
}

// The checkpoint's FP32 master weights into `masters` (bound to the model of its config), then the working copy.
// Throws BadInput naming the checkpoint when the counts differ.
void load_master_weights(const std::string& path, MasterWeights& masters) {
  std::vector<float> saved = read_checkpoint_buffer(path, "master");
  if (static_cast<int64_t>(saved.size()) != masters.numel())
    throw BadInput(path, "holds " + std::to_string(saved.size()) + " master weights, the model of its config has " +
                             std::to_string(masters.numel()));
  Tensor::view(saved.data(), {masters.numel()}, DType::kFloat32).copy_to(masters.master());
  masters.cast_to_working();
}

// Samples args.tokens tokens after `tokens` (the prompt) with the model in evaluation mode, printing each as it
// comes (a token id, or its byte for a byte-level model) and appending it to `tokens`.
void generate_tokens(GptModel& model, const GptConfig& g, const GenerateArgs& args, bool ids,
                     std::vector<int32_t>& tokens) {
  const bool cache = args.kv_cache == "on";
  const int64_t T = g.seq_len();
  std::vector<float> row(static_cast<size_t>(g.vocab_size()));
  for (int64_t n = 0; n < args.tokens; ++n) {
    const Tensor* logits;
    int64_t last_row;
    if (cache && model.cached() > 0 && model.cached() < T) {
      logits = &model.decode(tokens.back());
      last_row = 0;
    } else {
      const int64_t t = std::min<int64_t>(T, static_cast<int64_t>(tokens.size()));
      std::span<const int32_t> ctx(tokens.data() + tokens.size() - t, static_cast<size_t>(t));
      logits = cache ? &model.prefill(ctx) : &model.logits(ctx, 1, t);
      last_row = t - 1;
    }
    Tensor last = logits->rows(last_row, last_row + 1);
    if (last.device() != Device::kCPU) last = last.to(Device::kCPU);  // one row of logits to the host
    Tensor out = Tensor::view(row.data(), last.shape(), DType::kFloat32);
    kernels::cast(last, out);
    const RngStream rng{args.seed, {static_cast<uint32_t>(n), 0, 0}, RngPurpose::kSampling};
    const int32_t next = sample_next_token(row, args.temperature, args.top_k, rng.uniform(0));
    tokens.push_back(next);
    if (ids) {
      std::printf(" %d", next);
    } else {
      const unsigned char byte = static_cast<unsigned char>(next);
      std::fwrite(&byte, 1, 1, stdout);
    }
  }
}

}  // namespace

int run_generate(const GenerateArgs& args) {
  try {
    if (args.tokens < 0) throw BadInput("--tokens", "must be >= 0, got " + std::to_string(args.tokens));
    if (!(args.temperature >= 0.0f)) throw BadInput("--temperature", "must be >= 0");
    const std::string path = resolve_checkpoint(args.checkpoint);
    const Manifest m = read_manifest(path);
    if (!m.config().model().has_gpt())
      throw BadInput(path, "is not a gpt checkpoint (its config has no model.gpt)");
    const GptConfig& g = m.config().model().gpt();
    const bool ids = g.vocab_size() != 256 || !args.prompt_ids.empty();
    if (ids && !args.prompt.empty())
      throw BadInput("--prompt", "this model's vocabulary is " + std::to_string(g.vocab_size()) +
                                     " token ids, not bytes: give --prompt-ids");
    if (args.kv_cache != "on" && args.kv_cache != "off")
      throw BadInput("--kv-cache", "must be on or off, got \"" + args.kv_cache + "\"");
    RunConfig device_cfg;
    *device_cfg.mutable_device() = m.config().device();
    device_cfg.mutable_device()->clear_command_line_kind();  // the training run's --device is not this one's
    if (!args.device.empty()) set_command_line_device(device_cfg, args.device);
    const Device device = resolve_device(device_cfg);
    if (device == Device::kCUDA) device::set_device(0);
    const DType working = parse_precision(args.precision, m.precision());
    kernels::ExecContext exec;
    exec.threads = 1;
    const kernels::ExecScope scope(exec);
    const Autocast autocast(working);
    GptModel model(g, autocast, m.config().train().seed());
    std::vector<Parameter*> params;
    model.collect_parameters(params);
    const std::unique_ptr<MasterWeights> bound = bind_parameters(params, working, device, 0);  // weights loaded next
    MasterWeights& masters = *bound;
    load_master_weights(path, masters);
    model.set_mode(false, 0);

    std::vector<int32_t> tokens = prompt_tokens(args, g, ids);
    const auto start = std::chrono::steady_clock::now();
    generate_tokens(model, g, args, ids, tokens);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (args.timing)
      std::fprintf(stderr, "generated %lld tokens in %.6f s: %.4f ms per token (kv cache %s)\n",
                   static_cast<long long>(args.tokens), secs, args.tokens > 0 ? 1e3 * secs / args.tokens : 0.0,
                   args.kv_cache.c_str());
    return 0;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "ampdist: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "ampdist: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace ampdist

// `ampdist ckpt inspect|verify|export`: single-process tools for the checkpoints `ampdist train` writes.
//
//   ampdist ckpt inspect PATH                                  what the manifest says (no shard is read)
//   ampdist ckpt verify PATH                                   reads and checks every file; exit 1 on any problem
//   ampdist ckpt export PATH --format safetensors -o FILE      the FP32 master weights by tensor name
//   ampdist ckpt export PATH --format hf -o DIR                a Hugging Face GPT-2 model directory (config.json,
//                                                              model.safetensors in GPT2LMHeadModel's names and
//                                                              Conv1D layout, the padded vocabulary removed), which
//                                                              transformers' from_pretrained(DIR) loads
//
// PATH is a checkpoint directory (step_XXXXXXXX) or, for inspect and export, a directory of checkpoints (a run's
// checkpoints/), which means its newest complete checkpoint; verify on a directory of checkpoints checks every
// complete one. They need no communicator: run them without mpirun (under mpirun, rank 0 does the work and every
// rank exits with its code). Errors are one line "ampdist: error: ..." on stderr; exit 2 for bad input.
#pragma once

#include <string>

namespace ampdist {

struct CkptArgs {
  std::string path;                   // PATH
  std::string format = "safetensors";  // export --format
  std::string output;                  // export -o FILE
};

int run_ckpt_inspect(const CkptArgs& args);
int run_ckpt_verify(const CkptArgs& args);
int run_ckpt_export(const CkptArgs& args);

}  // namespace ampdist

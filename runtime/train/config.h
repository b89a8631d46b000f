// Reading, overriding and validating the run config (proto/ampdist/config.proto, protobuf text format).
//
// Every function throws ampdist::Error of kind kBadInput with one line naming the file (and line:column) or the
// field, e.g. "run.pbtxt:4:3: Message type "ampdist.OptimizerConfig" has no field named "lrr"." or
// "run.pbtxt: optimizer.lr must be > 0, got -1".
#pragma once

#include <string>

#include "ampdist/config.pb.h"
#include "runtime/core/dtype.h"

namespace ampdist {

// Parses `path`; unknown fields are errors. Sets name (default: the file's stem) but does not validate.
RunConfig parse_config_file(const std::string& path);
// Parses text-format `text`; `source` names it in errors.
RunConfig parse_config_text(const std::string& text, const std::string& source);

// Applies one "--set field.path=value" assignment, e.g. "optimizer.lr=0.05", "model.mlp.hidden=[512, 256]",
// "precision.dtype=BF16", "log.dir=runs/x". A repeated field is replaced, not appended to; setting a member of a
// oneof selects it.
void apply_override(RunConfig& cfg, const std::string& assignment);

// Checks every value; `source` names the config in errors. Every string field, at any depth, must be valid UTF-8
// without NUL bytes: strings reach metrics.jsonl, TensorBoard's event file and paths.
void validate_config(const RunConfig& cfg, const std::string& source);
// The run's ZeRO stage, decided here once: optimizer.zero_stage, or 1 when only the deprecated alias
// comm.mode: REDUCE_SCATTER asks for it (validate_config refuses the two set against each other).
int zero_stage(const RunConfig& cfg);
// What the device a run resolved to cannot run: on the GPU backend, conv models (model.cnn, model.resnet) in a build
// without GPU convolutions (no cuDNN). Throws Error (bad input) with one line naming the field.
void validate_for_device(const RunConfig& cfg, Device device, const std::string& source);

// Throws Error (bad input) "<where>: not valid UTF-8 (byte 0xe8 at offset 3 of "mod?le")" when `value` is not valid
// UTF-8 or holds a NUL byte; `where` names the field or the command-line option.
void check_text(const std::string& value, const std::string& where);

// The working dtype of a run on `device`: AUTO is bf16 on a GPU with bf16 tensor cores (compute capability >= 8.0),
// fp16 (with dynamic loss scaling, the default for fp16) on older GPUs, and fp32 on the CPU backend.
DType resolve_dtype(DTypeName name, Device device, bool device_has_bf16 = true);

// The device a run uses: device.command_line_kind (`--device`) if set, else AMPDIST_DEVICE (cpu, cuda, auto) if set,
// else device.kind; AUTO is the GPU when this build has the CUDA backend and a GPU is visible. Throws Error (bad input) for CUDA without a usable GPU, or a bad
// AMPDIST_DEVICE value.
Device resolve_device(const RunConfig& cfg);
// Sets device.command_line_kind from a `--device` value (cpu, cuda, auto); throws Error (bad input) naming
// `--device` for any other value.
void set_command_line_device(RunConfig& cfg, const std::string& value);
// The config's spelling of a dtype: FP32, FP16, BF16.
DTypeName dtype_to_name(DType t);

}  // namespace ampdist

#include "runtime/train/config.h"

#include <cstdlib>

#include "runtime/core/device.h"
#include "runtime/kernels/cnn.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <utf8cpp/utf8.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/amp/autocast.h"
#include "runtime/core/error.h"
#include "runtime/amp/scaler_rule.h"

namespace ampdist {
namespace {

namespace pb = google::protobuf;

class FirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (message_.empty()) message_ = std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

std::string fmt_hex_byte(unsigned char c) {
  const char* digits = "0123456789abcdef";
  return {digits[c >> 4], digits[c & 15]};
}

template <typename T>
std::string str(T v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace

RunConfig parse_config_text(const std::string& text, const std::string& source) {
  RunConfig cfg;
  FirstError errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  // Errors read "source:line:col: message".
  if (!parser.ParseFromString(text, &cfg))
    throw Error(source + ":" + (errors.message().empty() ? " not a valid RunConfig" : errors.message()),
                ErrorKind::kBadInput);
  return cfg;
}

RunConfig parse_config_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw BadInput(path, "no such config file");
  if (std::filesystem::is_directory(path, ec)) throw BadInput(path, "is a directory, expected a .pbtxt config file");
  // A FIFO or a device would block the read (and every rank with it); /dev/null reads as an empty config.
  if (!std::filesystem::is_regular_file(path, ec) && path != "/dev/null")
    throw BadInput(path, "is not a regular file, expected a .pbtxt config file");
  std::ifstream in(path);
  if (!in) throw BadInput(path, "cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  RunConfig cfg = parse_config_text(ss.str(), path);
  if (!cfg.has_name()) cfg.set_name(std::filesystem::path(path).stem().string());
  return cfg;
}

void apply_override(RunConfig& cfg, const std::string& assignment) {
  const std::string where = "--set " + assignment;
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == assignment.size())
    throw BadInput(where, "expected field.path=value");
  const std::string path = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);

  // Walk the path through the descriptors, building "a { b { c: value } }".
  std::vector<std::string> parts;
  std::stringstream ps(path);
  for (std::string p; std::getline(ps, p, '.');) parts.push_back(p);
  pb::Message* msg = &cfg;
  std::string prefix, suffix;
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::Descriptor* d = msg->GetDescriptor();
    const pb::FieldDescriptor* f = d->FindFieldByName(parts[i]);
    if (!f) throw BadInput(where, "no field '" + parts[i] + "' in " + (i ? parts[i - 1] : std::string("the config")));
    const bool last = i + 1 == parts.size();
    if (!last) {
      if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE || f->is_repeated())
        throw BadInput(where, "'" + parts[i] + "' is not a section");
      msg = msg->GetReflection()->MutableMessage(msg, f);
      prefix += parts[i] + " { ";
      suffix = " }" + suffix;
      continue;
    }
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE)
      throw BadInput(where, "'" + parts[i] + "' is a section; set one of its fields");
    // The value must be one scalar (or one [list] for a repeated field): it is spliced into text format, so
    // braces or a second field would set other fields behind the user's back.
    const bool is_string = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING;
    const bool control = std::any_of(value.begin(), value.end(), [](unsigned char c) { return c < 0x20; });
    if (!is_string && (control || value.find_first_of(f->is_repeated() ? "{}<>:;#\"'" : "{}<>:;#\"'[], ") !=
                                      std::string::npos))
      throw BadInput(where, "bad value '" + value + "' for " + path + ": expected a single " +
                                (f->is_repeated() ? "[list]" : "value"));
    // String values always become string literals: surrounding quotes the shell left in are dropped, everything
    // else escaped. A repeated string field takes "a,b" or "[a, b]".
    auto literal = [](std::string v) {
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      std::string quoted = "\"";
      for (char c : v) {
        if (c == '"' || c == '\\') quoted += '\\';
        quoted += c == '\n' ? std::string("\\n") : std::string(1, c);
      }
      return quoted + "\"";
    };
    if (is_string && !f->is_repeated()) value = literal(value);
    if (is_string && f->is_repeated()) {
      std::string items = value;
      if (items.size() >= 2 && items.front() == '[' && items.back() == ']') items = items.substr(1, items.size() - 2);
      std::string list = "[";
      std::stringstream ss(items);
      for (std::string item; std::getline(ss, item, ',');) {
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        if (!item.empty()) list += (list.size() > 1 ? ", " : "") + literal(item);
      }
      value = list + "]";
    }
    if (f->is_repeated()) {
      msg->GetReflection()->ClearField(msg, f);
      if (value.front() != '[') value = "[" + value + "]";
    }
    prefix += parts[i] + ": ";
  }
  FirstError errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.MergeFromString(prefix + value + suffix, &cfg))
    throw BadInput(where, "bad value '" + assignment.substr(eq + 1) + "' for " + path);
}

DType resolve_dtype(DTypeName name, Device device, bool device_has_bf16) {
  switch (name) {
    case FP16: return DType::kFloat16;
    case BF16: return DType::kBFloat16;
    case AUTO:
      if (device != Device::kCUDA) return DType::kFloat32;
      return device_has_bf16 ? DType::kBFloat16 : DType::kFloat16;
    default: return DType::kFloat32;
  }
}

Device resolve_device(const RunConfig& cfg) {
  DeviceKind kind = cfg.device().kind();
  std::string source = "device.kind";
  if (cfg.device().has_command_line_kind()) {
    kind = cfg.device().command_line_kind();
    source = "--device";
  } else if (const char* env = std::getenv("AMPDIST_DEVICE"); env && *env) {
    const std::string v = env;
    source = "AMPDIST_DEVICE=" + v;
    if (v == "cpu") kind = DEVICE_CPU;
    else if (v == "cuda") kind = DEVICE_CUDA;
    else if (v == "auto") kind = DEVICE_AUTO;
    else throw Error("AMPDIST_DEVICE: bad value '" + v + "' (expected cpu, cuda or auto)", ErrorKind::kBadInput);
  }
  if (kind == DEVICE_CPU) return Device::kCPU;
  const int gpus = device::device_count();
  if (kind == DEVICE_CUDA && gpus == 0)
    throw Error(source + " asks for the GPU, but " + device::unavailable_reason(), ErrorKind::kBadInput);
  return gpus > 0 ? Device::kCUDA : Device::kCPU;
}

void set_command_line_device(RunConfig& cfg, const std::string& value) {
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "cpu") cfg.mutable_device()->set_command_line_kind(DEVICE_CPU);
  else if (v == "cuda") cfg.mutable_device()->set_command_line_kind(DEVICE_CUDA);
  else if (v == "auto") cfg.mutable_device()->set_command_line_kind(DEVICE_AUTO);
  else throw BadInput("--device", "expected cpu, cuda or auto, got '" + value + "'");
}

DTypeName dtype_to_name(DType t) {
  switch (t) {
    case DType::kFloat16: return FP16;
    case DType::kBFloat16: return BF16;
    case DType::kFloat32: break;
  }
  return FP32;
}

void check_text(const std::string& value, const std::string& where) {
  const auto bad = utf8::find_invalid(value.begin(), value.end());
  const size_t nul = value.find('\0');
  if (bad == value.end() && nul == std::string::npos) return;
  const size_t at = bad != value.end() ? static_cast<size_t>(bad - value.begin()) : nul;
  std::string shown;  // the value with every byte that is not printable ASCII as '?'
  for (unsigned char c : value.substr(0, 80)) shown += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
  throw Error(where + ": " + (bad != value.end() ? "not valid UTF-8" : "holds a NUL byte") + " (byte 0x" +
                  fmt_hex_byte(static_cast<unsigned char>(value[at])) + " at offset " + std::to_string(at) + " of \"" +
                  shown + "\")",
              ErrorKind::kBadInput);
}

namespace {

// check_text over every string field of `m` (not bytes), naming it by its path: "data.text.paths[1]".
void check_strings(const pb::Message& m, const std::string& prefix, const std::string& source) {
  const pb::Reflection* r = m.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    const std::string name = prefix + f->name();
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string at = f->is_repeated() ? name + "[" + std::to_string(i) + "]" : name;
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        check_strings(f->is_repeated() ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f), at + ".", source);
      } else if (f->type() == pb::FieldDescriptor::TYPE_STRING) {
        check_text(f->is_repeated() ? r->GetRepeatedString(m, f, i) : r->GetString(m, f), source + ": " + at);
      }
    }
  }
}

}  // namespace

int zero_stage(const RunConfig& cfg) {
  if (cfg.optimizer().has_zero_stage()) return cfg.optimizer().zero_stage();
  return cfg.comm().mode() == REDUCE_SCATTER ? 1 : 0;
}

void validate_for_device(const RunConfig& cfg, Device device, const std::string& source) {
  if (device == Device::kCUDA && (cfg.model().has_cnn() || cfg.model().has_resnet()) && !kernels::gpu_convolutions())
    throw BadInput(source, std::string("model.") + (cfg.model().has_cnn() ? "cnn" : "resnet") +
                               ": this build has no GPU convolutions (it was built without cuDNN); "
                               "use --device cpu, or rebuild where cudnn.h and libcudnn are found");
}

namespace {

// The checks of validate_config, one config section each. Every failure is BadInput naming `source` and the field.
struct FieldCheck {
  const std::string& source;
  [[noreturn]] void fail(const std::string& field, const std::string& rule, const std::string& got) const {
    throw BadInput(source, field + " " + rule + ", got " + got);
  }
  void positive(const std::string& field, double v) const {
    if (!(v > 0) || !std::isfinite(v)) fail(field, "must be > 0", str(v));
  }
  void non_negative(const std::string& field, double v) const {
    if (!(v >= 0) || !std::isfinite(v)) fail(field, "must be >= 0", str(v));
  }
  void in_unit(const std::string& field, double v) const {  // [0, 1)
    if (!(v >= 0 && v < 1)) fail(field, "must be in [0, 1)", str(v));
  }
};

void check_model(const RunConfig& cfg, const FieldCheck& c) {
  const std::string& source = c.source;
  const DataConfig& d = cfg.data();
  if (!cfg.has_model() || cfg.model().kind_case() == ModelConfig::KIND_NOT_SET)
    throw BadInput(source, "model: set mlp { ... }, gpt { ... }, cnn { ... } or resnet { ... }");
  const bool conv_model = cfg.model().has_cnn() || cfg.model().has_resnet();
  if (conv_model && d.kind_case() != DataConfig::kIdx &&
      !(d.has_synthetic() && d.synthetic().image_shape_size() == 3))
    c.fail("data", std::string("model.") + (cfg.model().has_cnn() ? "cnn" : "resnet") +
                     " needs images: idx { ... } or synthetic { image_shape: [C, H, W] }",
         d.has_synthetic() ? "synthetic feature vectors" : "token data");
  if (cfg.model().has_cnn() && cfg.model().cnn().conv_size() == 0)
    c.fail("model.cnn.conv", "must list at least one convolution", "none");
  for (int i = 0; i < cfg.model().cnn().conv_size(); ++i)
    c.positive("model.cnn.conv[" + std::to_string(i) + "].channels",
             static_cast<double>(cfg.model().cnn().conv(i).channels()));
  if (cfg.model().has_resnet() && cfg.model().resnet().depth() != 18 && cfg.model().resnet().depth() != 34)
    c.fail("model.resnet.depth", "must be 18 or 34", str(cfg.model().resnet().depth()));
  if (cfg.model().has_resnet() && cfg.model().resnet().stem() == RESNET_STEM_UNSPECIFIED)
    c.fail("model.resnet.stem", "must be IMAGENET or SMALL", "RESNET_STEM_UNSPECIFIED");
  if (cfg.model().sync_batchnorm() && !conv_model)
    c.fail("model.sync_batchnorm", "applies to cnn { ... } and resnet { ... } models only", "true");
  for (int i = 0; i < cfg.model().mlp().hidden_size(); ++i)
    c.positive("model.mlp.hidden[" + std::to_string(i) + "]", static_cast<double>(cfg.model().mlp().hidden(i)));
}

// data { ... }, and the GPT model's fields, which go with its token data.
void check_data(const RunConfig& cfg, const FieldCheck& c) {
  const std::string& source = c.source;
  const DataConfig& d = cfg.data();
  if (d.kind_case() == DataConfig::KIND_NOT_SET) throw BadInput(source, "data: set idx { ... } or synthetic { ... }");
  c.positive("data.global_batch_size", static_cast<double>(d.global_batch_size()));
  c.positive("data.prefetch_steps", d.prefetch_steps());
  if (d.prefetch_steps() > 64) c.fail("data.prefetch_steps", "must be <= 64", str(d.prefetch_steps()));
  if (d.eval_batch_size() < 0)
    c.fail("data.eval_batch_size", "must be >= 0 (0: the training micro-batch)", str(d.eval_batch_size()));
  if (d.has_idx()) {
    if (d.idx().dir().empty()) c.fail("data.idx.dir", "must name a directory", "\"\"");
    c.positive("data.idx.std", d.idx().std());
    if (!std::isfinite(d.idx().mean())) c.fail("data.idx.mean", "must be finite", str(d.idx().mean()));
  }
  if (cfg.model().has_gpt()) {
    const GptConfig& g = cfg.model().gpt();
    c.positive("model.gpt.n_head", g.n_head());
    c.positive("model.gpt.n_embd", g.n_embd());
    c.positive("model.gpt.seq_len", g.seq_len());
    c.non_negative("model.gpt.n_layer", g.n_layer());
    if (g.n_embd() % std::max(g.n_head(), 1) != 0)
      c.fail("model.gpt.n_embd", "must be a multiple of model.gpt.n_head (" + str(g.n_head()) + ")", str(g.n_embd()));
    if (g.vocab_size() < 2 || g.vocab_size() > 65536)
      c.fail("model.gpt.vocab_size", "must be in [2, 65536] (uint16 tokens)", str(g.vocab_size()));
    c.in_unit("model.gpt.dropout", g.dropout());
    c.positive("model.gpt.init_scale", g.init_scale());
    if (g.padded_vocab_multiple() < 1 || g.padded_vocab_multiple() > 4096)
      c.fail("model.gpt.padded_vocab_multiple", "must be in [1, 4096]", str(g.padded_vocab_multiple()));
    c.non_negative("model.gpt.head_chunk_rows", g.head_chunk_rows());
    if (!d.has_tokens() && !d.has_text()) c.fail("data", "a gpt model needs tokens { ... } or text { ... }", "unset");
  } else if (d.has_tokens() || d.has_text()) {
    c.fail("data", "tokens { ... } and text { ... } are read by model { gpt { ... } } only", "an mlp model");
  }
  if (d.has_tokens()) c.non_negative("data.tokens.stride", static_cast<double>(d.tokens().stride()));
  if (d.has_text()) {
    c.in_unit("data.text.val_fraction", d.text().val_fraction());
    c.non_negative("data.text.stride", static_cast<double>(d.text().stride()));
    if (d.text().paths().empty()) c.fail("data.text.paths", "must name at least one file or directory", "[]");
  }
  if (d.has_synthetic()) {
    c.positive("data.synthetic.train_samples", static_cast<double>(d.synthetic().train_samples()));
    c.positive("data.synthetic.test_samples", static_cast<double>(d.synthetic().test_samples()));
    c.positive("data.synthetic.features", static_cast<double>(d.synthetic().features()));
    if (d.synthetic().classes() < 2) c.fail("data.synthetic.classes", "must be >= 2", str(d.synthetic().classes()));
    c.non_negative("data.synthetic.noise", d.synthetic().noise());
  }
}

void check_optimizer(const RunConfig& cfg, const FieldCheck& c) {
  const std::string& source = c.source;
  const OptimizerConfig& o = cfg.optimizer();
  c.positive("optimizer.lr", o.lr());
  c.non_negative("optimizer.weight_decay", o.weight_decay());
  c.non_negative("optimizer.clip_grad_norm", o.clip_grad_norm());
  if (o.zero_stage() != 0 && o.zero_stage() != 1)
    c.fail("optimizer.zero_stage", "must be 0 (replicated optimizer state) or 1 (sharded)", str(o.zero_stage()));
  for (int i = 0; i < o.no_decay_size(); ++i)
    if (o.no_decay(i).empty())
      c.fail("optimizer.no_decay[" + std::to_string(i) + "]", "must be a name pattern", "\"\"");
  if (cfg.model().has_init_from() && cfg.model().init_from().empty())
    c.fail("model.init_from", "must name a safetensors file or a Hugging Face model directory", "\"\"");
  if (o.accumulation_steps() < 1)
    c.fail("optimizer.accumulation_steps", "must be >= 1", str(o.accumulation_steps()));
  if (o.has_sgd()) {
    c.in_unit("optimizer.sgd.momentum", o.sgd().momentum());
    if (!(o.sgd().dampening() >= 0 && o.sgd().dampening() <= 1))
      c.fail("optimizer.sgd.dampening", "must be in [0, 1]", str(o.sgd().dampening()));
    if (o.sgd().nesterov() && (o.sgd().momentum() <= 0 || o.sgd().dampening() != 0))
      throw BadInput(source, "optimizer.sgd.nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  }
  if (o.has_adamw()) {
    c.in_unit("optimizer.adamw.beta1", o.adamw().beta1());
    c.in_unit("optimizer.adamw.beta2", o.adamw().beta2());
    c.positive("optimizer.adamw.eps", o.adamw().eps());
  }
  const ScheduleConfig& s = o.schedule();
  if (s.kind() == SCHEDULE_UNSPECIFIED) c.fail("optimizer.schedule.kind", "must be CONSTANT or COSINE", "UNSPECIFIED");
  c.non_negative("optimizer.schedule.warmup_steps", static_cast<double>(s.warmup_steps()));
  c.non_negative("optimizer.schedule.total_steps", static_cast<double>(s.total_steps()));
  c.non_negative("optimizer.schedule.min_lr", s.min_lr());
  if (s.min_lr() > o.lr()) c.fail("optimizer.schedule.min_lr", "must be <= optimizer.lr", str(s.min_lr()));
}

void check_precision(const RunConfig& cfg, const FieldCheck& c) {
  const PrecisionConfig& p = cfg.precision();
  if (p.dtype() == DTYPE_UNSPECIFIED) c.fail("precision.dtype", "must be FP32, FP16, BF16 or AUTO", "UNSPECIFIED");
  // A loss scale is a finite, normal FP32 number (so is its inverse): a zero, subnormal or infinite scale would
  // skip every step or never unscale (amp/scaler_rule.h, is_valid_loss_scale).
  auto loss_scale = [&](const std::string& field, float v) {
    if (!is_valid_loss_scale(v))
      c.fail(field, "must be a finite, normal FP32 number in [1.17549e-38, 3.40282e+38] (a loss scale and its inverse "
                  "must be representable)", str(v));
  };
  if (p.has_dynamic()) {
    const DynamicLossScaleConfig& dy = p.dynamic();
    loss_scale("precision.dynamic.init_scale", dy.init_scale());
    if (!(dy.growth_factor() > 1) || !std::isfinite(dy.growth_factor()))
      c.fail("precision.dynamic.growth_factor", "must be > 1", str(dy.growth_factor()));
    if (!(dy.backoff_factor() > 0 && dy.backoff_factor() < 1))
      c.fail("precision.dynamic.backoff_factor", "must be in (0, 1)", str(dy.backoff_factor()));
    if (dy.growth_interval() < 1)
      c.fail("precision.dynamic.growth_interval", "must be >= 1", str(dy.growth_interval()));
    if (dy.hysteresis() < 1) c.fail("precision.dynamic.hysteresis", "must be >= 1", str(dy.hysteresis()));
    loss_scale("precision.dynamic.min_scale", dy.min_scale());
    if (dy.min_scale() > dy.init_scale())
      c.fail("precision.dynamic.min_scale", "must be <= precision.dynamic.init_scale", str(dy.min_scale()));
  }
  if (p.has_static_scale()) loss_scale("precision.static_scale.scale", p.static_scale().scale());
  for (const std::string& op : p.fp32_ops())
    if (!parse_op_kind(op))
      c.fail("precision.fp32_ops", "must name ops of the autocast table (linear, relu, gelu, ...)", "\"" + op + "\"");
}

void check_comm(const RunConfig& cfg, const FieldCheck& c) {
  const CommConfig& comm = cfg.comm();
  c.positive("comm.bucket_cap_mb", comm.bucket_cap_mb());
  if (comm.reduce_dtype() != FP32 && comm.reduce_dtype() != FP16 && comm.reduce_dtype() != BF16)
    c.fail("comm.reduce_dtype", "must be FP32, FP16 or BF16", DTypeName_Name(comm.reduce_dtype()));
  if (comm.mode() == REDUCE_MODE_UNSPECIFIED)
    c.fail("comm.mode", "must be ALLREDUCE or REDUCE_SCATTER", "UNSPECIFIED");
  if (comm.mode() == REDUCE_SCATTER && cfg.optimizer().has_zero_stage() && cfg.optimizer().zero_stage() == 0)
    c.fail("comm.mode", "REDUCE_SCATTER (the deprecated alias of optimizer.zero_stage: 1) contradicts "
           "optimizer.zero_stage: 0; set optimizer.zero_stage alone", "REDUCE_SCATTER");
  if (!(comm.timeout_s() >= 1.0) || !std::isfinite(comm.timeout_s()))
    c.fail("comm.timeout_s", "must be >= 1 (seconds)", str(comm.timeout_s()));
}

// train, log, the non-finite policy's bounds, checkpoint and fault drills.
void check_run(const RunConfig& cfg, const FieldCheck& c) {
  const DataConfig& d = cfg.data();
  const PrecisionConfig& p = cfg.precision();
  const TrainConfig& t = cfg.train();
  c.non_negative("train.steps", static_cast<double>(t.steps()));
  c.non_negative("train.epochs", static_cast<double>(t.epochs()));  // steps 0 and epochs 0: evaluation only
  // Bounds that keep step arithmetic (epochs x steps per epoch, step x global batch) far from int64 overflow.
  if (t.steps() > (int64_t{1} << 40)) c.fail("train.steps", "must be <= 2^40", str(t.steps()));
  if (t.epochs() > 1000000) c.fail("train.epochs", "must be <= 1000000", str(t.epochs()));
  if (d.global_batch_size() > (int64_t{1} << 31))
    c.fail("data.global_batch_size", "must be <= 2^31", str(d.global_batch_size()));
  c.non_negative("train.eval_every_epochs", static_cast<double>(t.eval_every_epochs()));
  c.non_negative("train.eval_every_steps", static_cast<double>(t.eval_every_steps()));
  c.non_negative("train.threads_per_rank", t.threads_per_rank());
  c.positive("log.every_steps", static_cast<double>(cfg.log().every_steps()));

  if (p.on_nonfinite() == NONFINITE_POLICY_UNSPECIFIED)
    c.fail("precision.on_nonfinite", "must be SKIP or DROP_RANK", "UNSPECIFIED");
  // DROP_RANK's count all-reduce carries sample counts as FP32, exact up to 2^24 (train/step.cc).
  if (p.on_nonfinite() == DROP_RANK && d.global_batch_size() > (int64_t{1} << 24))
    c.fail("data.global_batch_size", "must be <= 2^24 with precision.on_nonfinite: DROP_RANK",
         str(d.global_batch_size()));
  c.non_negative("precision.max_consecutive_skips", static_cast<double>(p.max_consecutive_skips()));
  c.non_negative("precision.numerics_report_every", static_cast<double>(p.numerics_report_every()));
  if (cfg.checkpoint().on_save_error() == SAVE_ERROR_POLICY_UNSPECIFIED)
    c.fail("checkpoint.on_save_error", "must be CONTINUE or STOP", "UNSPECIFIED");
  c.non_negative("checkpoint.every_steps", static_cast<double>(cfg.checkpoint().every_steps()));
  c.non_negative("checkpoint.every_minutes", cfg.checkpoint().every_minutes());
  c.non_negative("checkpoint.keep_last", cfg.checkpoint().keep_last());
  if (cfg.fault().has_stall()) c.non_negative("fault.stall.seconds", cfg.fault().stall().seconds());
  if (cfg.fault().has_slow_save()) c.non_negative("fault.slow_save.seconds", cfg.fault().slow_save().seconds());

  for (int i = 0; i < cfg.fault().inject_nonfinite_size(); ++i) {
    const NonFiniteInjection& f = cfg.fault().inject_nonfinite(i);
    const std::string field = "fault.inject_nonfinite[" + std::to_string(i) + "]";
    if (f.step() < 1) c.fail(field + ".step", "must be >= 1", str(f.step()));
    if (f.value() == NONFINITE_UNSPECIFIED) c.fail(field + ".value", "must be POS_INF, NEG_INF or QNAN", "UNSPECIFIED");
    if (f.target() == INJECT_TARGET_UNSPECIFIED)
      c.fail(field + ".target", "must be GRADIENT, INPUT or ACTIVATION", "UNSPECIFIED");
    if (f.target() == ACTIVATION && f.layer().empty())
      c.fail(field + ".layer", "must name a layer (e.g. \"fc2\") for target ACTIVATION", "\"\"");
    c.non_negative(field + ".element", static_cast<double>(f.element()));
  }
}

}  // namespace

void validate_config(const RunConfig& cfg, const std::string& source) {
  check_strings(cfg, "", source);
  const FieldCheck c{source};
  if (cfg.has_name() && (cfg.name().empty() || cfg.name().find('/') != std::string::npos || cfg.name() == "." ||
                         cfg.name() == ".."))
    c.fail("name", "must be a plain name (it names the run directory runs/<name>)", "\"" + cfg.name() + "\"");
  check_model(cfg, c);
  check_data(cfg, c);
  check_optimizer(cfg, c);
  check_precision(cfg, c);
  check_comm(cfg, c);
  check_run(cfg, c);
}

}  // namespace ampdist

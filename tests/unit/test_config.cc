// Run config: parsing (text format), --set overrides, validation, and the shipped example config.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>

#include "runtime/core/error.h"
#include "runtime/kernels/cnn.h"
#include "runtime/train/config.h"
#include "runtime/train/lint.h"

namespace ampdist {
namespace {

const char* kValid = R"(name: "t"
model { mlp { hidden: [8, 4] activation: GELU } }
data { synthetic { features: 4 classes: 3 } global_batch_size: 16 }
optimizer { sgd { momentum: 0.9 } lr: 0.1 }
precision { dtype: FP16 fp32_layers: "fc1" fp32_ops: "gelu" }
)";

// Runs f, expects an ampdist::Error of kind kBadInput, returns its message.
std::string bad_input_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an ampdist::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Config, ParsesValidText) {
  const RunConfig cfg = parse_config_text(kValid, "valid.pbtxt");
  EXPECT_EQ(cfg.name(), "t");
  ASSERT_TRUE(cfg.model().has_mlp());
  ASSERT_EQ(cfg.model().mlp().hidden_size(), 2);
  EXPECT_EQ(cfg.model().mlp().hidden(0), 8);
  EXPECT_EQ(cfg.model().mlp().hidden(1), 4);
  EXPECT_EQ(cfg.model().mlp().activation(), GELU);
  EXPECT_TRUE(cfg.model().mlp().bias());  // default
  EXPECT_TRUE(cfg.data().has_synthetic());
  EXPECT_EQ(cfg.data().synthetic().features(), 4);
  EXPECT_EQ(cfg.data().synthetic().train_samples(), 4096);  // default
  EXPECT_EQ(cfg.data().global_batch_size(), 16);
  EXPECT_TRUE(cfg.optimizer().has_sgd());
  EXPECT_FLOAT_EQ(cfg.optimizer().sgd().momentum(), 0.9f);
  EXPECT_FLOAT_EQ(cfg.optimizer().lr(), 0.1f);
  EXPECT_EQ(cfg.precision().dtype(), FP16);
  EXPECT_EQ(cfg.precision().fp32_layers(0), "fc1");
  EXPECT_FLOAT_EQ(cfg.comm().bucket_cap_mb(), 25.0f);
  EXPECT_EQ(cfg.train().seed(), 1234u);
  EXPECT_NO_THROW(validate_config(cfg, "valid.pbtxt"));
}

TEST(Config, UnknownFieldNamesSourceLineColumnAndField) {
  const std::string text = "name: \"x\"\noptimizer {\n  lrr: 1\n}\n";
  const std::string msg = bad_input_message([&] { parse_config_text(text, "run.pbtxt"); });
  // Line 3 (1-based). protobuf's parser reports the column where it stood after reading the name ("  lrr" -> the
  // ':' in column 6), so only "some column" is asserted for it.
  EXPECT_TRUE(std::regex_search(msg, std::regex(R"(^run\.pbtxt:3:[0-9]+: )"))) << msg;
  EXPECT_TRUE(contains(msg, "lrr")) << msg;
}

TEST(Config, MalformedTextNamesLine) {
  const std::string text = "name: \"x\"\nmodel {\n  mlp { hidden: 8 }\n";  // missing closing brace
  const std::string msg = bad_input_message([&] { parse_config_text(text, "broken.pbtxt"); });
  EXPECT_TRUE(std::regex_search(msg, std::regex(R"(broken\.pbtxt:[0-9]+:[0-9]+: )"))) << msg;
  const std::string msg2 = bad_input_message([&] { parse_config_text("optimizer { lr: }\n", "b2.pbtxt"); });
  EXPECT_TRUE(contains(msg2, "b2.pbtxt:1:")) << msg2;
}

struct BadCase {
  std::string field;
  std::function<void(RunConfig&)> mutate;
};

TEST(Config, ValidateRejectsBadValuesNamingTheField) {
  const std::vector<BadCase> cases = {
      {"optimizer.lr", [](RunConfig& c) { c.mutable_optimizer()->set_lr(-1); }},
      {"optimizer.lr", [](RunConfig& c) { c.mutable_optimizer()->set_lr(0); }},
      {"precision.dynamic.growth_factor", [](RunConfig& c) { c.mutable_precision()->mutable_dynamic()->set_growth_factor(1.0f); }},
      {"precision.dynamic.backoff_factor", [](RunConfig& c) { c.mutable_precision()->mutable_dynamic()->set_backoff_factor(1.5f); }},
      {"comm.bucket_cap_mb", [](RunConfig& c) { c.mutable_comm()->set_bucket_cap_mb(0); }},
      {"data.global_batch_size", [](RunConfig& c) { c.mutable_data()->set_global_batch_size(0); }},
      {"optimizer.accumulation_steps", [](RunConfig& c) { c.mutable_optimizer()->set_accumulation_steps(0); }},
      {"precision.fp32_ops", [](RunConfig& c) { c.mutable_precision()->add_fp32_ops("softmaxx"); }},
      {"model", [](RunConfig& c) { c.clear_model(); }},
      {"data", [](RunConfig& c) { c.clear_data(); }},
  };
  for (const BadCase& bc : cases) {
    RunConfig cfg = parse_config_text(kValid, "v.pbtxt");
    bc.mutate(cfg);
    const std::string msg = bad_input_message([&] { validate_config(cfg, "v.pbtxt"); });
    EXPECT_TRUE(contains(msg, bc.field)) << "expected '" << bc.field << "' in: " << msg;
    EXPECT_TRUE(contains(msg, "v.pbtxt")) << msg;
  }
  // The unknown op's name is quoted in the message.
  RunConfig cfg = parse_config_text(kValid, "v.pbtxt");
  cfg.mutable_precision()->add_fp32_ops("softmaxx");
  EXPECT_TRUE(contains(bad_input_message([&] { validate_config(cfg, "v.pbtxt"); }), "softmaxx"));
}

TEST(Config, ApplyOverride) {
  RunConfig cfg = parse_config_text(kValid, "v.pbtxt");
  apply_override(cfg, "optimizer.lr=0.5");
  EXPECT_FLOAT_EQ(cfg.optimizer().lr(), 0.5f);
  EXPECT_TRUE(cfg.optimizer().has_sgd());  // siblings kept
  EXPECT_FLOAT_EQ(cfg.optimizer().sgd().momentum(), 0.9f);

  apply_override(cfg, "model.mlp.hidden=[32, 16]");
  ASSERT_EQ(cfg.model().mlp().hidden_size(), 2);  // replaced, not appended to [8, 4]
  EXPECT_EQ(cfg.model().mlp().hidden(0), 32);
  EXPECT_EQ(cfg.model().mlp().hidden(1), 16);
  EXPECT_EQ(cfg.model().mlp().activation(), GELU);
  apply_override(cfg, "model.mlp.hidden=64");
  ASSERT_EQ(cfg.model().mlp().hidden_size(), 1);
  EXPECT_EQ(cfg.model().mlp().hidden(0), 64);

  apply_override(cfg, "log.dir=runs/x");
  EXPECT_EQ(cfg.log().dir(), "runs/x");
  apply_override(cfg, "precision.dtype=BF16");
  EXPECT_EQ(cfg.precision().dtype(), BF16);
  EXPECT_EQ(cfg.precision().fp32_layers(0), "fc1");

  apply_override(cfg, "optimizer.adamw.beta1=0.95");
  EXPECT_TRUE(cfg.optimizer().has_adamw());  // selects the oneof member
  EXPECT_FALSE(cfg.optimizer().has_sgd());
  EXPECT_FLOAT_EQ(cfg.optimizer().adamw().beta1(), 0.95f);
  EXPECT_FLOAT_EQ(cfg.optimizer().adamw().beta2(), 0.999f);
  EXPECT_FLOAT_EQ(cfg.optimizer().lr(), 0.5f);
  EXPECT_NO_THROW(validate_config(cfg, "v.pbtxt"));
  apply_override(cfg, "train.steps=7");
  EXPECT_EQ(cfg.train().steps(), 7);
}

TEST(Config, ApplyOverrideErrors) {
  RunConfig cfg = parse_config_text(kValid, "v.pbtxt");
  EXPECT_TRUE(contains(bad_input_message([&] { apply_override(cfg, "optimizer.lrr=1"); }), "lrr"));
  EXPECT_TRUE(contains(bad_input_message([&] { apply_override(cfg, "nosuch.lr=1"); }), "nosuch"));
  EXPECT_TRUE(contains(bad_input_message([&] { apply_override(cfg, "optimizer.lr=abc"); }), "abc"));
  bad_input_message([&] { apply_override(cfg, "optimizer.lr"); });   // no '='
  bad_input_message([&] { apply_override(cfg, "optimizer.lr="); });  // no value
  bad_input_message([&] { apply_override(cfg, "=1"); });             // no field
  bad_input_message([&] { apply_override(cfg, "optimizer=1"); });    // a section, not a field
  bad_input_message([&] { apply_override(cfg, "precision.dtype=FP64"); });
  // A failed override leaves the value as it was.
  EXPECT_FLOAT_EQ(cfg.optimizer().lr(), 0.1f);
}

TEST(Config, ParseFileMissingPathNamesIt) {
  const std::string path = "/nonexistent/ampdist/run_config.pbtxt";
  EXPECT_TRUE(contains(bad_input_message([&] { parse_config_file(path); }), path));
}

TEST(Config, ParseFileDefaultsNameToStem) {
  const auto dir = std::filesystem::temp_directory_path() / ("ampdist_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "my_run.pbtxt";
  {
    std::ofstream out(path);
    out << "model { mlp { } }\ndata { synthetic { } }\n";
  }
  const RunConfig cfg = parse_config_file(path.string());
  EXPECT_EQ(cfg.name(), "my_run");
  EXPECT_NO_THROW(validate_config(cfg, path.string()));
  {
    std::ofstream out(path);
    out << "model {\n  mlp { hiddn: 3 }\n}\n";
  }
  const std::string msg = bad_input_message([&] { parse_config_file(path.string()); });
  EXPECT_TRUE(contains(msg, path.string() + ":2:")) << msg;
  EXPECT_TRUE(contains(msg, "hiddn")) << msg;
  std::filesystem::remove_all(dir);
}

TEST(Config, ShippedFashionMnistConfigParsesAndValidates) {
  const auto path = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "configs" /
                    "fashion_mnist_mlp.pbtxt";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const RunConfig cfg = parse_config_file(path.string());
  EXPECT_EQ(cfg.name(), "fashion_mnist_mlp");
  EXPECT_NO_THROW(validate_config(cfg, path.string()));
  EXPECT_TRUE(cfg.model().has_mlp());
  EXPECT_TRUE(cfg.data().has_idx());
}

TEST(Config, ResolveDtype) {
  EXPECT_EQ(resolve_dtype(FP16, Device::kCPU), DType::kFloat16);
  EXPECT_EQ(resolve_dtype(BF16, Device::kCPU), DType::kBFloat16);
  EXPECT_EQ(resolve_dtype(FP32, Device::kCUDA), DType::kFloat32);
  EXPECT_EQ(resolve_dtype(AUTO, Device::kCPU), DType::kFloat32);
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    EXPECT_EQ(resolve_dtype(dtype_to_name(t), Device::kCPU), t);
}

}  // namespace
}  // namespace ampdist

namespace ampdist {
namespace {

// The ZeRO stage has one knob, optimizer.zero_stage; comm.mode: REDUCE_SCATTER is its deprecated alias for stage 1:
// alone it selects stage 1 with a warning, against an explicit zero_stage: 0 it is refused naming comm.mode.
TEST(Config, ZeroStageIsDecidedOnceAndTheDeprecatedAliasWarnsOrIsRefused) {
  const auto with = [](std::initializer_list<const char*> sets) {
    RunConfig c = parse_config_text(kValid, "z.pbtxt");
    for (const char* s : sets) apply_override(c, s);
    return c;
  };
  EXPECT_EQ(zero_stage(with({})), 0);
  EXPECT_EQ(zero_stage(with({"optimizer.zero_stage=1"})), 1);
  const RunConfig alias = with({"comm.mode=REDUCE_SCATTER"});
  EXPECT_NO_THROW(validate_config(alias, "z.pbtxt"));
  EXPECT_EQ(zero_stage(alias), 1);
  const std::vector<std::string> w = lint_config(alias, DType::kFloat32, 4, 3, 16);
  ASSERT_FALSE(w.empty());
  EXPECT_NE(w[0].find("comm.mode: REDUCE_SCATTER is deprecated"), std::string::npos) << w[0];
  EXPECT_TRUE(lint_config(with({"optimizer.zero_stage=1", "comm.mode=REDUCE_SCATTER"}), DType::kFloat32, 4, 3, 16)
                  .empty());
  const RunConfig both = with({"optimizer.zero_stage=0", "comm.mode=REDUCE_SCATTER"});
  const std::string msg = bad_input_message([&] { validate_config(both, "z.pbtxt"); });
  EXPECT_NE(msg.find("z.pbtxt: comm.mode REDUCE_SCATTER"), std::string::npos) << msg;
  EXPECT_NE(msg.find("contradicts optimizer.zero_stage: 0"), std::string::npos) << msg;
}

TEST(Config, ShippedConvConfigsParseAndValidate) {
  const auto dir = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "configs";
  for (const char* name : {"fashion_mnist_cnn.pbtxt", "resnet18.pbtxt"}) {
    const RunConfig cfg = parse_config_file((dir / name).string());
    EXPECT_NO_THROW(validate_config(cfg, name)) << name;
    EXPECT_TRUE(cfg.model().has_cnn() || cfg.model().has_resnet()) << name;
    // On the GPU a conv config is accepted exactly when this build has GPU convolutions (cuDNN), and refused
    // naming the model field otherwise (the CPU check has no device condition to test).
    if (kernels::gpu_convolutions()) {
      EXPECT_NO_THROW(validate_for_device(cfg, Device::kCUDA, name)) << name;
    } else {
      try {
        validate_for_device(cfg, Device::kCUDA, name);
        ADD_FAILURE() << name << ": accepted on the GPU by a build without GPU convolutions";
      } catch (const Error& e) {
        EXPECT_EQ(e.exit_code(), 2) << name;
        EXPECT_NE(std::string(e.what()).find(cfg.model().has_cnn() ? "model.cnn" : "model.resnet"),
                  std::string::npos)
            << e.what();
      }
    }
  }
  const RunConfig r = parse_config_file((dir / "resnet18.pbtxt").string());
  EXPECT_EQ(r.model().resnet().depth(), 18);
  EXPECT_EQ(r.model().resnet().stem(), SMALL);
}

TEST(Config, ConvModelsRefuseWhatTheyCannotRunNamingTheField) {
  const std::string base = R"(
    model { cnn { conv { channels: 4 } } }
    data { synthetic { image_shape: [1, 8, 8] } }
  )";
  struct Case {
    std::string field, text;
  };
  const std::vector<Case> cases = {
      {"data", "model { cnn { conv { channels: 4 } } } data { synthetic { features: 64 } }"},
      {"model.cnn.conv", "model { cnn { } } data { synthetic { image_shape: [1, 8, 8] } }"},
      {"model.cnn.conv[0].channels", "model { cnn { conv { } } } data { synthetic { image_shape: [1, 8, 8] } }"},
      {"model.resnet.depth", "model { resnet { depth: 50 } } data { synthetic { image_shape: [3, 32, 32] } }"},
      {"model.sync_batchnorm", "model { mlp { } sync_batchnorm: true } data { synthetic { } }"},
  };
  for (const Case& c : cases) {
    const RunConfig cfg = parse_config_text(c.text, "c.pbtxt");
    const std::string msg = bad_input_message([&] { validate_config(cfg, "c.pbtxt"); });
    EXPECT_TRUE(contains(msg, c.field)) << "expected '" << c.field << "' in: " << msg;
  }
  // A build whose GPU backend has no convolutions (no cuDNN) refuses the model on the GPU with one line naming it,
  // before anything runs; a build with them accepts it.
  const RunConfig cfg = parse_config_text(base, "c.pbtxt");
  EXPECT_NO_THROW(validate_config(cfg, "c.pbtxt"));
  if (kernels::gpu_convolutions()) {
    EXPECT_NO_THROW(validate_for_device(cfg, Device::kCUDA, "c.pbtxt"));
  } else {
    const std::string msg = bad_input_message([&] { validate_for_device(cfg, Device::kCUDA, "c.pbtxt"); });
    EXPECT_TRUE(contains(msg, "model.cnn: this build has no GPU convolutions")) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// ---- every string field is valid UTF-8 without NUL, at any depth ----

TEST(ConfigText, EveryStringFieldIsCheckedAndNamedByItsPath) {
  // (config text, the start of the error naming its field)
  const std::pair<std::string, std::string> cases[] = {
      {"name: \"mod\\350le\"", "run.pbtxt: name: not valid UTF-8 (byte 0xe8 at offset 3 of \"mod?le\")"},
      {"log { dir: \"runs/\\377\" }", "run.pbtxt: log.dir: not valid UTF-8"},
      {"precision { fp32_layers: \"fc1\" fp32_layers: \"f\\300\\257\" }", "run.pbtxt: precision.fp32_layers[1]: "},
      {"checkpoint { dir: \"a\\000b\" }", "run.pbtxt: checkpoint.dir: holds a NUL byte (byte 0x00 at offset 1"},
      {"fault { inject_nonfinite { step: 1 value: POS_INF target: ACTIVATION layer: \"\\355\\240\\200\" } }",
       "run.pbtxt: fault.inject_nonfinite[0].layer: not valid UTF-8"},  // an encoded surrogate is not UTF-8
  };
  const char* base =
      "model { mlp { hidden: 8 } } data { synthetic { train_samples: 64 test_samples: 8 features: 4 classes: 2 } "
      "global_batch_size: 8 } precision { dtype: FP16 }";
  for (const auto& [text, field] : cases) {
    RunConfig c = parse_config_text(base, "test.pbtxt");
    c.MergeFrom(parse_config_text(text, "case"));
    const std::string e = bad_input_message([&] { validate_config(c, "run.pbtxt"); });
    EXPECT_EQ(e.rfind(field, 0), 0u) << text << " gave: " << e;
  }
  RunConfig ok = parse_config_text(base, "test.pbtxt");
  ok.set_name("modèle-日本");  // valid multi-byte UTF-8 is fine
  EXPECT_NO_THROW(validate_config(ok, "run.pbtxt"));
}

TEST(ConfigText, ErrorsOfLibraryCodeAreNamedAfterTheConfigFile) {
  const Error e = ConfigInput("data.global_batch_size = 100 is not a multiple of world size 3");
  EXPECT_EQ(std::string(e.what()), "config: data.global_batch_size = 100 is not a multiple of world size 3");
  EXPECT_EQ(e.in_source("configs/x.pbtxt"), "configs/x.pbtxt: data.global_batch_size = 100 is not a multiple of world size 3");
  EXPECT_EQ(e.exit_code(), 2);
  const Error other = BadInput("data/x.idx", "truncated");
  EXPECT_EQ(other.in_source("configs/x.pbtxt"), "data/x.idx: truncated");
}

}  // namespace
}  // namespace ampdist

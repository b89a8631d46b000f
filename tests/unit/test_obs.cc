// Observability: TFRecord framing and CRC32C, the event file, the phase timer, the numerics monitor, the config
// lint and the report's reading of metrics.jsonl.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "tests/unit/solo_comm.h"
#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/kernels.h"
#include "runtime/obs/event_writer.h"
#include "runtime/obs/metrics_sink.h"
#include "runtime/obs/numerics.h"
#include "runtime/obs/phase_timer.h"
#include "runtime/obs/report.h"
#include "runtime/train/config.h"
#include "runtime/train/lint.h"
#include "tensorboard/tb_event.pb.h"

namespace ampdist {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() /
               ("ampdist_obs_" + tag + "_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using ObsSoloComm = testing::SoloComm;  // one rank alone: the report's collectives are identities

uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}
uint64_t le64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

std::string e_bytes_of(const tensorboard::Event& e) { return e.SerializeAsString(); }

// ---- CRC32C and TFRecord framing ---------------------------------------------------------------------------

TEST(Crc32c, KnownVectors) {
  // The CRC catalogue's check value of CRC-32C, and RFC 3720 appendix B.4's test vectors.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<char>(i);
  EXPECT_EQ(crc32c(inc), 0x46DD794Eu);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(Crc32c, Mask) {
  // ((crc >> 15) | (crc << 17)) + 0xa282ead8, worked by hand for two values.
  EXPECT_EQ(mask_crc(0), 0xA282EAD8u);
  // 0xE3069283: rotate right by 15 -> 0x2507C60D; + 0xA282EAD8 = 0xC78AB0E5.
  EXPECT_EQ(mask_crc(0xE3069283u), 0xC78AB0E5u);
}

TEST(TfRecord, Frame) {
  const std::string data = "123456789";
  const std::string f = tfrecord_frame(data);
  ASSERT_EQ(f.size(), 16 + data.size());
  EXPECT_EQ(le64(f, 0), data.size());
  EXPECT_EQ(le32(f, 8), mask_crc(crc32c(f.substr(0, 8))));
  EXPECT_EQ(f.substr(12, data.size()), data);
  EXPECT_EQ(le32(f, 12 + data.size()), 0xC78AB0E5u);
}

TEST(EventFileWriter, RecordsReadBack) {
  const fs::path dir = temp_dir("events");
  std::string path;
  {
    EventFileWriter w(dir.string());
    path = w.path();
    w.add_scalars(10, {{"train/loss", 2.5}, {"train/loss_scale", 65536.0}, {"train/skipped_steps", 0.0}});
    w.add_scalars(20, {{"train/loss", std::numeric_limits<double>::infinity()}});
    w.flush();
  }
  EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  std::vector<tensorboard::Event> events;
  for (size_t at = 0; at < bytes.size();) {
    ASSERT_LE(at + 12, bytes.size());
    const uint64_t len = le64(bytes, at);
    EXPECT_EQ(le32(bytes, at + 8), mask_crc(crc32c(bytes.substr(at, 8))));
    ASSERT_LE(at + 16 + len, bytes.size());
    const std::string data = bytes.substr(at + 12, len);
    EXPECT_EQ(le32(bytes, at + 12 + len), mask_crc(crc32c(data)));
    tensorboard::Event e;
    ASSERT_TRUE(e.ParseFromString(data));
    events.push_back(e);
    at += 16 + len;
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].step(), 10);
  ASSERT_EQ(events[1].summary().value_size(), 3);
  // A zero is still a scalar: TensorBoard tells scalars by the presence of simple_value on the wire.
  EXPECT_EQ(events[1].summary().value(2).value_case(), tensorboard::Summary::Value::kSimpleValue);
  EXPECT_NE(e_bytes_of(events[1]).find(std::string("\x15\0\0\0\0", 5)), std::string::npos);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[1].summary().value(1).simple_value(), 65536.0f);
  EXPECT_TRUE(std::isinf(events[2].summary().value(0).simple_value()));
  EXPECT_GT(events[1].wall_time(), 1.6e9);  // seconds since 1970, after 2020
  fs::remove_all(dir);
}

TEST(EventFileWriter, UnwritableDirectoryIsAnError) {
  EXPECT_THROW(EventFileWriter("/proc/ampdist_no_such_dir"), Error);
}

// ---- phase timer ------------------------------------------------------------------------------------------

TEST(PhaseTimer, AccumulatesAndResets) {
  SteadyClockPhaseTimer t;
  for (int k = 0; k < 2; ++k) {
    t.begin(Phase::kForward);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    t.end(Phase::kForward);
    t.end_step();
  }
  const PhaseTimes a = t.collect();
  EXPECT_EQ(a.steps, 2);
  // sleep_for waits at least its duration: a lower bound, not a speed target.
  EXPECT_GE(a[Phase::kForward], 0.010);
  EXPECT_EQ(a[Phase::kBackward], 0.0);
  EXPECT_DOUBLE_EQ(a.total(), a[Phase::kForward]);
  const PhaseTimes b = t.collect();
  EXPECT_EQ(b.steps, 0);
  EXPECT_EQ(b.total(), 0.0);
  EXPECT_EQ(phase_name(Phase::kCommWait), "comm_wait");
}

// A scope begins its phase when made and ends it when it goes, on the timer it was given; with no timer (timing
// off) it touches nothing.
class RecordingTimer final : public PhaseTimer {
 public:
  void begin(Phase p) override { calls.push_back("begin " + std::to_string(static_cast<int>(p))); }
  void end(Phase p) override { calls.push_back("end " + std::to_string(static_cast<int>(p))); }
  void end_step() override { calls.push_back("end_step"); }
  PhaseTimes collect() override { return {}; }
  std::vector<std::string> calls;
};

TEST(PhaseTimer, ScopeBeginsAndEndsItsPhaseAndANullScopeTouchesNothing) {
  RecordingTimer t;
  {
    PhaseScope s(&t, Phase::kBackward);
    EXPECT_EQ(t.calls, std::vector<std::string>{"begin " + std::to_string(static_cast<int>(Phase::kBackward))});
    PhaseScope off(nullptr, Phase::kForward);  // timing off
  }
  const std::string b = std::to_string(static_cast<int>(Phase::kBackward));
  EXPECT_EQ(t.calls, (std::vector<std::string>{"begin " + b, "end " + b}));
}

// ---- numerics monitor -------------------------------------------------------------------------------------

// A tensor's statistics as the trainer's numerics observer takes them: kernels::abs_stats at `threshold`.
ValueStats stats(const Tensor& t, double threshold = 0.0) {
  const kernels::AbsStats s = kernels::abs_stats(t, static_cast<float>(threshold));
  return {static_cast<double>(s.max_abs), s.nonfinite, s.below, t.numel()};
}

TEST(Numerics, MaximaUnderflowAndHeadroom) {
  ObsSoloComm comm;
  NumericsMonitor m({"fc1", "act1", "fc2"}, DType::kFloat16);
  m.begin_step();
  Tensor a = Tensor::zeros({2, 2}, DType::kFloat16);
  a.data_as<half>()[0] = half(-3.0f);
  a.data_as<half>()[3] = half(2.0f);
  m.on_activation(0, stats(a));
  Tensor b = Tensor::zeros({1, 2}, DType::kFloat16);
  b.data_as<half>()[1] = half(1024.0f);
  m.on_activation(1, stats(b));
  Tensor g = Tensor::zeros({5}, DType::kFloat32);
  float* gp = g.data_as<float>();
  gp[0] = 1e-8f;                          // below 2^-25 (2.98e-8): rounds to zero in fp16
  gp[1] = std::ldexp(1.0f, -25);          // exactly half the smallest subnormal: ties to even, zero
  gp[2] = 4e-8f;                          // above it: rounds to the subnormal 2^-24
  gp[3] = -0.5f;                          // max |g|
  gp[4] = 0.0f;                           // zero is not an underflow
  m.on_gradient("fc2.weight", stats(g, NumericsMonitor::underflow_threshold(DType::kFloat16)));
  const NumericsReport r = m.reduce(comm, 7);
  ASSERT_EQ(r.layers.size(), 3u);
  EXPECT_EQ(r.step, 7);
  EXPECT_EQ(r.dtype, "fp16");
  EXPECT_EQ(r.layers[0].act_max, 3.0);
  EXPECT_EQ(r.layers[0].grad_max, -1.0);  // fc1.* saw no gradient here
  EXPECT_EQ(r.layers[1].act_max, 1024.0);
  EXPECT_EQ(r.layers[2].grad_max, 0.5);
  EXPECT_EQ(r.layers[2].grad_elements, 5);
  EXPECT_EQ(r.layers[2].grad_underflow, 2);
  EXPECT_DOUBLE_EQ(r.layers[2].underflow_fraction(), 0.4);
  EXPECT_DOUBLE_EQ(r.headroom_bits(r.layers[1]), std::log2(65504.0 / 1024.0));
  EXPECT_TRUE(r.first_nonfinite_layer.empty());
  EXPECT_EQ(NumericsMonitor::underflow_threshold(DType::kFloat32), 0.0);
}

TEST(Numerics, FirstNonFiniteIsForwardBeforeBackward) {
  ObsSoloComm comm;
  NumericsMonitor m({"fc1", "act1", "fc2"}, DType::kBFloat16);
  m.begin_step();
  Tensor ok = Tensor::zeros({1, 2}, DType::kBFloat16);
  Tensor bad = Tensor::zeros({1, 2}, DType::kBFloat16);
  bad.data_as<bfloat16>()[1] = bfloat16(std::numeric_limits<float>::quiet_NaN());
  m.on_activation(0, stats(ok));
  m.on_activation(1, stats(bad));  // the first non-finite value: act1's forward output
  m.on_activation(2, stats(bad));
  Tensor g = Tensor::zeros({2}, DType::kFloat32);
  g.data_as<float>()[0] = std::numeric_limits<float>::infinity();
  m.on_gradient("fc2.weight", stats(g));
  NumericsReport r = m.reduce(comm, 3);
  EXPECT_EQ(r.first_nonfinite_layer, "act1");
  EXPECT_EQ(r.first_nonfinite_pass, "forward");
  EXPECT_TRUE(std::isinf(r.layers[1].act_max));
  EXPECT_TRUE(std::isinf(r.layers[2].grad_max));
  EXPECT_EQ(r.headroom_bits(r.layers[1]), -std::numeric_limits<double>::infinity());

  m.begin_step();  // a new step forgets the old one
  m.on_activation(0, stats(ok));
  m.on_gradient("fc2.bias", stats(g));
  r = m.reduce(comm, 4);
  EXPECT_EQ(r.first_nonfinite_layer, "fc2");
  EXPECT_EQ(r.first_nonfinite_pass, "backward");
  EXPECT_EQ(r.layers[1].act_max, 0.0);
}

// ---- config lint ------------------------------------------------------------------------------------------

RunConfig lint_cfg(const std::string& text) { return parse_config_text(text, "lint.pbtxt"); }

TEST(Lint, Fp16GemmDimensions) {
  const RunConfig c = lint_cfg("model { mlp { hidden: [512, 100] } } precision { dtype: FP16 }");
  const auto w = lint_config(c, DType::kFloat16, 784, 10, 64);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("fc2 out_features 100"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("fc3 in_features 100"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("fc3 out_features 10"), std::string::npos) << w[0];
  EXPECT_EQ(w[0].find("fc1"), std::string::npos) << w[0];  // 784 and 512 are multiples of 8
  EXPECT_EQ(w[0].find("micro-batch"), std::string::npos) << w[0];
  // A layer forced to FP32 is not a fp16 GEMM.
  const RunConfig f = lint_cfg(
      "model { mlp { hidden: [512, 256] } } precision { dtype: FP16 fp32_layers: \"fc3\" }");
  EXPECT_TRUE(lint_config(f, DType::kFloat16, 784, 10, 64).empty());
  EXPECT_NE(lint_config(f, DType::kFloat16, 784, 10, 12)[0].find("micro-batch 12"), std::string::npos);
  // The same model in bf16 or fp32: no GEMM warning.
  EXPECT_TRUE(lint_config(c, DType::kBFloat16, 784, 10, 64).empty());
}

// What the sinks say of measures that were not taken: a run stopped before its evaluation has no test accuracy
// (not "0.0000 (0/0)"), a language model never has one, and a GPT's fraction of a window per second is not "0".
TEST(Sinks, NoAccuracyWhereNoneWasMeasured) {
  std::ostringstream console;
  ConsoleSink c(console, false);
  RunSummary stopped;
  stopped.test_samples = 0;
  c.summary(stopped);
  EXPECT_NE(console.str().find("test accuracy: not evaluated\n"), std::string::npos) << console.str();
  EXPECT_EQ(console.str().find("0/0"), std::string::npos) << console.str();
  TrainRecord t;
  t.step = 1;
  t.total_steps = 2;
  t.samples_per_s = 0.25;
  c.train(t);
  EXPECT_NE(console.str().find(" 0.25 samples/s"), std::string::npos) << console.str();

  const std::string path = ::testing::TempDir() + "/sinks_metrics.jsonl";
  {
    JsonlSink j(path);
    EvalRecord e;
    e.step = 3;
    e.loss = 2.5;
    e.samples = 16;
    e.language_model = true;
    j.eval(e);
    RunSummary gpt;
    gpt.language_model = true;
    gpt.test_samples = 16;
    gpt.test_loss = 2.5;
    j.summary(gpt);
    j.summary(stopped);
  }
  std::ifstream in(path);
  std::string eval_line, gpt_line, stopped_line;
  std::getline(in, eval_line);
  std::getline(in, gpt_line);
  std::getline(in, stopped_line);
  EXPECT_EQ(eval_line.find("test_accuracy"), std::string::npos) << eval_line;
  EXPECT_NE(eval_line.find("\"test_loss\":2.5"), std::string::npos) << eval_line;
  EXPECT_EQ(gpt_line.find("test_accuracy"), std::string::npos) << gpt_line;
  EXPECT_EQ(stopped_line.find("test_accuracy"), std::string::npos) << stopped_line;
  EXPECT_NE(stopped_line.find("\"test_loss\":null"), std::string::npos) << stopped_line;
}

TEST(Lint, GptGemmRowsAreTheMicroBatchTokens) {
  // A GPT's matrix products have micro-batch x seq_len rows and no fc chain: micro-batch 1 of 64 tokens is fine,
  // 1 of 63 is named as tokens per micro-batch.
  const RunConfig g = lint_cfg("model { gpt { seq_len: 64 } } precision { dtype: FP16 }");
  EXPECT_TRUE(lint_config(g, DType::kFloat16, 64, 256, 1).empty());
  const RunConfig odd = lint_cfg("model { gpt { seq_len: 63 } } precision { dtype: FP16 }");
  const auto w = lint_config(odd, DType::kFloat16, 64, 256, 1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("(tokens per micro-batch 63)"), std::string::npos) << w[0];
}

TEST(Lint, LossScaling) {
  const RunConfig none = lint_cfg("model { mlp { hidden: [512] } } precision { dtype: FP16 none {} }");
  const auto w = lint_config(none, DType::kFloat16, 784, 16, 64);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("fp16 without loss scaling (precision.none)"), std::string::npos) << w[0];
  const RunConfig dyn = lint_cfg("model { mlp { hidden: [512] } } precision { dtype: BF16 dynamic {} }");
  const auto b = lint_config(dyn, DType::kBFloat16, 784, 16, 64);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(b[0].find("precision.dynamic with bf16"), std::string::npos) << b[0];
  const RunConfig fp16 = lint_cfg("model { mlp { hidden: [512] } } precision { dtype: FP16 }");
  EXPECT_TRUE(lint_config(fp16, DType::kFloat16, 784, 16, 64).empty());
}

// ---- report -----------------------------------------------------------------------------------------------

TEST(Report, ReadsTheLastRunAndRendersItsValues) {
  const fs::path dir = temp_dir("report") / "run_fp16";
  fs::create_directories(dir);
  {
    std::ofstream m(dir / "metrics.jsonl");
    m << R"({"type":"start","name":"old","dtype":"fp32","world_size":1})" << "\n"
      << R"({"type":"train","step":1,"loss":9.0,"scale":1,"skipped_steps":0})" << "\n"
      << R"({"type":"start","name":"x","dtype":"fp16","world_size":2,"global_batch_size":128})" << "\n"
      << R"({"type":"train","step":10,"loss":2.0,"lr":0.1,"scale":65536,"skipped_steps":0,"grad_norm":1.5,"samples_per_s":1000})"
      << "\n"
      << R"({"type":"train","step":20,"loss":1.0,"lr":0.1,"scale":32768,"skipped_steps":2,"grad_norm":null,"samples_per_s":1100})"
      << "\n"
      << R"({"type":"eval","step":20,"test_accuracy":0.8125,"test_loss":0.5})" << "\n"
      << R"({"type":"numerics","step":20,"dtype":"fp16","layers":[{"name":"fc1","act_max":null,"act_nonfinite":true,"grad_max":null,"grad_nonfinite":true,"grad_underflow_fraction":0,"headroom_bits":null}],"first_nonfinite":{"layer":"fc1","pass":"forward"}})"
      << "\n"
      << R"({"type":"summary","steps":20,"skipped_steps":2,"test_accuracy":0.8125,"samples_per_s":1234.56,"final_scale":32768,"peak_rss_mb":100.0,"phase_ms":{"forward":1.0,"backward":2.0}})"
      << "\n";
  }
  const RunData r = load_run(dir.string());
  EXPECT_EQ(r.label, "run_fp16");
  EXPECT_EQ(r.dtype, "fp16");
  EXPECT_EQ(r.world_size, 2);
  ASSERT_EQ(r.loss.size(), 2u);  // the earlier run's record is not counted
  EXPECT_EQ(r.loss[0].second, 2.0);
  ASSERT_EQ(r.skips.size(), 1u);
  EXPECT_EQ(r.skips[0], (std::pair<int64_t, int64_t>{20, 2}));
  EXPECT_TRUE(std::isnan(r.grad_norm[1].second));
  ASSERT_EQ(r.numerics.size(), 1u);
  EXPECT_EQ(r.numerics[0].first_layer, "fc1");
  EXPECT_TRUE(r.has_summary);
  const std::string html = render_report({r});
  EXPECT_NE(html.find("<td class=\"acc\">0.8125</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"sps\">1234.6</td>"), std::string::npos);
  EXPECT_NE(html.find("layer <b>fc1</b> (forward pass)"), std::string::npos);
  EXPECT_NE(html.find("class=\"skip\""), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // no link but the SVG namespace
  fs::remove_all(dir.parent_path());
}

TEST(Report, MissingOrBadFileIsBadInput) {
  const fs::path dir = temp_dir("report_bad");
  try {
    load_run(dir.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl"), std::string::npos);
  }
  std::ofstream(dir / "metrics.jsonl") << "{\"type\":\"start\"}\nnot json\n";
  try {
    load_run(dir.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ampdist

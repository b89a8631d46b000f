// libFuzzer target: the run config reader (runtime/train/config.h).
//
// The input is used twice:
//   1. whole, as a .pbtxt file: parse_config_file (which parses the text format), then validate_config;
//   2. its first line as one "--set field.path=value" assignment (apply_override) on a valid config, then
//      validate_config; the rest of the input, when it parses as a config, is the config it applies to.
// ampdist::Error is the expected outcome of bad input; any other exception, a crash, a sanitizer report, a hang or
// a huge allocation is a finding.
//
// Opt-in oracle, AMPDIST_FUZZ_OVERRIDE_ORACLE=1: an accepted assignment must change only the field it names (and
// create the sections on its path; a member of a oneof replaces the others), as apply_override promises. Off by
// default: today a quoted string value is spliced into the text format as it is, so
//   log.dir="x" } train { steps: 7 } log { dir: "y"
// also sets train.steps, and a newline or <...> gets past the one-value check of other fields.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "runtime/core/error.h"
#include "runtime/train/config.h"

namespace {

const ampdist::RunConfig& base_config() {
  static const ampdist::RunConfig cfg = [] {
    const std::string path = std::string(AMPDIST_SOURCE_DIR) + "/configs/fashion_mnist_mlp.pbtxt";
    ampdist::RunConfig c = ampdist::parse_config_file(path);
    ampdist::validate_config(c, path);  // the base must be valid, or part 2 tests nothing
    return c;
  }();
  return cfg;
}

// `cfg` with the field at `path` cleared, the oneofs on the path cleared, and the sections on the path present.
ampdist::RunConfig without_path(ampdist::RunConfig cfg, const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ps(path);
  for (std::string p; std::getline(ps, p, '.');) parts.push_back(p);
  google::protobuf::Message* msg = &cfg;
  for (size_t i = 0; i < parts.size(); ++i) {
    const google::protobuf::FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(parts[i]);
    if (!f) break;
    if (const google::protobuf::OneofDescriptor* o = f->containing_oneof()) msg->GetReflection()->ClearOneof(msg, o);
    if (i + 1 == parts.size() || f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE ||
        f->is_repeated()) {
      msg->GetReflection()->ClearField(msg, f);
      break;
    }
    msg = msg->GetReflection()->MutableMessage(msg, f);
  }
  return cfg;
}

bool override_oracle() {
  static const bool on = [] {
    const char* v = std::getenv("AMPDIST_FUZZ_OVERRIDE_ORACLE");
    return v && std::string(v) == "1";
  }();
  return on;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ampdist_fuzz::quiet_protobuf();
  base_config();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  static const std::string file = ampdist_fuzz::scratch_dir("config") + "/fuzz.pbtxt";

  // 1. The whole input as a config file.
  ampdist_fuzz::write_file(file, text);
  try {
    ampdist::RunConfig cfg = ampdist::parse_config_file(file);
    ampdist::validate_config(cfg, file);
    (void)ampdist::resolve_dtype(cfg.precision().dtype(), ampdist::Device::kCPU);
  } catch (const ampdist::Error&) {
  }

  // 2. The first line as a --set assignment, on the rest when that is a config, else on the valid base config.
  const size_t nl = text.find('\n');
  const std::string assignment = text.substr(0, nl);
  ampdist::RunConfig cfg = base_config();
  if (nl != std::string::npos) {
    try {
      cfg = ampdist::parse_config_text(text.substr(nl + 1), "rest");
    } catch (const ampdist::Error&) {
      cfg = base_config();
    }
  }
  const ampdist::RunConfig before = cfg;
  try {
    ampdist::apply_override(cfg, assignment);
    if (override_oracle()) {
      const std::string path = assignment.substr(0, assignment.find('='));
      if (!google::protobuf::util::MessageDifferencer::Equals(without_path(before, path), without_path(cfg, path))) {
        std::fprintf(stderr, "fuzz_config: --set %s changed more than %s\n", assignment.c_str(), path.c_str());
        std::abort();
      }
    }
    ampdist::validate_config(cfg, "override");
  } catch (const ampdist::Error&) {
  }
  return 0;
}

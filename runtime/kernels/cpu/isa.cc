#include "runtime/kernels/cpu/isa.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>

#include "runtime/core/error.h"

namespace ampdist::kernels::cpu::isa {
namespace {

constexpr const char* kVariable = "AMPDIST_MAX_CPU_ISA";

struct Named {
  CpuClass c;
  const char* name;
  dnnl::cpu_isa onednn;
};
constexpr Named kClasses[] = {
    {CpuClass::kAvx2, "avx2", dnnl::cpu_isa::avx2},
    {CpuClass::kAvx512Core, "avx512_core", dnnl::cpu_isa::avx512_core},
    {CpuClass::kAvx512CoreBf16, "avx512_core_bf16", dnnl::cpu_isa::avx512_core_bf16},
    {CpuClass::kAvx512CoreAmx, "avx512_core_amx", dnnl::cpu_isa::avx512_core_amx},
    {CpuClass::kAll, "all", dnnl::cpu_isa::all},
};

CpuClass parse_cap() {
  const char* v = std::getenv(kVariable);
  if (v == nullptr || *v == '\0') return CpuClass::kAll;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  for (const Named& n : kClasses)
    if (s == n.name) return n.c;
  throw Error(std::string(kVariable) + "=" + v +
                  ": not a CPU class; use avx2, avx512_core, avx512_core_bf16, avx512_core_amx or all",
              ErrorKind::kBadInput);
}

bool cpu_has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return yes;
}

std::atomic<bool> g_avx512{true};

}  // namespace

const char* class_name(CpuClass c) {
  for (const Named& n : kClasses)
    if (n.c == c) return n.name;
  return "?";
}

CpuClass max_class() {
  static const CpuClass cap = parse_cap();
  return cap;
}

void apply_cap_to_onednn() {
  static std::once_flag once;
  std::call_once(once, [] {
    const CpuClass cap = max_class();
    if (cap == CpuClass::kAll) return;  // oneDNN's own ONEDNN_MAX_CPU_ISA, if set, still applies
    for (const Named& n : kClasses)
      if (n.c == cap && dnnl::set_max_cpu_isa(n.onednn) != dnnl::status::success)
        throw Error(std::string(kVariable) + ": oneDNN refused the cap " + n.name +
                    " (it was already initialised by another caller)");
  });
}

std::string onednn_isa() {
  apply_cap_to_onednn();
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

bool avx512() {
  return g_avx512.load(std::memory_order_relaxed) && cpu_has_avx512() && max_class() >= CpuClass::kAvx512Core;
}
void set_avx512_enabled(bool enabled) { g_avx512.store(enabled, std::memory_order_relaxed); }

}  // namespace ampdist::kernels::cpu::isa

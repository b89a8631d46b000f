// Run-time instruction-set dispatch for the CPU backend, and the one switch that caps it.
//
// The default build is compiled for x86-64-v3 (AVX2, FMA, F16C) and must run on any such CPU, so code that uses
// AVX-512 lives in functions compiled with __attribute__((target(...))) inside a namespace named `avx512`
// (launch/check_isa.sh allows exactly those) and is called only after avx512() said yes. Every such path computes
// bitwise what its AVX2 / portable twin computes (same lanes, same operations, same order), so results never depend
// on the machine that ran them. oneDNN's kernels dispatch by themselves (AMX, AVX512-BF16, AVX-512, AVX2).
//
// The cap: AMPDIST_MAX_CPU_ISA=<class> makes a bigger CPU behave as the named class for the whole CPU backend:
// oneDNN's own dispatch (dnnl::set_max_cpu_isa, what its ONEDNN_MAX_CPU_ISA does) and ours. The suite runs under
// AMPDIST_MAX_CPU_ISA=avx2 on every machine, so the AVX2-only class (AMD Zen 1-3, Intel Haswell to Comet Lake) is
// tested wherever the tests run.
#pragma once

#include <string>

namespace ampdist::kernels::cpu::isa {

// The CPU classes, in increasing order; the names are oneDNN's cpu_isa names (and the values AMPDIST_MAX_CPU_ISA
// takes, case-insensitive).
enum class CpuClass {
  kAvx2,            // "avx2": AVX2, FMA, F16C (x86-64-v3); oneDNN has no bf16 kernel
  kAvx512Core,      // "avx512_core": AVX512F/BW/VL/DQ (Skylake-SP); oneDNN's bf16 there is emulated
  kAvx512CoreBf16,  // "avx512_core_bf16": + AVX512-BF16 (Cooper Lake, AMD Zen 4)
  kAvx512CoreAmx,   // "avx512_core_amx": + AMX-BF16 tiles (Sapphire Rapids)
  kAll,             // "all": no cap (the default)
};
const char* class_name(CpuClass c);

// The cap from AMPDIST_MAX_CPU_ISA, read once per process (unset or empty: kAll). Throws Error (bad input, exit 2)
// naming the variable for any other value.
CpuClass max_class();

// Applies the cap to oneDNN once per process, before its first primitive or GEMM (after that oneDNN ignores a cap):
// every entry into oneDNN (kernels/cpu/onednn.cc, cnn_kernels.cc) calls it first. Throws like max_class().
void apply_cap_to_onednn();

// oneDNN's effective instruction set after the cap ("avx2", "avx512_core_bf16", ...): what its kernels may use.
std::string onednn_isa();

// AVX512F, AVX512BW, AVX512VL and AVX512DQ (Skylake-SP and later), as CPUID and the OS's saved state report them,
// and not capped below avx512_core by AMPDIST_MAX_CPU_ISA.
bool avx512();
// Turns the AVX-512 paths off (or back on, where the CPU has them and the cap allows) for this process: the tests
// compare both paths.
void set_avx512_enabled(bool enabled);

}  // namespace ampdist::kernels::cpu::isa

// Run-time instruction-set dispatch for the CPU backend's own loops. The default build is compiled for x86-64-v3
// (AVX2, FMA, F16C) and must run on any such CPU, so code that uses AVX-512 lives in functions compiled with
// __attribute__((target(...))) inside a namespace named `avx512` (launch/check_isa.sh allows exactly those) and is
// called only after avx512() said yes. Every such path computes bitwise what its AVX2 / portable twin computes
// (same lanes, same operations, same order), so results never depend on the machine that ran them.
// (oneDNN's GEMMs dispatch by themselves: AMX, AVX512-BF16, AVX-512, AVX2.)
#pragma once

namespace ampdist::kernels::cpu::isa {

// AVX512F, AVX512BW, AVX512VL and AVX512DQ (Skylake-SP and later), as CPUID and the OS's saved state report them;
// false when the environment sets AMPDIST_NO_AVX512 (to run the AVX2 paths on such a machine, e.g. in tests).
bool avx512();
// Turns the AVX-512 paths off (or back on, where the CPU has them) for this process: the tests compare both paths.
void set_avx512_enabled(bool enabled);

}  // namespace ampdist::kernels::cpu::isa

#!/usr/bin/env bash
# Checks that ELF files (executables, shared libraries, static libraries, objects) contain no instruction beyond
# AVX2 outside code that is chosen at run time, so that they run on any x86-64 CPU with AVX2 (the default build's
# target, x86-64-v3) instead of dying with SIGILL on a CPU without AVX-512 or AMX.
#
#   bash launch/check_isa.sh [--deps] [--allow FILE] [--verbose] ELF...
#   bash launch/check_isa.sh --deps build/ampdist build/examples/custom_model   # the default build (CTest isa_check)
#   bash launch/check_isa.sh --deps build/gpu-bundle/bin/* build/gpu-bundle/lib/*.so*   # a carried bundle
#
# What counts as beyond AVX2 (objdump -d of every executable section):
#   - every EVEX-encoded instruction (first opcode byte 0x62, which in 64-bit mode is always EVEX): AVX-512 of any
#     width, AVX512-FP16, AVX512-BF16, AVX512-VNNI, ...;
#   - the AVX-512 mask instructions (k*, VEX-encoded) and AMX (ldtilecfg, tileloadd, tdp*, ...);
#   - VEX-encoded extensions newer than AVX2: AVX-VNNI ({vex} vpdpbusd ...), AVX-IFMA, AVX-NE-CONVERT, GFNI, and
#     VAES / VPCLMULQDQ on ymm registers.
# Allowed (launch/isa_allowlist.txt, or --allow FILE, one rule a line with its reason):
#   - `fn REGEX reason`: functions (demangled names) that are run-time dispatched: ampdist's own AVX-512 paths
#     (namespace ...::avx512::, called only after a CPUID check) and GCC target_clones copies ([clone .avx512f.0]);
#   - `lib GLOB reason`: libraries that choose their kernels at run time themselves (oneDNN's CPU ISA dispatch,
#     glibc's ifuncs, ...); they are listed as allowed and not disassembled.
# --deps also checks every shared library the given files load (ldd), so a bundle's whole closure is covered.
# Prints one line per file: "ok FILE" (with the allowed functions it holds), "allowed FILE: reason", or
# "not ok FILE" followed by each offending function with its count and first instruction. Exit 0 when every file
# is ok or allowed, 1 otherwise, 2 on bad usage.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
allow_file=$here/isa_allowlist.txt
deps=0
verbose=0
files=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --deps) deps=1 ;;
    --verbose) verbose=1 ;;
    --allow) allow_file=$2; shift ;;
    -h|--help) sed -n '2,26p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "check_isa: unknown option $1" >&2; exit 2 ;;
    *) files+=("$1") ;;
  esac
  shift
done
[[ ${#files[@]} -gt 0 ]] || { echo "usage: check_isa.sh [--deps] [--allow FILE] ELF..." >&2; exit 2; }
[[ -r $allow_file ]] || { echo "check_isa: $allow_file: cannot read the allowlist" >&2; exit 2; }
command -v objdump >/dev/null || { echo "check_isa: objdump not found (binutils)" >&2; exit 2; }

fn_rules=$(awk '$1 == "fn" { print $2 }' "$allow_file" | paste -sd'|' -)
lib_reason() {  # prints the reason when the file's name matches a `lib` rule
  local base
  base=$(basename "$1")
  while read -r kind pattern reason; do
    [[ $kind == lib ]] || continue
    # shellcheck disable=SC2053
    if [[ $base == $pattern ]]; then echo "$reason"; return 0; fi
  done <"$allow_file"
  return 1
}

for f in "${files[@]}"; do
  [[ -e $f ]] || { echo "check_isa: $f: no such file" >&2; exit 2; }
done
if [[ $deps == 1 ]]; then
  mapfile -t extra < <(for f in "${files[@]}"; do
    if file -L "$f" 2>/dev/null | grep -q 'ELF .*dynamic'; then ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'; fi
  done | sort -u)
  files+=("${extra[@]}")
fi

status=0
declare -A seen=()
for f in "${files[@]}"; do
  real=$(readlink -f "$f")
  [[ -n ${seen[$real]:-} ]] && continue
  seen[$real]=1
  if reason=$(lib_reason "$real") || reason=$(lib_reason "$f"); then
    echo "allowed $f: $reason"
    continue
  fi
  if ! file -L "$f" | grep -q 'ELF\|ar archive'; then
    [[ $verbose == 1 ]] && echo "skipped $f: not an ELF file or archive"
    continue
  fi
  report=$(objdump -d -w -C --no-addresses "$f" 2>/dev/null | awk -v allow="$fn_rules" '
    function flush() {
      if (fn != "" && n > 0) {
        if (allow != "" && fn ~ allow) { allowed[fn] = n } else { bad = bad sprintf("  %s: %d instruction(s), first: %s\n", fn, n, first) }
      }
      n = 0; first = ""
    }
    /^<.*>:$/ { flush(); fn = substr($0, 2, length($0) - 3); next }
    /^[0-9a-f]+ <.*>:$/ { flush(); fn = $0; sub(/^[0-9a-f]+ </, "", fn); sub(/>:$/, "", fn); next }
    /^\t/ {
      # --no-addresses lines: "\t<bytes>\t<mnemonic operands>"
      split($0, part, "\t"); bytes = part[2]; ins = part[3]
      nb = split(bytes, b, " "); i = 1
      while (i <= nb && b[i] ~ /^(67|2e|36|3e|26|64|65)$/) i++
      hit = 0
      if (i <= nb && b[i] == "62" && ins ~ /^(\{evex\} )?[vk]/) hit = 1
      else if (ins ~ /^k(mov|and|or|xor|xnor|shift|ortest|test|add|unpck|not)[bwdq]/) hit = 1
      else if (ins ~ /^(ldtilecfg|sttilecfg|tilerelease|tilezero|tileload|tilestore|tdp|tcmmr|tcmmi)/) hit = 1
      else if (ins ~ /^\{vex\} /) hit = 1
      else if (ins ~ /^v(cvtneps2bf16|bcstne|cvtnee|cvtneo|gf2p8)/) hit = 1
      else if (ins ~ /^v(aes|pclmul)/ && ins ~ /%ymm/) hit = 1
      if (hit) { n++; if (first == "") first = ins }
    }
    END {
      flush()
      na = 0; names = ""
      for (k in allowed) { na++; if (na <= 6) names = names (names == "" ? "" : "; ") k " (" allowed[k] ")" }
      printf "ALLOWED %d %s\n", na, names
      printf "%s", bad
    }')
  head_line=$(printf '%s\n' "$report" | head -1)
  bad=$(printf '%s\n' "$report" | tail -n +2)
  nallowed=$(awk '{ print $2 }' <<<"$head_line")
  if [[ -n $bad ]]; then
    echo "not ok $f"
    printf '%s\n' "$bad"
    status=1
  elif [[ $nallowed -gt 0 ]]; then
    echo "ok $f: beyond AVX2 only in $nallowed run-time-dispatched function(s): $(cut -d' ' -f3- <<<"$head_line")"
  else
    echo "ok $f"
  fi
done
exit $status

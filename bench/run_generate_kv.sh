#!/usr/bin/env bash
# `ampdist generate`'s time per token with the KV cache (GptModel::prefill once, then one position per token) and
# without it (the whole window for every token), for N = 32 .. 448 tokens after a 16-token prompt, greedy, on a
# randomly initialised GPT (4 layers, 4 heads, 256 channels, context 512, vocabulary 1000 padded to 1024), FP32,
# one thread. With the cache the time per token should stay flat in N (each token attends to <= 512 cached keys,
# a small part of its cost); without it, it grows with the window (one full forward of up to 464 positions per
# token). Also checks that both give the same ids. Prints a table; numbers are this machine's at its load, never
# assertions.
#   bash bench/run_generate_kv.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(readlink -f "${1:-build}")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 - "$out/tok.bin" <<'PY'
import struct, sys
n = 4096
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, 1000, *([0] * 252)))
    f.write(struct.pack(f"<{n}H", *[(7 * i * i + 3) % 1000 for i in range(n)]))
PY
cat > "$out/gen.pbtxt" <<PB
name: "gen_bench"
model { gpt { n_layer: 4 n_head: 4 n_embd: 256 seq_len: 512 vocab_size: 1000 padded_vocab_multiple: 64 } }
data { tokens { train: "$out/tok.bin" val: "$out/tok.bin" } global_batch_size: 2 eval_batch_size: 2 }
train { steps: 0 epochs: 0 }
PB
"$build/ampdist" train --config "$out/gen.pbtxt" --run-dir "$out/run" > "$out/train.txt" 2>&1 || { cat "$out/train.txt"; exit 1; }
cpu=$(lscpu | sed -n 's/^Model name: *//p')
echo "CPU: $cpu ($(nproc) cores; $(grep -m1 -o -w -E "avx512_bf16|amx_bf16|avx512_fp16|avx2" /proc/cpuinfo | sort -u | tr "\n" " ")), load $(cut -d' ' -f1 /proc/loadavg)"
prompt=$(seq -s, 1 16)
printf '%-8s %16s %16s %8s\n' tokens 'cache ms/token' 'no cache ms/tok' 'same ids'
for n in 32 64 128 256 448; do
  row=()
  for c in on off; do
    "$build/ampdist" generate --checkpoint "$out/run/checkpoints" --prompt-ids "$prompt" --tokens "$n" \
      --temperature 0 --kv-cache "$c" --timing > "$out/$c.txt" 2> "$out/$c.err"
    row+=("$(sed -n 's/.*: \([0-9.]*\) ms per token.*/\1/p' "$out/$c.err")")
  done
  same=no
  cmp -s "$out/on.txt" "$out/off.txt" && same=yes
  printf '%-8s %16s %16s %8s\n' "$n" "${row[0]}" "${row[1]}" "$same"
done

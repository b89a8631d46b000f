#!/usr/bin/env bash
# Every dtype trains on the AVX2-only CPU class (AMD Zen 1-3, Intel Haswell to Comet Lake), whatever CPU runs the
# suite:
#  1. AMPDIST_MAX_CPU_ISA=avx2 caps the CPU backend (oneDNN's ISA and our own AVX-512 loops): `ampdist env` says so
#     and names the widening path for bf16 and fp16; a bad value is one line and exit 2;
#  2. under the cap, the MLP, the GPT and the CNN each train 2-rank runs in fp32, fp16 and bf16 (exit 0, loss falls),
#     and the MLP's bf16 run with ZeRO-1 ends with the unsharded run's master weights;
#  3. under an emulated AVX2-only CPU (qemu-x86_64 -cpu Haswell, which executes AVX2 and rejects AVX-512: checked
#     here with one AVX-512 instruction), single-process runs of the MLP in fp16 and of the MLP, the CNN and the GPT
#     in bf16 exit 0 with the master weights hash of the same run under the cap on this CPU. An instruction beyond AVX2 on any path they take fails
#     here, not on a user's machine. (One process: the emulator runs ampdist as a world of one, not under mpirun.)
# Usage: test_cpu_classes.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" cpu_classes "$@"
export AMPDIST_MAX_CPU_ISA=avx2

# ---- 1. the cap, as `ampdist env` reports it ------------------------------------------------------------------------
if "$AMPDIST" env > "$TMP/env.txt" 2>&1 &&
   grep -q "^  oneDNN: .*ISA avx2 (AMPDIST_MAX_CPU_ISA: avx2), our AVX-512 loops off" "$TMP/env.txt" &&
   grep -q "^  bf16 GEMMs: *dnnl_sgemm (jit) after an exact conversion of bf16 to f32; convolutions in fp32" "$TMP/env.txt" &&
   grep -q "^  fp16 GEMMs: *dnnl_sgemm (jit) after an exact conversion of fp16 to f32; convolutions in fp32" "$TMP/env.txt"; then
  ok "env under AMPDIST_MAX_CPU_ISA=avx2: oneDNN capped to avx2, bf16 and fp16 widened to f32"
else
  not_ok "env under the cap" "see below"; show "$TMP/env.txt"
fi
AMPDIST_MAX_CPU_ISA=avx3 "$AMPDIST" env > "$TMP/bad.txt" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && [ "$(grep -c . "$TMP/bad.txt")" -eq 1 ] && grep -q "AMPDIST_MAX_CPU_ISA=avx3: not a CPU class" "$TMP/bad.txt"; then
  ok "a bad AMPDIST_MAX_CPU_ISA is one line and exit 2"
else
  not_ok "bad AMPDIST_MAX_CPU_ISA" "exit $rc"; show "$TMP/bad.txt"
fi

# ---- 2. every model family in every dtype, 2 ranks, under the cap ----------------------------------------------------
run() {  # run NP OUT ARGS...
  local np=$1 out=$2
  shift 2
  timeout 300 mpirun -q --oversubscribe -np "$np" "$AMPDIST" train "$@" > "$out" 2>&1
}
# The first and last logged training loss of a run fall by at least FACTOR (metrics.jsonl).
loss_falls() {  # loss_falls METRICS FACTOR
  python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
loss = [r["loss"] for r in rows if r["type"] == "train"]
assert len(loss) >= 2 and loss[-1] < float(sys.argv[2]) * loss[0], loss
PY
}

FM="$TMP/fm"  # a slice of Fashion-MNIST (the first 512 training and 256 test images) as an IDX directory
fashion_mnist_slice "$FM" || { echo "not ok - setup: cannot write the IDX slice"; exit 1; }
mkdir -p "$TMP/text" && cp /usr/share/games/fortunes/computers /usr/share/games/fortunes/science "$TMP/text/"

mlp=(--config "$SRC/configs/fashion_mnist_mlp.pbtxt" --set data.idx.dir="$FM" --set data.global_batch_size=32
     --set train.steps=32 --set log.every_steps=8 --set optimizer.schedule.warmup_steps=4)
cnn=(--config "$SRC/configs/fashion_mnist_cnn.pbtxt" --set data.idx.dir="$FM" --set data.global_batch_size=32
     --set train.steps=16 --set log.every_steps=4 --set optimizer.schedule.warmup_steps=4)
gpt=(--config "$SRC/configs/fortunes_gpt.pbtxt" --set "data.text.paths=[\"$TMP/text\"]" --set train.steps=30
     --set log.every_steps=10 --set optimizer.schedule.warmup_steps=5 --set 'model.gpt.n_layer=1'
     --set data.eval_batch_size=16)
# Loss bounds: 32 SGD steps take the MLP from ~2.3 to ~1.0, 16 AdamW steps the CNN from ~2.3 to under 1.5, 30 AdamW
# steps the byte-level GPT from ~5.5 to ~3.3 here; 0.8x and 0.9x leave room for every dtype.
for model in mlp cnn gpt; do
  for p in fp32 fp16 bf16; do
    case $model in
      mlp) args=("${mlp[@]}") factor=0.8 ;;
      cnn) args=("${cnn[@]}") factor=0.8 ;;
      gpt) args=("${gpt[@]}") factor=0.9 ;;
    esac
    if run 2 "$TMP/$model-$p.txt" "${args[@]}" --precision "$p" --run-dir "$TMP/$model-$p"; then
      if loss_falls "$TMP/$model-$p/metrics.jsonl" "$factor" > "$TMP/$model-$p.check" 2>&1; then
        ok "$model $p on 2 ranks under the cap: exit 0, loss falls"
      else
        not_ok "$model $p under the cap" "loss does not fall"; show "$TMP/$model-$p.check"
      fi
    else
      not_ok "$model $p under the cap" "exit $?"; show "$TMP/$model-$p.txt"
    fi
  done
done

# ZeRO-1 in bf16 under the cap: the same run as above with the optimizer state sharded ends with the same master
# weights (stage 1 changes where the update runs, not its result).
if run 2 "$TMP/mlp-bf16-zero.txt" "${mlp[@]}" --precision bf16 --set optimizer.zero_stage=1 --run-dir "$TMP/mlp-bf16-zero" &&
   [ -n "$(hash_of "$TMP/mlp-bf16.txt")" ] && [ "$(hash_of "$TMP/mlp-bf16.txt")" = "$(hash_of "$TMP/mlp-bf16-zero.txt")" ]; then
  ok "mlp bf16 with ZeRO-1 under the cap: the master weights hash of the unsharded run"
else
  not_ok "mlp bf16 ZeRO-1 under the cap" "hash '$(hash_of "$TMP/mlp-bf16-zero.txt")' vs '$(hash_of "$TMP/mlp-bf16.txt")'"
  show "$TMP/mlp-bf16-zero.txt"
fi

# ---- 3. an emulated AVX2-only CPU -----------------------------------------------------------------------------------
QEMU=$(command -v qemu-x86_64 || true)
if [ -z "$QEMU" ]; then
  not_ok "emulated AVX2 CPU" "qemu-x86_64 not found (Debian's qemu-user: launch/setup/install_deps.sh)"
  exit "$FAILED"
fi
# The emulator must be a real check: one AVX-512 instruction dies there (SIGILL), one AVX2 instruction runs.
cat > "$TMP/z.c" <<'C'
int main(void) { __asm__ volatile("vpxord %%zmm1, %%zmm1, %%zmm1" ::: "xmm1"); return 0; }
C
cat > "$TMP/y.c" <<'C'
int main(void) { __asm__ volatile("vpxor %%ymm1, %%ymm1, %%ymm1" ::: "xmm1"); return 0; }
C
cc -O0 "$TMP/z.c" -o "$TMP/z" && cc -O0 "$TMP/y.c" -o "$TMP/y" || { not_ok "emulator check" "cannot compile"; exit 1; }
"$QEMU" -cpu Haswell "$TMP/y" 2>/dev/null; y_rc=$?
( "$QEMU" -cpu Haswell "$TMP/z" ) 2>/dev/null; z_rc=$?
if [ "$y_rc" -eq 0 ] && [ "$z_rc" -ne 0 ]; then
  ok "qemu-x86_64 -cpu Haswell runs AVX2 and rejects AVX-512 (exit $z_rc)"
else
  not_ok "emulator check" "AVX2 program exit $y_rc, AVX-512 program exit $z_rc (expected 0 and non-zero)"
fi
# Under emulation a conv net or GPT step takes tens of seconds (TCG), so those runs are a few small steps over a
# smaller slice (64 training and 32 test images) and a shorter text (its evaluation runs under emulation too).
FM1="$TMP/fm1"
fashion_mnist_slice "$FM1" 64 32 || { echo "not ok - setup: cannot write the small IDX slice"; exit 1; }
mkdir -p "$TMP/text1" && head -c 20000 /usr/share/games/fortunes/computers > "$TMP/text1/computers"
mlp1=(--config "$SRC/configs/fashion_mnist_mlp.pbtxt" --set data.idx.dir="$FM" --set 'model.mlp.hidden=[64]'
      --set data.global_batch_size=32 --set train.steps=20 --set log.every_steps=10)
cnn1=("${cnn[@]}" --set data.idx.dir="$FM1" --set data.global_batch_size=8 --set train.steps=3 --set log.every_steps=1)
gpt1=("${gpt[@]}" --set "data.text.paths=[\"$TMP/text1\"]" --set data.global_batch_size=8 --set train.steps=3
      --set log.every_steps=1)
for case in "mlp fp16" "mlp bf16" "cnn bf16" "gpt bf16"; do
  read -r model p <<<"$case"
  case $model in
    mlp) args=("${mlp1[@]}") ;;
    cnn) args=("${cnn1[@]}") ;;
    gpt) args=("${gpt1[@]}") ;;
  esac
  args+=(--precision "$p" --set train.threads_per_rank=1)
  timeout 300 "$AMPDIST" train "${args[@]}" --run-dir "$TMP/native-$model-$p" > "$TMP/native-$model-$p.txt" 2>&1 ||
    not_ok "$model $p single process under the cap" "exit $?: $(tail -3 "$TMP/native-$model-$p.txt")"
  start=$(date +%s)
  timeout 600 "$QEMU" -cpu Haswell "$AMPDIST" train "${args[@]}" --run-dir "$TMP/qemu-$model-$p" \
    > "$TMP/qemu-$model-$p.txt" 2>&1
  rc=$?
  native=$(hash_of "$TMP/native-$model-$p.txt")
  emulated=$(hash_of "$TMP/qemu-$model-$p.txt")
  if [ "$rc" -eq 0 ] && [ -n "$native" ] && [ "$native" = "$emulated" ]; then
    ok "$model $p on the emulated AVX2 CPU: exit 0 in $(($(date +%s) - start)) s, master weights hash $emulated as under the cap"
  else
    not_ok "$model $p on the emulated AVX2 CPU" "exit $rc, hash '$emulated' vs '$native' under the cap"
    show "$TMP/qemu-$model-$p.txt"
  fi
done
exit "$FAILED"

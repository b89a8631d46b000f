#!/usr/bin/env bash
# End-to-end: `ampdist ckpt inspect|verify|export` on a checkpoint of the main job (2 ranks, fp16, 40 steps, saved at
# 20 and 40). inspect shows the step, the world size and the master weights hash the run printed; verify passes;
# export writes a safetensors file that the `safetensors` Python package loads, whose tensors equal, bit for bit, the
# master weights read from the shard files by tests/e2e/check_safetensors.py. Plus the tools' bad input.
#
#   bash tests/e2e/test_checkpoint_tools.sh <path-to-ampdist> <source-dir>
# The Python check needs safetensors and numpy (launch/setup/install_deps.sh puts them in build/pyenv); without
# them the test fails. AMPDIST_PYTHON names another interpreter to use.
source "$(dirname "$0")/lib.sh" ckpt_tools "$@"

CFG="$SRC/configs/fashion_mnist_mlp.pbtxt"
MPIRUN=(mpirun -q --oversubscribe -np 2)

# error_line_problem OUT RC WANT_RC NEEDLE: why OUT is not exactly one line "ampdist: error: ..." naming NEEDLE with
# exit code WANT_RC ("" when it is).
error_line_problem() {
  local out=$1 rc=$2 want=$3 needle=$4 n line
  n=$(grep -c . "$out")
  line=$(grep -m1 . "$out")
  if [ "$rc" -eq 124 ]; then
    echo "HANG (killed by timeout)"
  elif [ "$rc" -ne "$want" ]; then
    echo "exit code $rc, expected $want"
  elif [ "$n" -ne 1 ]; then
    echo "$n non-empty output lines, expected exactly 1"
  elif [[ "$line" != "ampdist: error: "* ]]; then
    echo "line does not start with 'ampdist: error: '"
  elif ! grep -Fq -- "$needle" <<<"$line"; then
    echo "line does not name '$needle'"
  fi
}

# ---- the Python that has safetensors and numpy -------------------------------------------------------------------
PY=""
for candidate in "${AMPDIST_PYTHON:-}" "$(dirname "$AMPDIST")/pyenv/bin/python3" "$SRC/build/pyenv/bin/python3" \
  python3; do
  [ -n "$candidate" ] || continue
  if "$candidate" -c 'import safetensors.numpy, numpy' >/dev/null 2>&1; then
    PY=$candidate
    break
  fi
done
if [ -n "$PY" ]; then
  ok "python with safetensors and numpy: $PY"
else
  not_ok "python with safetensors and numpy" "none of \$AMPDIST_PYTHON, $(dirname "$AMPDIST")/pyenv/bin/python3, \
$SRC/build/pyenv/bin/python3, python3 imports safetensors.numpy and numpy: run launch/setup/install_deps.sh"
fi

# ---- the checkpoint -----------------------------------------------------------------------------------------------
RUN="$TMP/run"
CK="$RUN/checkpoints"
out="$TMP/train.out"
timeout 300 "${MPIRUN[@]}" "$AMPDIST" train --config "$CFG" --precision fp16 --set train.steps=40 \
  --set checkpoint.every_steps=20 --run-dir "$RUN" >"$out" 2>&1 </dev/null
rc=$?
HASH=$(sed -n 's/^master weights hash: \([0-9a-f]\{16\}\)$/\1/p' "$out")
if [ "$rc" -ne 0 ] || [ -z "$HASH" ] || [ ! -f "$CK/step_00000040/manifest.pb" ] ||
  [ ! -f "$CK/step_00000020/manifest.pb" ]; then
  not_ok "train 40 steps, fp16, 2 ranks, checkpoints at 20 and 40" "exit code $rc, hash '$HASH'"
  show "$out"
  exit 1
fi
ok "train 40 steps, fp16, 2 ranks, checkpoints at 20 and 40 (master weights hash $HASH)"
STEP40="$CK/step_00000040"

# ---- inspect --------------------------------------------------------------------------------------------------------
# inspect_case NAME PATH LINE...: `ckpt inspect PATH` exits 0 and prints every LINE (a whole line, regex).
inspect_case() {
  local name=$1 path=$2 out="$TMP/inspect.$RANDOM" rc why="" want
  shift 2
  timeout 60 "$AMPDIST" ckpt inspect "$path" >"$out" 2>&1 </dev/null
  rc=$?
  if [ "$rc" -ne 0 ]; then
    why="exit code $rc, expected 0"
  else
    for want in "$@"; do
      grep -Eq -- "^$want\$" "$out" || {
        why="no line /^$want\$/"
        break
      }
    done
  fi
  if [ -z "$why" ]; then ok "$name"; else
    not_ok "$name" "$why"
    show "$out"
  fi
}
inspect_case "inspect the run's checkpoint dir: the latest, step 40, world size 2, the run's hash" "$CK" \
  "checkpoint: $STEP40" "step: 40" "world size at save: 2" "precision: fp16" "master weights hash: $HASH" \
  "optimizer: sgd \(step count 40\)" "loss scale: 65536 \(growth tracker 40, hysteresis tracker [0-9]+, skipped steps 0\)" \
  "buffers: master, .* \(535818 elements each\)" \
  " +fc1\.weight +\[512, 784\] +401408 +0" " +fc3\.bias +\[10\] +10 +535808" \
  " +shard_00000_of_00002\.pb +[0-9]+ +[0-9]+" " +shard_00001_of_00002\.pb +[0-9]+ +[0-9]+"
inspect_case "inspect a checkpoint directory: step 20" "$CK/step_00000020" \
  "checkpoint: $CK/step_00000020" "step: 20" "world size at save: 2"

out="$TMP/inspect_bad.out"
timeout 60 "$AMPDIST" ckpt inspect "$TMP/nope" >"$out" 2>&1 </dev/null
why=$(error_line_problem "$out" $? 2 "$TMP/nope")
if [ -z "$why" ]; then ok "inspect a missing path: one line, exit 2"; else
  not_ok "inspect a missing path" "$why"
  show "$out"
fi

# ---- verify ---------------------------------------------------------------------------------------------------------
out="$TMP/verify.out"
timeout 60 "$AMPDIST" ckpt verify "$STEP40" >"$out" 2>&1 </dev/null
rc=$?
if [ "$rc" -eq 0 ] && [ "$(grep -c . "$out")" -eq 1 ] &&
  grep -Eq "^ok: $STEP40 \(2 shards, [0-9]+ bytes verified\)$" "$out"; then
  ok "verify: exit 0, 'ok: PATH (2 shards, N bytes verified)'"
else
  not_ok "verify" "exit code $rc"
  show "$out"
fi
out="$TMP/verify_mpi.out"
timeout 60 "${MPIRUN[@]}" "$AMPDIST" ckpt verify "$STEP40" >"$out" 2>&1 </dev/null
rc=$?
if [ "$rc" -eq 0 ] && [ "$(grep -c . "$out")" -eq 1 ] && grep -q "^ok: $STEP40 " "$out"; then
  ok "verify under mpirun -np 2: one line from rank 0, exit 0"
else
  not_ok "verify under mpirun -np 2" "exit code $rc"
  show "$out"
fi

# ---- export ---------------------------------------------------------------------------------------------------------
ST="$TMP/model.safetensors"
out="$TMP/export.out"
timeout 120 "$AMPDIST" ckpt export "$STEP40" --format safetensors -o "$ST" >"$out" 2>&1 </dev/null
rc=$?
if [ "$rc" -eq 0 ] && [ -s "$ST" ] && [ ! -e "$ST.tmp" ]; then
  ok "export --format safetensors: exit 0, $(stat -c %s "$ST") bytes, no .tmp left"
else
  not_ok "export --format safetensors" "exit code $rc"
  show "$out"
fi
if [ -n "$PY" ]; then
  out="$TMP/check.out"
  timeout 120 "$PY" "$SRC/tests/e2e/check_safetensors.py" "$ST" "$STEP40" >"$out" 2>&1 </dev/null
  rc=$?
  if [ "$rc" -eq 0 ]; then ok "safetensors file: $(cat "$out")"; else
    not_ok "safetensors file (check_safetensors.py)" "exit code $rc"
    show "$out"
  fi
else
  not_ok "safetensors file (check_safetensors.py)" "no python with safetensors and numpy (see above)"
fi

out="$TMP/export_fmt.out"
timeout 60 "$AMPDIST" ckpt export "$STEP40" --format gguf -o "$TMP/x.gguf" >"$out" 2>&1 </dev/null
why=$(error_line_problem "$out" $? 2 "--format")
[ -z "$why" ] && [ -e "$TMP/x.gguf" ] && why="wrote $TMP/x.gguf"
if [ -z "$why" ]; then ok "export --format gguf: one line naming --format, exit 2"; else
  not_ok "export --format gguf" "$why"
  show "$out"
fi
out="$TMP/export_dir.out"
timeout 60 "$AMPDIST" ckpt export "$STEP40" -o "$TMP/no_such_dir/m.safetensors" >"$out" 2>&1 </dev/null
why=$(error_line_problem "$out" $? 2 "$TMP/no_such_dir/m.safetensors")
if [ -z "$why" ]; then ok "export into a missing directory: one line naming the file, exit 2"; else
  not_ok "export into a missing directory" "$why"
  show "$out"
fi

exit "$FAILED"

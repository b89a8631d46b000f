#!/usr/bin/env bash
# End-to-end: a damaged or foreign checkpoint is never loaded. From a good checkpoint of the main job (2 ranks,
# 20 steps, saved at 10 and 20), each case damages a copy of the run directory:
#   a  a shard cut short by 100 bytes        d  manifest.pb replaced by another run's (another seed)
#   b  one byte of a shard flipped            e  a checkpoint of another model (model.mlp.hidden=[64])
#   c  a shard deleted                        f  one byte of manifest.pb flipped
# and then `mpirun -np 2 ampdist train --resume <that step dir>` must exit 2 with exactly one line
# "ampdist: error: ..." naming the damaged file (the checkpoint directory for e), leaving every file of the copy as it
# was (no new step_*), and `ampdist ckpt verify` must exit 1 naming the file (e is a whole checkpoint: exit 0).
# Then --resume auto: a corrupt newest checkpoint (step 20) falls back to step 10, and a partial .tmp_step_00000030
# is never chosen.
#
#   bash tests/e2e/test_checkpoint_corruption.sh <path-to-ampdist> <source-dir>
source "$(dirname "$0")/lib.sh" ckpt_corrupt "$@"

CFG="$SRC/configs/fashion_mnist_mlp.pbtxt"
MPIRUN=(mpirun -q --oversubscribe -np 2)
TRAIN=(train --config "$CFG" --set checkpoint.every_steps=10)

# train_run NAME OUTFILE ARGS...: a training run on 2 ranks that must succeed; stops the test when it does not.
train_run() {
  local name=$1 out=$2
  shift 2
  timeout 300 "${MPIRUN[@]}" "$AMPDIST" "${TRAIN[@]}" "$@" >"$out" 2>&1 </dev/null
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    not_ok "$name" "exit code $rc"
    show "$out"
    exit 1
  fi
  ok "$name"
}

# A listing of every path under a directory with the SHA-256 of every file.
snapshot() {
  # .ranks/ holds each rank's live progress record for the collective watchdog: diagnostics, not saved state.
  (cd "$1" && find . -path ./.ranks -prune -o -print | LC_ALL=C sort &&
    find . -path ./.ranks -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
}

# Flips (XOR 0xff) the byte at OFFSET of FILE in place.
flip_byte() {
  local file=$1 offset=$2 byte
  byte=$(od -An -tu1 -j "$offset" -N1 "$file" | tr -d ' ')
  printf '%b' "\\$(printf '%03o' $((byte ^ 255)))" | dd of="$file" bs=1 seek="$offset" conv=notrunc status=none
}

# ---- the checkpoints --------------------------------------------------------------------------------------------------
GOOD="$TMP/good"
train_run "good run: 20 steps on 2 ranks, checkpoints at 10 and 20" "$TMP/good.out" --set train.steps=20 \
  --run-dir "$GOOD"
train_run "another run (seed 99)" "$TMP/other.out" --set train.steps=20 --set train.seed=99 --run-dir "$TMP/other"
train_run "another model (model.mlp.hidden=[64])" "$TMP/small.out" --set train.steps=20 \
  --set 'model.mlp.hidden=[64]' --run-dir "$TMP/small"
for d in "$GOOD" "$TMP/other" "$TMP/small"; do
  if [ ! -f "$d/checkpoints/step_00000010/manifest.pb" ] || [ ! -f "$d/checkpoints/step_00000020/manifest.pb" ]; then
    not_ok "setup" "$d/checkpoints lacks step_00000010 or step_00000020"
    exit 1
  fi
done
SHARD0=shard_00000_of_00002.pb
SHARD1=shard_00001_of_00002.pb

# ---- damaged checkpoints ------------------------------------------------------------------------------------------------
# corrupt_case NAME RUN_COPY NEEDLE VERIFY_RC: resumes from RUN_COPY/checkpoints/step_00000020 in RUN_COPY and checks
# the one error line names NEEDLE and nothing changed; then `ckpt verify` exits VERIFY_RC (1: naming NEEDLE).
corrupt_case() {
  local name=$1 run=$2 needle=$3 verify_rc=$4
  local step="$run/checkpoints/step_00000020" out="$run.out" vout="$run.verify" why="" rc n line
  snapshot "$run" >"$run.before"
  timeout 120 "${MPIRUN[@]}" "$AMPDIST" "${TRAIN[@]}" --set train.steps=30 --run-dir "$run" --resume "$step" \
    >"$out" 2>&1 </dev/null
  rc=$?
  n=$(grep -c . "$out")
  line=$(grep -m1 . "$out")
  if [ "$rc" -eq 124 ]; then
    why="HANG (killed by timeout 120)"
  elif grep -Eq 'core dumped|Segmentation|terminate called|Aborted' "$out"; then
    why="crashed (exit $rc)"
  elif [ "$rc" -ne 2 ]; then
    why="exit code $rc, expected 2"
  elif [ "$n" -ne 1 ]; then
    why="$n non-empty output lines, expected exactly 1"
  elif [[ "$line" != "ampdist: error: "* ]]; then
    why="line does not start with 'ampdist: error: '"
  elif ! grep -Fq -- "$needle" <<<"$line"; then
    why="line does not name $needle"
  fi
  snapshot "$run" >"$run.after"
  if [ -z "$why" ] && ! cmp -s "$run.before" "$run.after"; then
    why="files of $run changed: $(diff "$run.before" "$run.after" | grep '^[<>]' | head -3 | tr '\n' ' ')"
  fi
  if [ -z "$why" ]; then ok "$name: train --resume exits 2, one line: ${line#ampdist: error: }"; else
    not_ok "$name: train --resume" "$why"
    show "$out"
  fi

  why=""
  timeout 120 "$AMPDIST" ckpt verify "$step" >"$vout" 2>&1 </dev/null
  rc=$?
  if [ "$rc" -ne "$verify_rc" ]; then
    why="exit code $rc, expected $verify_rc"
  elif [ "$verify_rc" -eq 1 ] && ! grep -Fq -- "$needle" "$vout"; then
    why="no line names $needle"
  elif [ "$verify_rc" -eq 1 ] && grep -v '^ampdist: error: ' "$vout" | grep -q .; then
    why="a line does not start with 'ampdist: error: '"
  fi
  if [ -z "$why" ]; then ok "$name: ckpt verify exits $verify_rc"; else
    not_ok "$name: ckpt verify" "$why"
    show "$vout"
  fi
}

R="$TMP/a"
cp -a "$GOOD" "$R"
truncate -s -100 "$R/checkpoints/step_00000020/$SHARD1"
corrupt_case "a shard cut short by 100 bytes" "$R" "$R/checkpoints/step_00000020/$SHARD1" 1

R="$TMP/b"
cp -a "$GOOD" "$R"
F="$R/checkpoints/step_00000020/$SHARD0"
flip_byte "$F" $(($(stat -c %s "$F") / 2))
corrupt_case "b one byte flipped in the middle of a shard" "$R" "$F" 1

R="$TMP/c"
cp -a "$GOOD" "$R"
rm "$R/checkpoints/step_00000020/$SHARD1"
corrupt_case "c a shard deleted" "$R" "$R/checkpoints/step_00000020/$SHARD1" 1

R="$TMP/d"
cp -a "$GOOD" "$R"
cp "$TMP/other/checkpoints/step_00000020/manifest.pb" "$R/checkpoints/step_00000020/manifest.pb"
corrupt_case "d manifest.pb of another run" "$R" "$R/checkpoints/step_00000020/manifest.pb" 1

# e: the copy is the other model's run; the main config resumes from it. A whole checkpoint: verify passes.
R="$TMP/e"
cp -a "$TMP/small" "$R"
corrupt_case "e a checkpoint of another model" "$R" "$R/checkpoints/step_00000020" 0

R="$TMP/f"
cp -a "$GOOD" "$R"
F="$R/checkpoints/step_00000020/manifest.pb"
flip_byte "$F" $(($(stat -c %s "$F") / 2))
corrupt_case "f one byte flipped in manifest.pb" "$R" "$F" 1

# ---- --resume auto ----------------------------------------------------------------------------------------------------
# auto_case NAME RUN_COPY WANT_STEP_DIR: --resume auto in RUN_COPY resumes from WANT_STEP_DIR and trains to 30.
auto_case() {
  local name=$1 run=$2 want=$3 out="$2.out" rc line
  timeout 300 "${MPIRUN[@]}" "$AMPDIST" "${TRAIN[@]}" --set train.steps=30 --run-dir "$run" --resume auto \
    >"$out" 2>&1 </dev/null
  rc=$?
  line=$(grep -m1 '^resumed from ' "$out")
  if [ "$rc" -ne 0 ]; then
    not_ok "$name" "exit code $rc"
    show "$out"
  elif [[ "$line" != "resumed from $want (step "* ]]; then
    not_ok "$name" "header line '${line:-<none>}', expected 'resumed from $want (step ...'"
    show "$out"
  elif grep -q 'ampdist: error:' "$out"; then
    not_ok "$name" "printed an error"
    show "$out"
  else
    ok "$name: $line"
  fi
}

R="$TMP/g"
cp -a "$GOOD" "$R"
F="$R/checkpoints/step_00000020/$SHARD1"
flip_byte "$F" $(($(stat -c %s "$F") / 2))
auto_case "--resume auto with the newest checkpoint (20) corrupt falls back to step 10" "$R" \
  "$R/checkpoints/step_00000010"

# A save of step 30 interrupted: a .tmp directory with partial files (a shard half written, even a manifest).
R="$TMP/h"
cp -a "$GOOD" "$R"
T="$R/checkpoints/.tmp_step_00000030"
mkdir "$T"
cp "$R/checkpoints/step_00000020/manifest.pb" "$T/"
head -c 1000000 "$R/checkpoints/step_00000020/$SHARD0" >"$T/$SHARD0"
auto_case "--resume auto never chooses a partial .tmp_step_00000030" "$R" "$R/checkpoints/step_00000020"

out="$TMP/h.inspect"
timeout 60 "$AMPDIST" ckpt inspect "$R/checkpoints" >"$out" 2>&1 </dev/null
rc=$?
line=$(grep -m1 '^checkpoint: ' "$out")
# The resumed run saved step 30 properly: that one, never the .tmp directory.
if [ "$rc" -eq 0 ] && [ "$line" = "checkpoint: $R/checkpoints/step_00000030" ]; then
  ok "ckpt inspect on the run's checkpoints: $line"
else
  not_ok "ckpt inspect on the run's checkpoints" "exit code $rc, '$line'"
  show "$out"
fi

exit "$FAILED"

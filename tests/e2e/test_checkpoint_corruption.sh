#!/usr/bin/env bash
# End-to-end: a damaged or foreign checkpoint is never loaded. From a good checkpoint of the main job (2 ranks,
# 20 steps, saved at 10 and 20), each case damages a copy of the run directory:
#   a  a shard cut short by 100 bytes        d  manifest.pb replaced by another run's (another seed)
#   b  one byte of a shard flipped            e  a checkpoint of another model (model.mlp.hidden=[64])
#   c  a shard deleted                        f  one byte of manifest.pb flipped
# and then `mpirun -np 2 ampdist train --resume <that step dir>` must exit 2 with exactly one line
# "ampdist: error: ..." naming the damaged file (the checkpoint directory for e), leaving every file of the copy as it
# was (no new step_*), and `ampdist ckpt verify` must exit 1 naming the file (e is a whole checkpoint: exit 0).
# Then --resume auto: a corrupt newest checkpoint (step 20) falls back to step 10, with one warning naming it, and is
# moved aside intact (never written over by the resumed run's own save of step 20); a partial .tmp_step_00000030 is
# never chosen; a whole checkpoint of another model is refused (exit 2), not passed over. A damaged checkpoint in the
# way of a save of the same step, or of keep_last pruning, is moved aside intact with a warning, and `ckpt verify`
# on the directory lists it.
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

# damaged_kept NAME RUN_OUT DAMAGED_DIR SUMS NEEDLE: RUN_OUT has exactly one warning line, naming DAMAGED_DIR and
# NEEDLE; DAMAGED_DIR.damaged holds exactly the files listed in SUMS (sha256sum output, relative) unchanged; and
# `ckpt verify` of the checkpoints directory exits 1 and lists DAMAGED_DIR.damaged.
damaged_kept() {
  local name=$1 out=$2 dir=$3 sums=$4 needle=$5 why="" n vout="$2.verify" rc
  n=$(grep -c '^warning: ' "$out")
  if [ "$n" -ne 1 ]; then
    why="$n warning lines, expected 1"
  elif ! grep '^warning: ' "$out" | grep -Fq "$dir " || ! grep '^warning: ' "$out" | grep -Fq -- "$needle"; then
    why="the warning does not name $dir and '$needle'"
  elif [ ! -d "$dir.damaged" ]; then
    why="no $dir.damaged"
  elif ! (cd "$dir.damaged" && sha256sum --quiet -c "$sums" >/dev/null 2>&1) ||
    [ "$(find "$dir.damaged" -type f | wc -l)" -ne "$(grep -c . "$sums")" ]; then
    why="$dir.damaged differs from the damaged checkpoint"
  fi
  if [ -z "$why" ]; then
    timeout 120 "$AMPDIST" ckpt verify "$(dirname "$dir")" >"$vout" 2>&1 </dev/null
    rc=$?
    if [ "$rc" -ne 1 ] || ! grep -Fq "ampdist: error: $dir.damaged/" "$vout"; then
      why="ckpt verify $(dirname "$dir"): exit $rc, expected 1 with a line naming $dir.damaged"
    fi
  fi
  if [ -z "$why" ]; then ok "$name: $(grep '^warning: ' "$out" | cut -c1-160)"; else
    not_ok "$name" "$why"
    show "$out"
  fi
}

# sums DIR OUT: sha256sum of every file of DIR, relative to it.
sums() { (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) >"$2"; }

R="$TMP/g"
cp -a "$GOOD" "$R"
F="$R/checkpoints/step_00000020/$SHARD1"
flip_byte "$F" $(($(stat -c %s "$F") / 2))
sums "$R/checkpoints/step_00000020" "$TMP/g.sums"
auto_case "--resume auto with the newest checkpoint (20) corrupt falls back to step 10" "$R" \
  "$R/checkpoints/step_00000010"
damaged_kept "the corrupt step 20 is moved aside intact, not written over by the new step 20" "$R.out" \
  "$R/checkpoints/step_00000020" "$TMP/g.sums" "XXH3"

# The scenario as a user met it: 2 ranks, a small MLP, saves at 5 and 10; one shard of step 10 deleted; --resume auto
# to step 12 must say so, resume from 5, and leave the damaged step 10's files as they were.
R="$TMP/m"
train_run "small run: 10 steps, saves at 5 and 10" "$TMP/m0.out" --set 'model.mlp.hidden=[64]' --set train.steps=10 \
  --set checkpoint.every_steps=5 --run-dir "$R"
rm "$R/checkpoints/step_00000010/$SHARD1"
sums "$R/checkpoints/step_00000010" "$TMP/m.sums"
train_run "resume auto to step 12 with step 10's shard 1 deleted" "$R.out" --set 'model.mlp.hidden=[64]' \
  --set train.steps=12 --set checkpoint.every_steps=5 --run-dir "$R" --resume auto
if grep -q "^resumed from $R/checkpoints/step_00000005 (step 5" "$R.out"; then ok "it resumed from step 5"; else
  not_ok "resume choice" "$(grep -m1 '^resumed' "$R.out")"
fi
damaged_kept "the damaged step 10 is named and moved aside intact" "$R.out" "$R/checkpoints/step_00000010" \
  "$TMP/m.sums" "$R/checkpoints/step_00000010/$SHARD1: missing"

# A save of a step whose directory is damaged (resumed from 10 by path; step 20's shard deleted) and keep_last
# pruning that reaches a damaged checkpoint (step 10's shard cut short, keep_last 1) move it aside.
R="$TMP/s"
cp -a "$GOOD" "$R"
rm "$R/checkpoints/step_00000020/$SHARD0"
sums "$R/checkpoints/step_00000020" "$TMP/s.sums"
train_run "resume from step 10 by path with a damaged step 20 in the way" "$R.out" --set train.steps=20 \
  --run-dir "$R" --resume "$R/checkpoints/step_00000010"
damaged_kept "the save of step 20 moved the damaged one aside" "$R.out" "$R/checkpoints/step_00000020" "$TMP/s.sums" \
  "$SHARD0: missing"
R="$TMP/p"
cp -a "$GOOD" "$R"
truncate -s -100 "$R/checkpoints/step_00000010/$SHARD1"
sums "$R/checkpoints/step_00000010" "$TMP/p.sums"
train_run "resume from step 20 with keep_last 1 and a damaged step 10" "$R.out" --set train.steps=30 \
  --set checkpoint.keep_last=1 --run-dir "$R" --resume "$R/checkpoints/step_00000020"
damaged_kept "keep_last pruning moved the damaged step 10 aside instead of removing it" "$R.out" \
  "$R/checkpoints/step_00000010" "$TMP/p.sums" "$SHARD1"
if [ ! -e "$R/checkpoints/step_00000020" ] && [ -f "$R/checkpoints/step_00000030/manifest.pb" ]; then
  ok "keep_last 1 still pruned the whole step 20"
else
  not_ok "keep_last 1" "$(ls "$R/checkpoints" | tr '\n' ' ')"
fi

# A whole checkpoint of another model under --resume auto: not damage, a shared run directory; refused, unchanged.
R="$TMP/x"
cp -a "$TMP/small" "$R"
snapshot "$R" >"$R.before"
timeout 120 "${MPIRUN[@]}" "$AMPDIST" "${TRAIN[@]}" --set train.steps=30 --run-dir "$R" --resume auto \
  >"$R.out" 2>&1 </dev/null
rc=$?
snapshot "$R" >"$R.after"
if [ "$rc" -eq 2 ] && [ "$(grep -c . "$R.out")" -eq 1 ] &&
  grep -q "^ampdist: error: $R/checkpoints/step_00000020: .*checkpoint of another model.*--resume auto does not pass over" "$R.out" &&
  cmp -s "$R.before" "$R.after"; then
  ok "--resume auto refuses a whole checkpoint of another model (exit 2, one line, nothing changed)"
else
  not_ok "--resume auto with another model's checkpoint" "exit $rc, files $(cmp -s "$R.before" "$R.after" && echo same || echo changed)"
  show "$R.out"
fi

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

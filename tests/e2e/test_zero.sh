#!/usr/bin/env bash
# End-to-end: sharded optimizer state (optimizer.zero_stage 1) changes no number of the main job on 2 ranks, in
# fp32, fp16 and bf16: 300 steps with a checkpoint every 100 end with the same master weights hash (of the whole
# FP32 buffer) and the same test accuracy as replicated state. On 2 ranks every sum has two terms, so the order of
# the reduce-scatter and of the all-reduce cannot differ. Then a stage-1 checkpoint resumes replicated and the reverse,
# ending with the uninterrupted run's hash.
#   bash tests/e2e/test_zero.sh <path-to-ampdist> <source-dir>
source "$(dirname "$0")/lib.sh" zero "$@"

CFG="$SRC/configs/fashion_mnist_mlp.pbtxt"
MPIRUN=(timeout 300 mpirun -q --oversubscribe -np 2)
COMMON=(--set train.steps=300 --set checkpoint.every_steps=100 --set log.every_steps=100)

for p in fp32 fp16 bf16; do
  for z in 0 1; do
    "${MPIRUN[@]}" "$AMPDIST" train --config "$CFG" --precision "$p" "${COMMON[@]}" --set optimizer.zero_stage=$z \
      --run-dir "$TMP/${p}_$z" >"$TMP/${p}_$z.out" 2>&1 || { not_ok "$p stage $z" "exit $?"; show "$TMP/${p}_$z.out"; }
  done
  h0=$(hash_of "$TMP/${p}_0.out") h1=$(hash_of "$TMP/${p}_1.out")
  a0=$(grep '^test accuracy' "$TMP/${p}_0.out") a1=$(grep '^test accuracy' "$TMP/${p}_1.out")
  if [ -n "$h0" ] && [ "$h0" = "$h1" ] && [ "$a0" = "$a1" ]; then
    ok "$p: stage 1 ends as replicated state: $h1, $a1"
  else
    not_ok "$p: stage 1 against replicated" "hash '$h1' vs '$h0', '$a1' vs '$a0'"
  fi
done

# Resume across stages: the fp16 runs' step-100 checkpoints, continued in the other stage to step 300.
for z in 0 1; do
  other=$((1 - z))
  dir="$TMP/resume_$z"
  mkdir -p "$dir/checkpoints"
  cp -a "$TMP/fp16_$z/checkpoints/step_00000100" "$dir/checkpoints/"
  "${MPIRUN[@]}" "$AMPDIST" train --config "$CFG" --precision fp16 "${COMMON[@]}" --set optimizer.zero_stage=$other \
    --run-dir "$dir" --resume "$dir/checkpoints/step_00000100" >"$dir.out" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && [ "$(hash_of "$dir.out")" = "$(hash_of "$TMP/fp16_0.out")" ]; then
    ok "a stage-$z checkpoint resumed in stage $other ends with the uninterrupted hash"
  else
    not_ok "stage $z -> $other resume" "exit $rc, hash '$(hash_of "$dir.out")'"
    show "$dir.out"
  fi
done

exit "$FAILED"

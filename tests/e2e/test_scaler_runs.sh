#!/usr/bin/env bash
# End-to-end: the loss scale over the whole float range, a precision change on resume, a scaler-limit stop on two
# ranks, and a resume past the last step, each as a user meets it on the command line.
#
#   1. A dynamic scale started near FLT_MAX with growth every step never becomes inf: growth that would overflow
#      keeps the old scale (as PyTorch's GradScaler), every step applies, exit 0.
#   2. An fp16 checkpoint resumed in bf16 (and a bf16 one in fp16) starts the new precision's loss-scale policy
#      afresh: one line says so, the banner, the first resumed step's scale in metrics.jsonl and the run agree.
#   3. A stop by precision.max_consecutive_skips or precision.dynamic.min_scale on 2 ranks prints one error line
#      (the decision is agreed by every rank), exit 1, no rank left running.
#   4. --resume auto with train.steps below the checkpoint's step trains nothing, says so in one line, and labels the
#      evaluation with the checkpoint's step (console and metrics.jsonl).
#
#   bash tests/e2e/test_scaler_runs.sh <path-to-ampdist> <source-dir>
source "$(dirname "$0")/lib.sh" scaler_runs "$@"

REAL_DATA=/usr/share/datasets/fashion-mnist
MPIRUN=(timeout 120 mpirun -q --oversubscribe -np 2)
CFG="$SRC/configs/fashion_mnist_mlp.pbtxt"
SMALL=(--set 'model.mlp.hidden=[64]' --set log.every_steps=1 --set log.phase_timing=false)
[ -d "$REAL_DATA" ] || { echo "not ok - setup: $REAL_DATA is missing (install dataset-fashion-mnist)"; exit 1; }

# json_field FILE TYPE STEP FIELD: FIELD of the first record of TYPE at STEP in metrics.jsonl.
json_field() {
  python3 - "$@" <<'EOF'
import json, sys
path, kind, step, field = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
for line in open(path):
    r = json.loads(line)
    if r.get("type") == kind and r.get("step") == step:
        print(r.get(field))
        break
EOF
}

# ---- 1. growth near the top of the float range -------------------------------------------------------------------
out="$TMP/grow.out"
timeout 120 "$AMPDIST" train --config "$CFG" --precision fp32 "${SMALL[@]}" --set train.steps=8 \
  --set precision.dynamic.init_scale=1e38 --set precision.dynamic.growth_interval=1 --run-dir "$TMP/grow" \
  >"$out" 2>&1
rc=$?
scales=$(sed -n 's/^step .* scale \([^ ]*\) .*/\1/p' "$out" | sort -u | tr '\n' ' ')
if [ "$rc" -ne 0 ]; then
  not_ok "1 growth near FLT_MAX" "exit $rc"; show "$out"
elif [ "$scales" != "2e+38 " ]; then
  not_ok "1 growth near FLT_MAX" "scales seen: '$scales', expected 2e+38 at every step (1e38 x 2, then kept)"; show "$out"
elif ! grep -q '^skipped steps: 0$' "$out" || ! grep -q '^final loss scale: 2e+38$' "$out"; then
  not_ok "1 growth near FLT_MAX" "steps were skipped or the final scale is not 2e+38"; show "$out"
else
  ok "1 growth that would overflow keeps the scale (2e+38 at steps 1..8, no skip)"
fi

# ---- 2. precision change on resume -------------------------------------------------------------------------------
# resume_case NAME FROM TO EXPECT_BANNER SCALE_JSON SCALE_CONSOLE: trains 4 steps in FROM (fp16 at a dynamic scale
# of 32768, others with their default policy), resumes to step 6 in TO.
resume_case() {
  local name=$1 from=$2 to=$3 banner=$4 scale=$5 console=$6 dir="$TMP/prec_$2_$3" first=()
  [ "$from" = fp16 ] && first=(--set precision.dynamic.init_scale=32768)
  timeout 120 "$AMPDIST" train --config "$CFG" --precision "$from" "${SMALL[@]}" --set train.steps=4 \
    "${first[@]}" --run-dir "$dir" >"$dir.first" 2>&1 ||
    { not_ok "$name" "first run failed"; show "$dir.first"; return; }
  # The resumed run has no precision.dynamic in its config: fp16's default policy (65536) applies.
  timeout 120 "$AMPDIST" train --config "$CFG" --precision "$to" "${SMALL[@]}" --set train.steps=6 \
    --run-dir "$dir" --resume auto >"$dir.out" 2>&1
  local rc=$? notes used
  notes=$(grep -c '^precision changed on resume: ' "$dir.out")
  used=$(json_field "$dir/metrics.jsonl" train 5 scale)
  if [ "$rc" -ne 0 ]; then
    not_ok "$name" "resumed run: exit $rc"; show "$dir.out"
  elif ! grep -q "| $to | $banner\$" "$dir.out"; then
    not_ok "$name" "banner does not end with '| $to | $banner'"; show "$dir.out"
  elif [ "$notes" -ne 1 ] || ! grep -q "^precision changed on resume: the checkpoint was trained in $from .* this run is $to: the loss scaler starts afresh with $banner\$" "$dir.out"; then
    not_ok "$name" "expected one line 'precision changed on resume: ... $from ... $to ... afresh with $banner'"
    show "$dir.out"
  elif [ "$used" != "$scale" ]; then
    not_ok "$name" "metrics.jsonl scale at the first resumed step (5) is $used, expected $scale"; show "$dir.out"
  elif [ "$(json_field "$dir/metrics.jsonl" resume 4 scaler_reset)" != True ]; then
    not_ok "$name" "no {type: resume, step: 4, scaler_reset: true} record"
  elif ! grep -q "^step      5/6 .* scale $console " "$dir.out"; then
    not_ok "$name" "the console's step 5 does not show scale $console"; show "$dir.out"
  else
    ok "$name (banner '$banner', one line, step 5 at scale $scale)"
  fi
}
resume_case "2a fp16 checkpoint resumed in bf16" fp16 bf16 "no loss scaling" 1.0 1
resume_case "2b bf16 checkpoint resumed in fp16" bf16 fp16 "dynamic loss scale 65536" 65536.0 65536

# Same precision: the saved scaler state is kept (the exact-resume contract), and no line is printed.
dir="$TMP/prec_same"
timeout 120 "$AMPDIST" train --config "$CFG" --precision fp16 "${SMALL[@]}" --set train.steps=4 \
  --set precision.dynamic.init_scale=32768 --run-dir "$dir" >/dev/null 2>&1
timeout 120 "$AMPDIST" train --config "$CFG" --precision fp16 "${SMALL[@]}" --set train.steps=6 \
  --set precision.dynamic.init_scale=32768 --run-dir "$dir" --resume auto >"$dir.out" 2>&1
if grep -q '^precision changed' "$dir.out" || [ "$(json_field "$dir/metrics.jsonl" train 5 scale)" != 32768.0 ]; then
  not_ok "2c same precision keeps the saved scaler" "a note was printed or step 5 did not run at 32768"; show "$dir.out"
else
  ok "2c same precision: the saved scaler state is kept, no note"
fi

# Same dtype, another loss-scale mode (fp16 dynamic -> fp16 static 1024): the scaler starts afresh, and the one line
# says that the loss scaling changed, not the precision.
dir="$TMP/prec_mode"
timeout 120 "$AMPDIST" train --config "$CFG" --precision fp16 "${SMALL[@]}" --set train.steps=4 --run-dir "$dir" \
  >/dev/null 2>&1
timeout 120 "$AMPDIST" train --config "$CFG" --precision fp16 "${SMALL[@]}" --set train.steps=6 \
  --set precision.static_scale.scale=1024 --run-dir "$dir" --resume auto >"$dir.out" 2>&1
if [ "$?" -ne 0 ] || grep -q '^precision changed' "$dir.out" ||
   [ "$(grep -c '^loss scaling changed on resume: the checkpoint was trained (fp16) with dynamic loss scale .*, this run uses static loss scale 1024, which starts afresh$' "$dir.out")" -ne 1 ]; then
  not_ok "2d fp16 dynamic resumed as fp16 static" "expected one 'loss scaling changed on resume' line and no 'precision changed'"
  show "$dir.out"
else
  ok "2d fp16 dynamic resumed as fp16 static: one line naming the loss scaling, not the precision"
fi

# ---- 3. a scaler-limit stop on 2 ranks: one line ---------------------------------------------------------------
# check_stop NAME OUT RC NEEDLE: exit 1, exactly one error line (from rank 0, without a rank prefix), NEEDLE in it.
check_stop() {
  local name=$1 out=$2 rc=$3 needle=$4 errors
  errors=$(grep -c 'ampdist: error:' "$out")
  if [ "$rc" -ne 1 ]; then
    not_ok "$name" "exit $rc, expected 1"; show "$out"
  elif [ "$errors" -ne 1 ]; then
    not_ok "$name" "$errors error lines, expected 1"; show "$out"
  elif ! grep 'ampdist: error:' "$out" | grep -Fq -- "$needle"; then
    not_ok "$name" "the error line does not name '$needle'"; show "$out"
  elif grep 'ampdist: error:' "$out" | grep -q '\[rank'; then
    not_ok "$name" "the agreed error carries a rank prefix"; show "$out"
  elif pgrep -f "$TMP" >/dev/null; then
    not_ok "$name" "processes left running"
  else
    ok "$name"
  fi
}
inject() {  # inject STEP...: a +inf in rank 1's gradient at each STEP
  local s f=""
  for s in "$@"; do f+="inject_nonfinite { step: $s rank: 1 element: 0 target: GRADIENT value: POS_INF } "; done
  echo "$f"
}
out="$TMP/skips.out"
AMPDIST_FAULT="$(inject 2 3 4)" "${MPIRUN[@]}" "$AMPDIST" train --config "$CFG" --precision fp16 "${SMALL[@]}" \
  --set train.steps=20 --set precision.max_consecutive_skips=3 --run-dir "$TMP/skips" >"$out" 2>&1
check_stop "3a max_consecutive_skips on 2 ranks: one line" "$out" $? "precision.max_consecutive_skips = 3"
out="$TMP/minscale.out"
AMPDIST_FAULT="$(inject 2 3)" "${MPIRUN[@]}" "$AMPDIST" train --config "$CFG" --precision fp16 "${SMALL[@]}" \
  --set train.steps=20 --set precision.dynamic.init_scale=4 --set precision.dynamic.min_scale=2 \
  --run-dir "$TMP/minscale" >"$out" 2>&1
check_stop "3b min_scale on 2 ranks: one line" "$out" $? "below precision.dynamic.min_scale = 2"

# ---- 4. --resume auto past train.steps -------------------------------------------------------------------------
dir="$TMP/past"
timeout 120 "$AMPDIST" train --config "$CFG" "${SMALL[@]}" --set train.steps=3 --run-dir "$dir" >/dev/null 2>&1
out="$dir.out"
timeout 120 "$AMPDIST" train --config "$CFG" "${SMALL[@]}" --set train.steps=1 --run-dir "$dir" --resume auto \
  >"$out" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
  not_ok "4 resume past train.steps" "exit $rc"; show "$out"
elif [ "$(grep -c '^warning: the checkpoint is at step 3 and this run ends at step 1 (train.steps): nothing to train' "$out")" -ne 1 ]; then
  not_ok "4 resume past train.steps" "expected one line saying the checkpoint is at step 3 and nothing is trained"
  show "$out"
elif ! grep -q '^eval  step      3 ' "$out"; then
  not_ok "4 resume past train.steps" "the evaluation is not labelled step 3 on the console"; show "$out"
elif [ "$(python3 -c 'import json,sys; print([json.loads(l)["step"] for l in open(sys.argv[1]) if json.loads(l)["type"]=="eval"][-1])' "$dir/metrics.jsonl")" != 3 ]; then
  not_ok "4 resume past train.steps" "the last eval record in metrics.jsonl is not at step 3"
elif ! grep -q '^samples/s: 0.0 (0 steps' "$out"; then
  not_ok "4 resume past train.steps" "steps were trained"; show "$out"
else
  ok "4 resume past train.steps: one warning line, evaluation labelled step 3, nothing trained"
fi

exit "$FAILED"

#!/usr/bin/env bash
# Observability of whole runs:
#  1. the main job (Fashion-MNIST MLP, 2 ranks, shortened) in fp32, fp16 and bf16 writes a TensorBoard event file
#     that TensorBoard's own reader loads, with every train/eval/phase scalar equal to metrics.jsonl
#     (check_tfevents.py); progress lines carry the phase breakdown; the fp16 run warns about its fp16 GEMM
#     dimensions (the 10 classes);
#  2. `ampdist report` lays the three runs in one self-contained page; headless Chromium renders it, and its DOM
#     and screenshot are checked against metrics.jsonl (check_report.py); skipped with a reason without chromium;
#  3. an injected overflow in one layer's activation (fault.inject_nonfinite target ACTIVATION) and one in a
#     gradient: the numerics report names the layer and the pass, in metrics.jsonl, on the console and in the report;
#  4. `ampdist bench` prints samples/s, every phase and "model FLOP utilisation: n/a";
#  5. `ampdist report` on a directory without metrics.jsonl: one error line naming the file, exit code 2.
# Usage: test_observability.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" observability "$@"

run() {  # run NP OUTFILE ARGS...
  local np=$1 out=$2
  shift 2
  timeout 600 mpirun -q --oversubscribe -np "$np" "$@" > "$out" 2>&1
}

PY=""
for candidate in "${AMPDIST_PYTHON:-}" "$(dirname "$AMPDIST")/pyenv/bin/python3" "$SRC/build/pyenv/bin/python3" \
  python3; do
  [ -n "$candidate" ] || continue
  if "$candidate" -c 'import tensorboard.backend.event_processing.event_accumulator' >/dev/null 2>&1; then
    PY=$candidate
    break
  fi
done
[ -n "$PY" ] && ok "python with tensorboard: $PY" ||
  not_ok "python with tensorboard" "no python imports tensorboard: run launch/setup/install_deps.sh"

# ---- 1. three precisions of the main job ---------------------------------------------------------------------
cfg="$SRC/configs/fashion_mnist_mlp.pbtxt"
for p in fp32 fp16 bf16; do
  if run 2 "$TMP/$p.txt" "$AMPDIST" train --config "$cfg" --precision "$p" --set train.steps=200 \
      --set log.every_steps=20 --set train.eval_every_steps=100 --set optimizer.schedule.warmup_steps=20 \
      --set checkpoint.save_final=false --run-dir "$TMP/main_$p"; then
    ok "main job $p on 2 ranks exits 0"
  else
    not_ok "main job $p" "exit code $?"
    show "$TMP/$p.txt"
  fi
  if [ -n "$PY" ]; then
    if "$PY" "$SRC/tests/e2e/check_tfevents.py" "$TMP/main_$p" > "$TMP/tb_$p.txt" 2>&1; then
      ok "event file of $p loads in TensorBoard's reader: $(cat "$TMP/tb_$p.txt")"
    else
      not_ok "event file of $p" "$(tail -1 "$TMP/tb_$p.txt")"
      show "$TMP/tb_$p.txt"
    fi
  fi
  n=$(grep -c '^phases (ms/step): data_wait [0-9.]*  forward [0-9.]*  backward [0-9.]*  comm_wait [0-9.]*  unscale_consensus [0-9.]*  optimizer [0-9.]*$' "$TMP/$p.txt")
  [ "$n" = 10 ] && ok "$p: a phase line after each of the 10 progress lines" ||
    { not_ok "$p phase lines" "$n phase lines, expected 10"; show "$TMP/$p.txt"; }
done
grep -q '^warning: fp16 GEMM dimensions not a multiple of 8 (fc3 out_features 10)' "$TMP/fp16.txt" &&
  ok "fp16 lint names fc3's 10 outputs" || { not_ok "fp16 lint" "no GEMM warning"; show "$TMP/fp16.txt"; }
grep -q '^warning: fp16 GEMM' "$TMP/fp32.txt" "$TMP/bf16.txt" &&
  not_ok "lint" "a fp16 GEMM warning in an fp32 or bf16 run" || ok "no fp16 GEMM warning for fp32 and bf16"

# ---- 2. the report in headless Chromium ------------------------------------------------------------------------
if "$AMPDIST" report "$TMP/main_fp32" "$TMP/main_fp16" "$TMP/main_bf16" -o "$TMP/report.html" > "$TMP/rep.txt" 2>&1
then
  ok "ampdist report of 3 runs exits 0"
else
  not_ok "ampdist report" "exit code $?"
  show "$TMP/rep.txt"
fi
if grep -Eq '<script|<link|src="http|href="http' "$TMP/report.html"; then
  not_ok "report is self-contained" "it refers to scripts or network resources"
else
  ok "report is self-contained (no script, no external resource)"
fi
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
  echo "ok - SKIP chromium checks: no chromium on PATH (Debian package chromium; launch/setup/install_deps.sh)"
else
  W=1280 H=2400
  # A private profile directory, so that runs in parallel and root's home do not matter.
  chrome=("$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$TMP/chrome")
  timeout 120 "${chrome[@]}" --window-size=$W,$H --screenshot="$TMP/report.png" "file://$TMP/report.html" \
    > "$TMP/shot.txt" 2>&1
  timeout 120 "${chrome[@]}" --dump-dom "file://$TMP/report.html" > "$TMP/dom.html" 2> "$TMP/dom.err"
  if [ -n "$PY" ] && "$PY" "$SRC/tests/e2e/check_report.py" "$TMP/dom.html" "$TMP/report.png" $W $H \
      "$TMP/main_fp32" "$TMP/main_fp16" "$TMP/main_bf16" > "$TMP/chk.txt" 2>&1; then
    ok "chromium renders the report: $(cat "$TMP/chk.txt")"
  else
    not_ok "report in chromium" "$(tail -1 "$TMP/chk.txt" 2>/dev/null)"
    show "$TMP/shot.txt"
    show "$TMP/dom.err"
  fi
fi

# ---- 3. injected overflow: the numerics report names the layer ----------------------------------------------
cat > "$TMP/syn.pbtxt" <<'PBTXT'
name: "numerics"
model { mlp { hidden: [64, 32] activation: RELU } }
data { synthetic { train_samples: 2048 test_samples: 256 features: 32 classes: 8 } global_batch_size: 64 }
optimizer { sgd { momentum: 0.9 } lr: 0.05 }
precision { dtype: FP16 dynamic { init_scale: 1024 } numerics_report_every: 10 }
train { steps: 30 }
log { every_steps: 10 }
PBTXT
if AMPDIST_FAULT='inject_nonfinite { step: 7 target: ACTIVATION layer: "fc2" element: 5 value: POS_INF rank: 1 }' \
    run 2 "$TMP/ovf.txt" "$AMPDIST" train --config "$TMP/syn.pbtxt" --run-dir "$TMP/ovf"; then
  ok "injected activation overflow run exits 0"
else
  not_ok "injected activation overflow run" "exit code $?"
  show "$TMP/ovf.txt"
fi
grep -qx 'numerics: step 7 first non-finite value in fc2 (forward)' "$TMP/ovf.txt" &&
  ok "console names fc2 (forward) at step 7" || { not_ok "console numerics line" "missing"; show "$TMP/ovf.txt"; }
python3 - "$TMP/ovf/metrics.jsonl" <<'PY' && ok "metrics.jsonl: numerics at steps 7 (fc2, forward), 10, 20, 30" ||
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
num = [r for r in rows if r["type"] == "numerics"]
assert [r["step"] for r in num] == [7, 10, 20, 30], [r["step"] for r in num]
first = num[0]
assert first["first_nonfinite"] == {"layer": "fc2", "pass": "forward"}, first.get("first_nonfinite")
layers = {l["name"]: l for l in first["layers"]}
assert list(layers) == ["fc1", "act1", "fc2", "act2", "fc3"], list(layers)
assert not layers["fc1"]["act_nonfinite"] and not layers["act1"]["act_nonfinite"], first
assert layers["fc2"]["act_nonfinite"] and layers["fc2"]["act_max"] is None, layers["fc2"]
assert all("first_nonfinite" not in r for r in num[1:]), num[1:]
for r in num[1:]:  # later, clean steps: finite maxima below fp16's max, headroom > 0
  for l in r["layers"]:
    assert l["act_max"] is not None and 0 < l["act_max"] < 65504 and l["headroom_bits"] > 0, l
    if l["name"].startswith("fc"):
      assert l["grad_max"] is not None and 0 <= l["grad_underflow_fraction"] <= 1, l
skipped = [r for r in rows if r["type"] == "summary"][0]["skipped_steps"]
assert skipped == 1, skipped
PY
  not_ok "metrics.jsonl numerics" "see above"
if AMPDIST_FAULT='inject_nonfinite { step: 4 target: GRADIENT element: 3000 value: QNAN }' \
    run 1 "$TMP/govf.txt" "$AMPDIST" train --config "$TMP/syn.pbtxt" --run-dir "$TMP/govf"; then
  # element 3000 of the flat gradient: fc1 has 32*64+64 = 2112 elements, so it lies in fc2.weight.
  grep -qx 'numerics: step 4 first non-finite value in fc2 (backward)' "$TMP/govf.txt" &&
    ok "gradient injection: fc2 (backward) at step 4" || { not_ok "gradient numerics line" "missing"; show "$TMP/govf.txt"; }
else
  not_ok "injected gradient overflow run" "exit code $?"
  show "$TMP/govf.txt"
fi
"$AMPDIST" report "$TMP/ovf" -o "$TMP/ovf.html" > /dev/null 2>&1 &&
  grep -q 'First non-finite value: layer <b>fc2</b> (forward pass) at step 7' "$TMP/ovf.html" &&
  ok "report names fc2 as the first non-finite layer" || not_ok "report numerics" "no first non-finite line"
# The one skipped step (7) shows as a marker on the loss-scale chart, at the log step that counted it (10).
grep -q '<path class="skip" data-run="ovf"[^>]*><title>ovf: 1 skipped step(s) by step 10</title>' "$TMP/ovf.html" &&
  ok "report marks the skipped step on the loss-scale chart" || not_ok "report skip marker" "none for step 10"
if AMPDIST_FAULT='inject_nonfinite { step: 2 target: ACTIVATION layer: "fc9" }' \
    run 1 "$TMP/badlayer.txt" "$AMPDIST" train --config "$TMP/syn.pbtxt" --run-dir "$TMP/badlayer"; then
  not_ok "unknown injection layer" "exit 0"
else
  code=$?
  grep -q 'fault.inject_nonfinite\[0\].layer: no layer named "fc9"' "$TMP/badlayer.txt" && [ "$code" = 2 ] &&
    ok "unknown injection layer: exit 2 naming the field" || { not_ok "unknown injection layer" "exit $code"; show "$TMP/badlayer.txt"; }
fi

# ---- 4. bench ------------------------------------------------------------------------------------------------
if run 2 "$TMP/bench.txt" "$AMPDIST" bench --config "$cfg" --precision fp16 --steps 30 --warmup 5; then
  missing=""
  for needle in '^samples/s: [0-9.]* (3840 samples' '^data_wait ' '^forward ' '^backward ' '^comm_wait ' \
      '^unscale_consensus ' '^optimizer ' '^step (wall) ' '^model FLOP utilisation: n/a'; do
    grep -q "$needle" "$TMP/bench.txt" || missing="$missing '$needle'"
  done
  [ -z "$missing" ] && ok "bench prints samples/s, the phases and MFU n/a" || { not_ok "bench output" "no$missing"; show "$TMP/bench.txt"; }
else
  not_ok "bench" "exit code $?"
  show "$TMP/bench.txt"
fi

# ---- 5. bad input -------------------------------------------------------------------------------------------
"$AMPDIST" report "$TMP/nowhere" -o "$TMP/x.html" > "$TMP/bad.txt" 2>&1
code=$?
if [ "$code" = 2 ] && [ "$(wc -l < "$TMP/bad.txt")" = 1 ] && grep -q "^ampdist: error: $TMP/nowhere/metrics.jsonl" "$TMP/bad.txt"
then
  ok "report of a missing run: one line naming metrics.jsonl, exit 2"
else
  not_ok "report of a missing run" "exit $code"
  show "$TMP/bad.txt"
fi
exit "$FAILED"

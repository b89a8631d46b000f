#!/usr/bin/env bash
# Conv nets as whole runs, on a small slice of Fashion-MNIST (the first 512 training and 256 test images, written as
# an IDX directory here, so that each run takes seconds on two cores):
#  1. configs/fashion_mnist_cnn.pbtxt on 2 ranks in bf16 trains (loss falls) and prints the weights hash;
#  2. resume is bitwise: 2 ranks, fp16, 12 steps straight vs 6 steps + --resume auto; the hash covers the BatchNorm
#     running statistics (model buffers), and so does the checkpoint;
#  3. configs/resnet18.pbtxt (small-image stem) on 2 ranks; `ampdist ckpt export` loads into
#     torchvision.models.resnet18 (conv1 a 3x3 conv on one channel, maxpool nn.Identity) with
#     load_state_dict(strict=True), and torchvision's evaluation gives ampdist's test accuracy;
#  4. on the GPU backend (skipped without a GPU): the CNN config trains 16 steps in bf16 on one rank (exit 0, loss
#     falls) in a build with cuDNN; a build without cuDNN refuses the model (exit 2).
# Usage: test_cnn.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" cnn "$@"

PY=""
for candidate in "${AMPDIST_PYTHON:-}" "$(dirname "$AMPDIST")/pyenv/bin/python3" "$SRC/build/pyenv/bin/python3" python3; do
  [ -n "$candidate" ] && "$candidate" -c 'import torch, torchvision, safetensors, numpy' 2>/dev/null && { PY=$candidate; break; }
done

run() {  # run NP OUT ARGS...
  local np=$1 out=$2
  shift 2
  timeout 400 mpirun -q --oversubscribe -np "$np" "$AMPDIST" train "$@" > "$out" 2>&1
}

# The slice of Fashion-MNIST as an IDX directory (the reader's layout).
FM="$TMP/fm"
fashion_mnist_slice "$FM" || { echo "not ok - setup: cannot write the IDX slice"; exit 1; }

# ---- 1. the CNN config, bf16, 2 ranks ------------------------------------------------------------------------------
cnn=(--config "$SRC/configs/fashion_mnist_cnn.pbtxt" --set data.idx.dir="$FM" --set data.global_batch_size=32
     --set log.every_steps=4 --set optimizer.schedule.warmup_steps=4)
if run 2 "$TMP/bf16.txt" "${cnn[@]}" --precision bf16 --set train.steps=16 --run-dir "$TMP/bf16"; then
  ok "fashion_mnist_cnn bf16 on 2 ranks exits 0"
else
  not_ok "fashion_mnist_cnn bf16" "exit $?: $(tail -3 "$TMP/bf16.txt")"
fi
python3 - "$TMP/bf16/metrics.jsonl" <<'PY' && ok "cnn: loss falls over 16 steps" || not_ok "cnn metrics" "see above"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in rows if r["type"] == "train"]
assert rows[0]["dtype"] == "bf16" and rows[0]["world_size"] == 2, rows[0]
# 16 Adam steps on 512 images take the loss from ~2.3 to well under 1.5 here; 0.8x is a loose bound.
assert train[-1]["loss"] < 0.8 * train[0]["loss"], [r["loss"] for r in train]
PY

# ---- 2. resume is bitwise, running statistics included ------------------------------------------------------------
# A constant schedule: the first half (train.steps=6) then has the same learning rates as the whole run.
common=("${cnn[@]}" --precision fp16 --set optimizer.schedule.kind=CONSTANT --set train.steps=12
        --set checkpoint.every_steps=6)
run 2 "$TMP/u.txt" "${common[@]}" --run-dir "$TMP/u" || not_ok "uninterrupted run" "exit $?: $(tail -2 "$TMP/u.txt")"
run 2 "$TMP/h.txt" "${common[@]}" --set train.steps=6 --run-dir "$TMP/r" || not_ok "first half" "exit $?"
run 2 "$TMP/r.txt" "${common[@]}" --run-dir "$TMP/r" --resume auto || not_ok "resume" "exit $?: $(tail -2 "$TMP/r.txt")"
h_u=$(hash_of "$TMP/u.txt")
h_r=$(hash_of "$TMP/r.txt")
if [ -n "$h_u" ] && [ "$h_u" = "$h_r" ]; then ok "resume from step 6 ends with the uninterrupted run's hash $h_u"; else
  not_ok "bitwise resume" "uninterrupted $h_u, resumed $h_r"; fi
"$AMPDIST" ckpt inspect "$TMP/u/checkpoints/step_00000012" > "$TMP/inspect.txt" 2>&1
# The checkpoint's hash (weights and buffers) is the hash the run printed.
grep -q "master weights hash: $h_u" "$TMP/inspect.txt" && ok "checkpoint hash covers the BatchNorm buffers" ||
  not_ok "checkpoint hash" "$(grep hash "$TMP/inspect.txt")"

# ---- 3. ResNet-18 export into torchvision -------------------------------------------------------------------------
if run 2 "$TMP/resnet.txt" --config "$SRC/configs/resnet18.pbtxt" --set data.idx.dir="$FM" \
    --set data.global_batch_size=32 --set train.steps=6 --set log.every_steps=3 --run-dir "$TMP/resnet"; then
  ok "resnet18 (small stem) on 2 ranks exits 0"
else
  not_ok "resnet18" "exit $?: $(tail -3 "$TMP/resnet.txt")"
fi
ST="$TMP/resnet.safetensors"
"$AMPDIST" ckpt export "$TMP/resnet/checkpoints/step_00000006" --format safetensors -o "$ST" > "$TMP/export.txt" 2>&1 &&
  ok "resnet18 export: $(cat "$TMP/export.txt")" || not_ok "export" "$(cat "$TMP/export.txt")"
if [ -z "$PY" ]; then
  not_ok "torchvision load" "no python with torch, torchvision, safetensors and numpy (launch/setup/install_deps.sh)"
else
  "$PY" - "$ST" "$TMP/resnet/metrics.jsonl" "$FM" <<'PY' && ok "torchvision resnet18 load_state_dict(strict=True) gives ampdist's test accuracy" || not_ok "torchvision load" "see above"
import gzip, json, struct, sys
import numpy as np, torch, torchvision
from safetensors.torch import load_file
st, metrics, fm = sys.argv[1:]
sd = load_file(st)
m = torchvision.models.resnet18(num_classes=10)
m.conv1 = torch.nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1, bias=False)
m.maxpool = torch.nn.Identity()
m.load_state_dict(sd, strict=True)
assert sd["bn1.num_batches_tracked"].dtype == torch.int64 and int(sd["bn1.num_batches_tracked"]) == 6
m.eval()
img = open(fm + "/t10k-images-idx3-ubyte", "rb").read()
n, rows, cols = struct.unpack(">III", img[4:16])
x = np.frombuffer(img[16:], dtype=np.uint8).reshape(n, 1, rows, cols).astype(np.float32)
x = (x / 255.0 - np.float32(0.2860)) / np.float32(0.3530)  # data.idx defaults
y = np.frombuffer(open(fm + "/t10k-labels-idx1-ubyte", "rb").read()[8:], dtype=np.uint8)
with torch.no_grad():
    pred = m(torch.from_numpy(x)).argmax(1).numpy()
correct = int((pred == y).sum())
ev = [json.loads(l) for l in open(metrics) if json.loads(l)["type"] == "eval"][-1]
ours = round(ev["test_accuracy"] * ev["test_samples"])
print(f"    torchvision: {correct}/{n} correct, ampdist: {ours}/{ev['test_samples']}")
# Both evaluate the same FP32 weights and statistics; only the order of FP32 sums differs, which can flip at most a
# near-tie: allow one sample of 256.
assert ev["test_samples"] == n and abs(correct - ours) <= 1, (correct, ours)
PY
fi

# ---- 4. the GPU backend ---------------------------------------------------------------------------------------------
timeout 300 "$AMPDIST" train "${cnn[@]}" --device cuda --precision bf16 --set train.steps=16 --run-dir "$TMP/gpu" \
  > "$TMP/gpu.txt" 2>&1
rc=$?
if grep -q "asks for the GPU, but" "$TMP/gpu.txt"; then
  echo "ok - # SKIP GPU run: no GPU visible"
elif grep -q "this build has no GPU convolutions" "$TMP/gpu.txt"; then
  [ $rc -eq 2 ] && ok "a build without cuDNN refuses model.cnn on the GPU (exit 2)" ||
    not_ok "GPU refusal" "exit $rc: $(head -3 "$TMP/gpu.txt")"
elif [ $rc -eq 0 ]; then
  python3 - "$TMP/gpu/metrics.jsonl" <<'PY' && ok "fashion_mnist_cnn bf16 on the GPU: loss falls over 16 steps" || not_ok "GPU cnn metrics" "see above"
import json, sys
train = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "train"]
assert train[-1]["loss"] < 0.8 * train[0]["loss"], [r["loss"] for r in train]  # as on the CPU above
PY
else
  not_ok "GPU cnn run" "exit $rc: $(tail -3 "$TMP/gpu.txt")"
fi
exit "$FAILED"

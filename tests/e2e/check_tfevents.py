#!/usr/bin/env python3
"""Reads a run directory's TensorBoard event file with TensorBoard's own reader and checks it against metrics.jsonl.

    check_tfevents.py RUN_DIR

The reader is the `tensorboard` package's EventAccumulator (tensorboard.backend.event_processing), which parses the
TFRecord framing (and checks its masked CRC32C) and the Event protos itself. Every "train" record of the last run
in metrics.jsonl must appear as scalars train/loss, train/lr, train/loss_scale, train/skipped_steps,
train/samples_per_s at its step, every "eval" record as eval/test_accuracy and eval/test_loss, and each phase of
"phase_ms" as phase/<name>_ms. Event values are float32, so they are compared with a relative tolerance of 1e-6
(float32 has a 2^-24 = 6e-8 relative rounding error; 1e-6 leaves room for it and nothing else).

Prints one line and exits 0 when everything holds; otherwise prints "FAIL: ..." and exits 1.
"""
import glob
import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def close(a, b):
    if a is None or b is None:
        return a is None and (b is None or not math.isfinite(b))
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30)


run_dir = sys.argv[1]
files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
if len(files) != 1:
    fail(f"{run_dir}: expected one events.out.tfevents.* file, found {files}")
rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
start = max(i for i, r in enumerate(rows) if r["type"] == "start")
rows = rows[start:]
train = [r for r in rows if r["type"] == "train"]
evals = [r for r in rows if r["type"] == "eval"]

acc = event_accumulator.EventAccumulator(files[0], size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
expected = {"train/loss", "train/lr", "train/loss_scale", "train/skipped_steps", "train/grad_norm",
            "train/samples_per_s", "memory/peak_rss_mb", "eval/test_accuracy", "eval/test_loss"}
if train and "phase_ms" in train[0]:
    expected |= {f"phase/{p}_ms" for p in train[0]["phase_ms"]}
missing = expected - tags
if missing:
    fail(f"tags missing from the event file: {sorted(missing)} (has {sorted(tags)})")


def values(tag):
    return {e.step: e.value for e in acc.Scalars(tag)}


checked = 0
pairs = [("train/loss", "loss"), ("train/lr", "lr"), ("train/loss_scale", "scale"),
         ("train/skipped_steps", "skipped_steps"), ("train/samples_per_s", "samples_per_s"),
         ("train/grad_norm", "grad_norm"), ("memory/peak_rss_mb", "peak_rss_mb")]
for tag, key in pairs:
    got = values(tag)
    if sorted(got) != [r["step"] for r in train]:
        fail(f"{tag}: steps {sorted(got)} != metrics.jsonl train steps {[r['step'] for r in train]}")
    for r in train:
        v = got[r["step"]]
        want = r[key]
        if want is None:
            if math.isfinite(v):
                fail(f"{tag} at step {r['step']}: {v}, metrics.jsonl says non-finite (null)")
        elif not close(v, want):
            fail(f"{tag} at step {r['step']}: {v} != {want}")
        checked += 1
for r in train:
    for p, ms in r.get("phase_ms", {}).items():
        v = values(f"phase/{p}_ms")[r["step"]]
        if not close(v, ms):
            fail(f"phase/{p}_ms at step {r['step']}: {v} != {ms}")
        checked += 1
for tag, key in [("eval/test_accuracy", "test_accuracy"), ("eval/test_loss", "test_loss")]:
    got = values(tag)
    for r in evals:
        if not close(got.get(r["step"]), r[key]):
            fail(f"{tag} at step {r['step']}: {got.get(r['step'])} != {r[key]}")
        checked += 1
print(f"ok: {os.path.basename(files[0])}: {len(tags)} tags, {checked} values equal to metrics.jsonl")

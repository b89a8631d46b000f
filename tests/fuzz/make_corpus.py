#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora, tests/fuzz/corpus/<target>/, from configs/ and tests/fuzz/data/.

    python3 tests/fuzz/make_corpus.py

Deterministic (gzip without a timestamp); the committed corpus is this script's output. The input formats (a flags
byte before the file for fuzz_idx and fuzz_checkpoint) are described at the top of each fuzz_*.cc.
tests/fuzz/data/ holds two tiny real checkpoints made by `ampdist train` on synthetic data with
--set model.mlp.hidden=[4] (8 features, 3 classes: 51 elements per buffer):
ckpt_sgd_1rank (1 rank, SGD with momentum) and ckpt_adamw_2ranks (mpirun -np 2, AdamW).
"""
import gzip
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")
DATA = os.path.join(HERE, "data")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(*parts):
    with open(os.path.join(*parts), "rb") as f:
        return f.read()


def gz(data):
    return gzip.compress(data, compresslevel=9, mtime=0)


# ---- fuzz_config: text-format configs; the first line doubles as a --set assignment ------------------------------
MAIN = read(ROOT, "configs", "fashion_mnist_mlp.pbtxt")
TINY = b"""name: "tiny"
model { mlp { hidden: [4] activation: RELU } }
data {
  synthetic { train_samples: 64 test_samples: 16 features: 8 classes: 3 noise: 0.5 }
  global_batch_size: 16
  eval_batch_size: 16
}
optimizer { sgd { momentum: 0.9 } lr: 0.05 schedule { kind: CONSTANT } }
precision { dtype: FP32 }
train { steps: 4 seed: 7 }
log { every_steps: 2 dir: "run" }
checkpoint { every_steps: 4 dir: "ck" keep_last: 1 }
"""
FULL = b"""name: "everything"
model { mlp { hidden: [64, 32] activation: GELU bias: false } }
data {
  idx { dir: "/usr/share/datasets/fashion-mnist" mean: 0.25 std: 0.5 }
  global_batch_size: 256 drop_last: false shuffle: false prefetch_steps: 4 eval_batch_size: 500
}
optimizer {
  adamw { beta1: 0.8 beta2: 0.99 eps: 1e-6 }
  lr: 3e-4 weight_decay: 0.01 clip_grad_norm: 1.0 accumulation_steps: 2
  schedule { kind: COSINE warmup_steps: 10 min_lr: 1e-5 total_steps: 1000 }
}
precision {
  dtype: FP16
  dynamic { init_scale: 1024 growth_factor: 2 backoff_factor: 0.5 growth_interval: 100 hysteresis: 2 min_scale: 1 }
  fp32_layers: "fc1" fp32_ops: ["softmax", "gelu"]
  on_nonfinite: DROP_RANK max_consecutive_skips: 10
}
comm { bucket_cap_mb: 1.5 reduce_dtype: BF16 mode: REDUCE_SCATTER timeout_s: 30 }
train { epochs: 2 eval_every_epochs: 1 eval_every_steps: 50 seed: 42 threads_per_rank: 1 }
log { dir: "runs/everything" every_steps: 10 metrics_jsonl: false }
checkpoint { dir: "ckpts" every_steps: 100 every_minutes: 5 keep_last: 0 save_final: false on_save_error: STOP }
fault {
  inject_nonfinite { step: 3 rank: 1 target: INPUT value: QNAN element: 7 }
  inject_nonfinite { step: 5 }
  crash_during_save { step: 100 rank: 1 }
  kill { step: 9 } stall { step: 4 seconds: 0.5 } save_error { step: 8 disk_full: false }
}
"""
BF16 = b"""model { mlp { } }
data { synthetic { } }
optimizer { sgd { momentum: 0.9 dampening: 0 nesterov: true } lr: 0.1 }
precision { dtype: BF16 static_scale { scale: 128 } }
comm { reduce_dtype: FP16 }
train { steps: 100 }
"""
write("fuzz_config", "fashion_mnist_mlp.pbtxt", MAIN)
write("fuzz_config", "tiny_synthetic_sgd.pbtxt", TINY)
write("fuzz_config", "everything_set.pbtxt", FULL)
write("fuzz_config", "bf16_static_linear.pbtxt", BF16)
write("fuzz_config", "bad_unknown_field.pbtxt", b"optimizer { lrr: 0.1 }\n")
write("fuzz_config", "bad_values.pbtxt", TINY.replace(b"lr: 0.05", b"lr: -1").replace(b"steps: 4", b"steps: -4"))
write("fuzz_config", "empty.pbtxt", b"")
for i, (assignment, base) in enumerate([
        (b"optimizer.lr=0.05", MAIN),
        (b"model.mlp.hidden=[512, 256]", TINY),
        (b"model.mlp.hidden=4", b""),
        (b"precision.dtype=BF16", FULL),
        (b"log.dir=runs/x", TINY),
        (b'name="quoted"', b""),
        (b"optimizer.adamw.beta2=0.95", MAIN),
        (b"data.synthetic.classes=2", TINY),
        (b"fault.kill.step=3", b""),
        (b"precision.fp32_ops=[linear, relu]", b""),
        (b"train.seed=18446744073709551615", b""),
        (b"checkpoint.on_save_error=STOP", b""),
        # A quoted string is spliced into the text format as it is: this one also sets train.steps (what the
        # opt-in AMPDIST_FUZZ_OVERRIDE_ORACLE=1 of fuzz_config reports).
        (b'log.dir="x" } train { steps: 7 } log { dir: "y"', TINY),
]):
    write("fuzz_config", "set_%02d.txt" % i, assignment + b"\n" + base)

# ---- fuzz_idx: flags byte (bit 0 labels, bit 1 open via the .gz fallback), then the file -----------------------
def idx_images(n, rows, cols, pixels):
    return struct.pack(">IIII", 0x803, n, rows, cols) + pixels


def idx_labels(n, labels):
    return struct.pack(">II", 0x801, n) + bytes(labels)


PIX = bytes((i * 37 + (i // 28) * 11) & 0xFF for i in range(3 * 28 * 28))
IMG = idx_images(3, 28, 28, PIX)
LAB = idx_labels(3, [0, 4, 9])
write("fuzz_idx", "images_3x28x28", b"\x00" + IMG)
write("fuzz_idx", "images_3x28x28_gzip", b"\x00" + gz(IMG))
write("fuzz_idx", "images_3x28x28_gz_fallback", b"\x02" + gz(IMG))
write("fuzz_idx", "images_3x2x3_small", b"\x00" + idx_images(3, 2, 3, bytes(range(18))))
write("fuzz_idx", "images_truncated", b"\x00" + IMG[: len(IMG) - 100])
write("fuzz_idx", "images_gzip_truncated", b"\x00" + gz(IMG)[:60])
write("fuzz_idx", "images_bad_magic", b"\x00" + struct.pack(">I", 0x801) + IMG[4:])
write("fuzz_idx", "images_zero_rows", b"\x00" + idx_images(3, 0, 28, b""))
write("fuzz_idx", "images_huge_count", b"\x00" + idx_images(0xFFFFFFFF, 4096, 4096, PIX[:64]))
write("fuzz_idx", "images_header_only", b"\x00" + IMG[:12])
write("fuzz_idx", "labels_3", b"\x01" + LAB)
write("fuzz_idx", "labels_3_gzip_fallback", b"\x03" + gz(LAB))
write("fuzz_idx", "labels_out_of_range", b"\x01" + idx_labels(3, [0, 10, 255]))
write("fuzz_idx", "labels_count_mismatch", b"\x01" + idx_labels(4, [1, 2, 3, 4]))
write("fuzz_idx", "labels_truncated", b"\x01" + idx_labels(3, [1]))
write("fuzz_idx", "labels_huge_count", b"\x01" + idx_labels(0xFFFFFFFF, [1, 2, 3]))

# ---- fuzz_checkpoint: flags byte (bits 0-1 mode, 2-3 reference, 4-7 numel delta / 16), then the file --------
def unwrap_manifest_file(data):
    """The Manifest bytes inside a ManifestFile (field 1, length-delimited), by hand: no protobuf for Python."""
    pos = 0
    while pos < len(data):
        tag, pos = varint(data, pos)
        if tag == (1 << 3) | 2:
            n, pos = varint(data, pos)
            return data[pos:pos + n]
        if tag & 7 == 0:
            _, pos = varint(data, pos)
        else:
            raise ValueError("unexpected field in ManifestFile")
    raise ValueError("no manifest field")


def varint(data, pos):
    v = shift = 0
    while True:
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, pos


A = os.path.join(DATA, "ckpt_sgd_1rank")
B = os.path.join(DATA, "ckpt_adamw_2ranks")
MA, MB = read(A, "manifest.pb"), read(B, "manifest.pb")
A0 = read(A, "shard_00000_of_00001.pb")
B0, B1 = read(B, "shard_00000_of_00002.pb"), read(B, "shard_00001_of_00002.pb")


def flags(mode, ref, v=0):
    """v: the signed nibble; the harness adds 16 * v to numel."""
    return bytes([mode | (ref << 2) | ((v & 0xF) << 4)])


write("fuzz_checkpoint", "m0_sgd_manifest", flags(0, 1) + MA)
write("fuzz_checkpoint", "m0_sgd_manifest_no_shards", flags(0, 0) + MA)
write("fuzz_checkpoint", "m0_adamw_manifest", flags(0, 2) + MB)
write("fuzz_checkpoint", "m0_adamw_manifest_all_shards", flags(0, 3) + MB)
write("fuzz_checkpoint", "m0_manifest_truncated", flags(0, 1) + MA[: len(MA) // 2])
write("fuzz_checkpoint", "m1_sgd_inner", flags(1, 1) + unwrap_manifest_file(MA))
write("fuzz_checkpoint", "m1_adamw_inner", flags(1, 2) + unwrap_manifest_file(MB))
write("fuzz_checkpoint", "m1_adamw_inner_sgd_shards", flags(1, 3) + unwrap_manifest_file(MB))
write("fuzz_checkpoint", "m2_sgd_shard0", flags(2, 1) + A0)
write("fuzz_checkpoint", "m2_adamw_shard1", flags(2, 3) + B1)
write("fuzz_checkpoint", "m3_sgd_shard0", flags(3, 1) + A0)
write("fuzz_checkpoint", "m3_sgd_shard0_numel_plus16", flags(3, 1, 1) + A0)
write("fuzz_checkpoint", "m3_sgd_shard0_numel_minus16", flags(3, 1, -1) + A0)
write("fuzz_checkpoint", "m3_adamw_shard0", flags(3, 2) + B0)
write("fuzz_checkpoint", "m3_adamw_shard1", flags(3, 3) + B1)
write("fuzz_checkpoint", "m3_shard_truncated", flags(3, 1) + A0[:200])

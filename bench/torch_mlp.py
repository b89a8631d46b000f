#!/usr/bin/env python3
"""The PyTorch reference for bench/run_all.sh: the main job (configs/fashion_mnist_mlp.pbtxt) in PyTorch.

Same model (Linear 784-512-256-10 with ReLU), same global batch (128, split over ranks), same optimizer
(SGD, momentum 0.9, Nesterov, weight decay 1e-4, global-norm clipping at 5, warm-up + cosine LR), same threads per
rank, same data (Fashion-MNIST IDX files, normalised with the same mean and std, shuffled each epoch).

  /usr/bin/python3 bench/torch_mlp.py --precision fp32 --threads 2 --json out.json
  # 2 ranks, DDP over gloo, env:// rendezvous on localhost (bench/run_all.sh starts the two processes):
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 /usr/bin/python3 bench/torch_mlp.py ... &
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 /usr/bin/python3 bench/torch_mlp.py ...

bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16), as PyTorch's CPU AMP does; the
master weights and the optimizer stay FP32 and no loss scaling is needed. fp16 (PyTorch 2.3 and later) runs under
torch.autocast("cpu", dtype=torch.float16) with torch.amp.GradScaler("cpu"). --synthetic F replaces Fashion-MNIST
by Gaussian data of F features and 10 classes (bench/configs/mlp_100m.pbtxt: --synthetic 4096 --hidden
4096,4096,4096,4096,4096,4096 --global-batch 256 --lr 0.01). The JSON adds peak_rss_bytes (this rank's VmHWM).
Measured: `repeat` windows of `steps` optimizer steps after `warmup` steps, each window from a barrier, the time
the maximum over ranks; samples/s = steps x global batch / time. Rank 0 prints one JSON object.
"""
import argparse
import faulthandler
import gzip
import json
import math
import os
import resource
import signal
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(dirname, stem):
    for name in (stem, stem + ".gz"):
        p = os.path.join(dirname, name)
        if os.path.exists(p):
            return p
    sys.exit(f"torch_mlp.py: {dirname}: no {stem} or {stem}.gz")


def main():
    # bench/run_all.sh ends a hung rank with SIGTERM: print where every thread is, then its SIGKILL follows.
    faulthandler.register(signal.SIGTERM, all_threads=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--synthetic", type=int, default=0, help="Gaussian data of this many features, 10 classes")
    ap.add_argument("--threads", type=int, required=True, help="torch threads per rank")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--hidden", default="512,256")
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    if args.global_batch % world:
        sys.exit(f"torch_mlp.py: --global-batch {args.global_batch} is not divisible by {world} ranks")
    micro = args.global_batch // world

    if args.synthetic > 0:
        g0 = torch.Generator().manual_seed(99)
        n = 2048
        x_all = torch.randn(n, args.synthetic, generator=g0)
        y_all = torch.randint(0, 10, (n,), generator=g0)
    else:
        images = read_idx(find(args.data, "train-images-idx3-ubyte"))
        labels = read_idx(find(args.data, "train-labels-idx1-ubyte")).astype(np.int64)
        # The IdxDataset's normalisation: (x / 255 - mean) / std with the Fashion-MNIST training-set statistics.
        x_all = torch.from_numpy(((images.reshape(len(images), -1).astype(np.float32) / 255.0) - 0.2860) / 0.3530)
        y_all = torch.from_numpy(labels)
        n = len(x_all)

    widths = [x_all.shape[1]] + [int(h) for h in args.hidden.split(",")] + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=1e-4)
    total = args.warmup + args.steps * args.repeat
    warm = 200

    def lr_at(step):  # linear warm-up, then cosine to 0 over the run (the config's COSINE schedule)
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    scaler = torch.amp.GradScaler("cpu") if args.precision == "fp16" else None
    loss_fn = torch.nn.CrossEntropyLoss()
    steps_per_epoch = n // args.global_batch
    gen = torch.Generator().manual_seed(1234)
    perm = torch.randperm(n, generator=gen)
    pos = 0

    def step():
        nonlocal perm, pos
        if pos == steps_per_epoch:
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos * args.global_batch + rank * micro: pos * args.global_batch + (rank + 1) * micro]
        pos += 1
        x, y = x_all[idx], y_all[idx]
        opt.zero_grad(set_to_none=True)
        if args.precision in ("bf16", "fp16"):
            with torch.autocast("cpu", dtype=torch.bfloat16 if args.precision == "bf16" else torch.float16):
                loss = loss_fn(model(x), y)
        else:
            loss = loss_fn(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
        sched.step()
        return loss

    def max_over_ranks(t):
        if world == 1:
            return t
        v = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return v.item()

    for _ in range(args.warmup):
        step()
    rates, windows = [], []
    for _ in range(args.repeat):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        loss.item()
        t = max_over_ranks(time.perf_counter() - t0)
        windows.append(t)
        rates.append(args.steps * args.global_batch / t)
    if rank == 0:
        out = {"torch_version": torch.__version__, "precision": args.precision, "world_size": world,
               "threads_per_rank": torch.get_num_threads(), "global_batch": args.global_batch,
               "warmup": args.warmup, "steps": args.steps, "repeat": args.repeat, "samples_per_s": rates,
               "samples_per_s_median": float(np.median(rates)),
               "step_s_median": float(np.median(windows)) / args.steps, "final_loss": float(loss.item()),
               "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        text = json.dumps(out, indent=2)
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if world > 1:
        # Both ranks are done once past this barrier. Then leave without tearing the gloo group and DDP down:
        # torch 1.13's destructors can block forever once the peer has exited (seen: a rank stuck after main()
        # returned, 1 run in about 6).
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()

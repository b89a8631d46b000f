#!/usr/bin/env python3
"""The PyTorch reference for bench/run_resnet.sh: the AMP tutorials' benchmark, torchvision's ResNet-18.

10 classes, Adam lr 1e-3, synthetic 3 x 224 x 224 inputs (random normal, random labels), a global batch split over
ranks (DDP over gloo on 2 ranks), FP32 or torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch's CPU AMP; fp16
autocast on the CPU needs PyTorch 2.3 or later, and this prints {"unsupported": ...} then). Measured: `steps`
optimizer steps after `warmup` steps, from a barrier; images/s = steps x global batch / time (max over ranks).

  python3 bench/torch_resnet.py --precision bf16 --threads 2 --batch 32
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29521 python3 bench/torch_resnet.py ... &  (and RANK=1)
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torchvision


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--batch", type=int, default=32, help="global batch")
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.precision == "fp16" and not hasattr(torch, "get_autocast_dtype"):
        if rank == 0:
            print(json.dumps({"precision": "fp16", "unsupported": f"torch {torch.__version__} has no CPU fp16 autocast"}))
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    micro = args.batch // world
    model = torchvision.models.resnet18(num_classes=10)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(micro, 3, args.image, args.image)
    y = torch.randint(0, 10, (micro,))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)

    def step():
        opt.zero_grad(set_to_none=True)
        if dtype is None:
            loss = loss_fn(model(x), y)
        else:
            with torch.autocast("cpu", dtype=dtype):
                loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if world > 1:
        dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"precision": args.precision, "ranks": world, "threads": args.threads,
                          "global_batch": args.batch, "steps": args.steps, "seconds": dt,
                          "images_per_s": args.steps * args.batch / dt, "torch": torch.__version__,
                          "torchvision": torchvision.__version__}))
    if world > 1:
        # Both ranks are done once past this barrier; leave without tearing gloo and DDP down (that teardown can
        # hang a rank whose peer has already exited, as bench/torch_gpt.py found).
        sys.stdout.flush()
        dist.barrier()
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

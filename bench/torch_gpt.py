#!/usr/bin/env python3
"""The PyTorch reference for bench/run_all.sh's GPT rows: ampdist's GPT (runtime/nn/gpt.h) in PyTorch.

Same model as `model { gpt { ... } }`: token + position embedding, n_layer pre-LayerNorm blocks (causal multi-head
attention through torch.nn.functional.scaled_dot_product_attention, GELU-tanh MLP of 4 n_embd), final LayerNorm, LM
head tied to the token embedding, no dropout; the same optimizer (AdamW, global-norm clipping, warm-up + cosine),
the same global batch of windows of seq_len + 1 bytes of the fortunes text, split over ranks, the same threads per
rank. The shape comes from the ampdist config given with --config (its gpt, data.global_batch_size and optimizer
fields are read from the text format with a few regular expressions; nothing else in it is used).

  python3 bench/torch_gpt.py --config bench/configs/gpt2_small_shaped.pbtxt --precision bf16 --threads 2 --json o.json
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 python3 bench/torch_gpt.py ... &   # DDP over gloo

bf16/fp16 run forward and loss under torch.autocast("cpu", dtype=...), fp16 with torch.amp.GradScaler("cpu").
Measured as bench/torch_mlp.py measures: `repeat` windows of `steps` optimizer steps after `warmup`, each window
from a barrier, its time the maximum over ranks. Rank 0 prints one JSON object, with the peak RSS (VmHWM) of the
rank that peaked highest.
"""
import argparse
import faulthandler
import glob
import json
import math
import os
import re
import resource
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F


def field(text, name, default=None, cast=float):
    m = re.search(r"\b" + name + r"\s*:\s*([-+0-9.eE]+|true|false)", text)
    if not m:
        if default is None:
            sys.exit(f"torch_gpt.py: the config has no {name}")
        return default
    v = m.group(1)
    if v in ("true", "false"):
        return v == "true"
    return cast(v)


class Block(torch.nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1 = torch.nn.LayerNorm(c)
        self.c_attn = torch.nn.Linear(c, 3 * c)
        self.c_proj = torch.nn.Linear(c, c)
        self.ln_2 = torch.nn.LayerNorm(c)
        self.c_fc = torch.nn.Linear(c, 4 * c)
        self.mlp_proj = torch.nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (Debian's 1.13, the QUICK smoke run): the same product, spelled out
            s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            y = torch.softmax(s.float(), dim=-1).to(v.dtype) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, n_layer, n_head, n_embd, seq_len, vocab):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, n_embd)
        self.wpe = torch.nn.Embedding(seq_len, n_embd)
        self.blocks = torch.nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = torch.nn.LayerNorm(n_embd)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied LM head


def read_corpus(paths):
    data = bytearray()
    for p in paths:
        files = sorted(glob.glob(os.path.join(p, "*"))) if os.path.isdir(p) else [p]
        for f in files:
            if os.path.isfile(f) and not f.endswith(".dat") and not os.path.islink(f):
                with open(f, "rb") as fh:
                    data += fh.read()
    return np.frombuffer(bytes(data), dtype=np.uint8)


def main():
    # bench/run_all.sh ends a hung rank with SIGTERM: print where every thread is, then its SIGKILL follows.
    faulthandler.register(signal.SIGTERM, all_threads=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="ampdist config with model { gpt { ... } }")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--threads", type=int, required=True, help="torch threads per rank")
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    text = open(args.config).read()
    n_layer, n_head = field(text, "n_layer", cast=int), field(text, "n_head", cast=int)
    n_embd, seq_len = field(text, "n_embd", cast=int), field(text, "seq_len", cast=int)
    vocab = field(text, "vocab_size", 256, int)
    global_batch = field(text, "global_batch_size", cast=int)
    lr, wd = field(text, "lr", 3e-4), field(text, "weight_decay", 0.0)
    beta1, beta2 = field(text, "beta1", 0.9), field(text, "beta2", 0.999)
    clip, warm = field(text, "clip_grad_norm", 1.0), field(text, "warmup_steps", 0, int)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    if global_batch % world:
        sys.exit(f"torch_gpt.py: global_batch_size {global_batch} is not divisible by {world} ranks")
    micro = global_batch // world

    corpus = torch.from_numpy(read_corpus([args.corpus]).astype(np.int64) % vocab)
    model = Gpt(n_layer, n_head, n_embd, seq_len, vocab)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(beta1, beta2), weight_decay=wd)
    total = args.warmup + args.steps * args.repeat

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    scaler = torch.amp.GradScaler("cpu") if args.precision == "fp16" else None
    gen = torch.Generator().manual_seed(1234 + rank)
    n_windows = len(corpus) - seq_len - 1

    def step():
        starts = torch.randint(0, n_windows, (micro,), generator=gen)
        win = torch.stack([corpus[s:s + seq_len + 1] for s in starts.tolist()])
        x, y = win[:, :-1], win[:, 1:]
        opt.zero_grad(set_to_none=True)
        if args.precision in ("bf16", "fp16"):
            with torch.autocast("cpu", dtype=torch.bfloat16 if args.precision == "bf16" else torch.float16):
                loss = F.cross_entropy(model(x).reshape(-1, vocab).float(), y.reshape(-1))
        else:
            loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
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
        rates.append(args.steps * global_batch / t)
    peak = max_over_ranks(float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
    if rank == 0:
        out = {"torch_version": torch.__version__, "precision": args.precision, "world_size": world,
               "threads_per_rank": torch.get_num_threads(), "global_batch": global_batch,
               "model": {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "seq_len": seq_len,
                         "vocab_size": vocab},
               "warmup": args.warmup, "steps": args.steps, "repeat": args.repeat, "samples_per_s": rates,
               "samples_per_s_median": float(np.median(rates)),
               "step_s_median": float(np.median(windows)) / args.steps, "final_loss": float(loss.item()),
               "peak_rss_bytes": int(peak)}
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

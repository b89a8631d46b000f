#!/usr/bin/env python3
"""The Hugging Face side of tests/e2e/test_hf_gpt2.sh (transformers' GPT2LMHeadModel, on the CPU, FP32).

  hf_gpt2.py make DIR --vocab V --layers L --heads H --embd C --positions T [--untied] [--seed S]
             [--shard-bytes N] [--fp16]
      A random GPT-2 saved with save_pretrained (safetensors; sharded with an index when --shard-bytes is given;
      its weights in fp16 with --fp16). Every weight, LayerNorm gains and biases included, is drawn at random, so a
      transposed, swapped or zeroed tensor shows in the loss.
  hf_gpt2.py tokens FILE --vocab V --count N [--seed S]
      An llm.c token file (256 int32 header: magic 20240520, version 1, count, vocab; uint16 tokens) of a
      deterministic pattern with noise, which a model can learn (t[i+1] = (3 t[i] + 7) mod V, or a random token with
      probability 1/8).
  hf_gpt2.py loss DIR FILE --seq-len T
      The mean over the file's windows (window i = tokens [i T, i T + T + 1), as ampdist's validation windows) of
      each window's mean next-token cross-entropy, in FP32 as transformers computes it; printed with 9 digits.
  hf_gpt2.py compare DIR_A DIR_B [--vocab V]
      Loads both with from_pretrained and prints the largest |logit difference| over 4 random windows.
  hf_gpt2.py edit SRC DST ACTION NAME
      A copy of the safetensors file SRC with one tensor removed (drop), given another shape (reshape: its first
      dimension one shorter) or added (add: a [2] tensor NAME).
"""
import argparse
import struct
import sys

import numpy as np
import torch


def cmd_make(a):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(a.seed)
    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.positions, n_embd=a.embd, n_layer=a.layers, n_head=a.heads,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=not a.untied,
                     bos_token_id=a.vocab - 1, eos_token_id=a.vocab - 1)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    if a.fp16:
        model = model.half()
    kw = {"safe_serialization": True}
    if a.shard_bytes:
        kw["max_shard_size"] = a.shard_bytes
    model.save_pretrained(a.dir, **kw)


def cmd_tokens(a):
    rng = np.random.default_rng(a.seed)
    t = np.empty(a.count, dtype=np.uint16)
    t[0] = 1
    noise = rng.integers(0, a.vocab, a.count)
    flip = rng.integers(0, 8, a.count) == 0
    for i in range(1, a.count):
        t[i] = noise[i] if flip[i] else (3 * int(t[i - 1]) + 7) % a.vocab
    header = np.zeros(256, dtype=np.int32)
    header[:4] = [20240520, 1, a.count, a.vocab]
    with open(a.file, "wb") as f:
        f.write(header.tobytes())
        f.write(t.tobytes())


def read_tokens(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240520 and header[1] == 1, path
        return np.frombuffer(f.read(), dtype=np.uint16)[: header[2]].astype(np.int64)


def cmd_loss(a):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(a.dir, torch_dtype=torch.float32).eval()
    tok = read_tokens(a.file)
    T = a.seq_len
    n = (len(tok) - T - 1) // T + 1
    losses = []
    with torch.no_grad():
        for i in range(n):
            w = torch.from_numpy(tok[i * T: i * T + T + 1]).unsqueeze(0)
            logits = model(w[:, :-1]).logits[0].float()
            losses.append(float(torch.nn.functional.cross_entropy(logits, w[0, 1:], reduction="mean")))
    print(f"{sum(losses) / n:.9f} {n}")


def cmd_compare(a):
    from transformers import GPT2LMHeadModel

    ma = GPT2LMHeadModel.from_pretrained(a.a, torch_dtype=torch.float32).eval()
    mb = GPT2LMHeadModel.from_pretrained(a.b, torch_dtype=torch.float32).eval()
    if ma.config.vocab_size != mb.config.vocab_size:
        sys.exit(f"vocab sizes differ: {ma.config.vocab_size} vs {mb.config.vocab_size}")
    g = torch.Generator().manual_seed(5)
    T = min(ma.config.n_positions, 16)
    x = torch.randint(0, ma.config.vocab_size, (4, T), generator=g)
    with torch.no_grad():
        la, lb = ma(x).logits, mb(x).logits
    print(f"{float((la - lb).abs().max()):.3e} {tuple(la.shape)}")


def cmd_edit(a):
    from safetensors.numpy import load_file, save_file

    t = load_file(a.src)
    if a.action == "drop":
        del t[a.name]
    elif a.action == "reshape":
        t[a.name] = t[a.name][:-1].copy()
    elif a.action == "add":
        t[a.name] = np.zeros(2, dtype=np.float32)
    save_file(t, a.dst, metadata={"format": "pt"})


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    for k in ("vocab", "layers", "heads", "embd", "positions"):
        m.add_argument("--" + k, type=int, required=True)
    m.add_argument("--untied", action="store_true")
    m.add_argument("--fp16", action="store_true")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--shard-bytes", type=int, default=0)
    t = sub.add_parser("tokens")
    t.add_argument("file")
    t.add_argument("--vocab", type=int, required=True)
    t.add_argument("--count", type=int, required=True)
    t.add_argument("--seed", type=int, default=1)
    lo = sub.add_parser("loss")
    lo.add_argument("dir")
    lo.add_argument("file")
    lo.add_argument("--seq-len", type=int, required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    e = sub.add_parser("edit")
    e.add_argument("src")
    e.add_argument("dst")
    e.add_argument("action", choices=["drop", "reshape", "add"])
    e.add_argument("name")
    a = p.parse_args()
    {"make": cmd_make, "tokens": cmd_tokens, "loss": cmd_loss, "compare": cmd_compare, "edit": cmd_edit}[a.cmd](a)


if __name__ == "__main__":
    main()

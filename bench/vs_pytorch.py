#!/usr/bin/python3
"""Side by side, in one run: strata versus PyTorch eager, one thread each.

1. inputs/bench-gpt.toml (4 layers, d_model 256, 4 heads, seq 128, batch 8,
   vocab 256, AdamW): training tokens/s of strata and of the same GPT in
   PyTorch eager (float32, torch.optim.AdamW). Target: strata >= 1.5x.
2. inputs/bench-gemm.toml (d_model 1024): strata's step FLOP rate against the
   sgemm rate it measures at start-up on the same thread (its MFU).
   Target: >= 60%.

Rounds alternate strata and PyTorch so machine noise hits both; each side's
best round counts. Run from the repository root after building:
    /usr/bin/python3 bench/vs_pytorch.py [--rounds 2]
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

import h5py
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def strata_run(deck, out):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([os.path.join(ROOT, "build", "strata"), "run", os.path.join(ROOT, "inputs", deck),
                    "--output", out, "--set", "run.log_every=0"], check=True, env=env, stdout=subprocess.DEVNULL)
    with h5py.File(out, "r") as f:
        return {k: float(f["summary"][k][()]) for k in ("tokens_per_s", "mfu", "flops_per_s", "peak_flops")}


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(C, 2))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(C // self.NH)).masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, L, C, NH, V, T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.register_buffer("mask", ~torch.ones(T, T, dtype=torch.bool).tril())

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def torch_tokens_per_s(L=4, C=256, NH=4, V=256, T=128, B=8, steps=20, warmup=3):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Gpt(L, C, NH, V, T)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    times = []
    for s in range(steps + warmup):
        idx = torch.randint(0, V, (B, T))
        tgt = torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(idx, tgt).backward()
        opt.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    return B * T / times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="strata-bench-")
    s_best = t_best = 0.0
    for r in range(a.rounds):
        s = strata_run("bench-gpt.toml", os.path.join(tmp, f"gpt{r}.h5"))["tokens_per_s"]
        t = torch_tokens_per_s()
        print(f"round {r}: strata {s:9.0f} tokens/s   pytorch {torch.__version__} eager {t:9.0f} tokens/s")
        s_best, t_best = max(s_best, s), max(t_best, t)
    ratio = s_best / t_best
    print(f"bench-gpt: strata / pytorch = {ratio:.2f}x (target >= 1.5x)")
    g = max((strata_run("bench-gemm.toml", os.path.join(tmp, f"gemm{r}.h5")) for r in range(a.rounds)),
            key=lambda x: x["mfu"])
    print(f"bench-gemm: step {g['flops_per_s'] / 1e9:.1f} GFLOP/s vs sgemm {g['peak_flops'] / 1e9:.1f} GFLOP/s "
          f"= {100 * g['mfu']:.1f}% (target >= 60%)")
    return 0 if ratio >= 1.5 and g["mfu"] >= 0.6 else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""PyTorch parity for strata's GPT, dense and Mixture-of-Experts.

Builds the same GPT in PyTorch (float64, the reference), loads strata's
initial weights from the export tool's HDF5 file, and checks on the same
batches: the step-0 loss and every parameter gradient, then a short AdamW
run (gradient accumulation, clipping, cosine schedule with warm-up) through
strata's real trainer: per-step loss, gradient norm and the final weights.

usage: test_pytorch_parity.py STRATA_EXPORT_GPT WORKDIR
"""
import math
import os
import subprocess
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
TOL = 1e-4  # relative error bound for fp32 strata against the float64 reference
# The final weights, after several AdamW steps: Adam divides each gradient
# element by its own running scale, so the fp32 rounding of small gradient
# elements becomes updates of a size set by the learning rate. How large that
# floor is depends on the build's order of operations: measured up to 2.7e-5
# at -O2 and 1.05e-4 at -O0 (the sanitizer build's sequential sums), on MoE
# blocks. A defect (a wrong gradient term, a token lost or counted twice)
# moves a tensor by 1e-2 or more; the bound sits a decade above the floor of
# either build and a decade below that.
FINAL_TOL = 1e-3


def load(h5, group):
    return {name: torch.tensor(np.asarray(ds[...]).reshape(tuple(ds.attrs["shape"])), dtype=torch.float64)
            for name, ds in h5[group].items()}


def parse_config(text):
    if isinstance(text, bytes):
        text = text.decode()
    cfg, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line:
            k, v = (x.strip() for x in line.split("=", 1))
            cfg[f"{section}.{k}"] = v.strip('"')
    return cfg


class Gpt:
    """The GPT of models/gpt/gpt.cpp, written with torch ops over named tensors.
    With `moe` (a dict of the deck's moe_* keys), every moe_every-th block's
    MLP is the Mixture-of-Experts layer of models/moe.cpp, its routing
    written here from the same rules."""

    def __init__(self, params, layers, heads, moe=None):
        self.p, self.L, self.NH, self.moe = params, layers, heads, moe
        self.dropped = 0  # MoE assignments past capacity, over every forward

    def is_moe(self, l):
        return self.moe is not None and l % self.moe["every"] == self.moe["every"] - 1

    def moe_mlp(self, h, l):
        """Returns the MoE output [B, T, C] and the auxiliary loss. The group
        is the micro-batch: its B x T rows in batch-major order."""
        p = lambda n: self.p[f"h.{l}.moe.{n}"]
        m = self.moe
        B, T, C = h.shape
        x = h.reshape(B * T, C)
        N, E, K = B * T, m["experts"], m["top_k"]
        probs = (x @ p("router.weight").T).softmax(dim=-1)
        # Top-k, ties to the lower index (a stable sort of -p), and the gates.
        order = torch.sort(-probs.detach(), dim=-1, stable=True).indices[:, :K]
        top = probs.gather(1, order)
        gates = top / top.sum(dim=-1, keepdim=True) if m["renormalize"] else top
        cap = N if not m["drop"] else min(N, math.ceil(m["capacity"] * N * K / E))
        count = [0] * E
        kept = torch.zeros(N, K, dtype=torch.bool)
        for j in range(K):  # every token's first choice, then every second
            for t in range(N):
                e = int(order[t, j])
                if count[e] < cap:
                    kept[t, j] = True
                    count[e] += 1
                else:
                    self.dropped += 1
        y = torch.zeros(N, C, dtype=h.dtype)
        for e in range(E):
            t_idx, j_idx = torch.nonzero((order == e) & kept, as_tuple=True)
            if len(t_idx) == 0:
                continue
            hid = F.gelu(x[t_idx] @ p("experts.fc.weight")[e].T + p("experts.fc.bias")[e], approximate="tanh")
            out = hid @ p("experts.proj.weight")[e].T + p("experts.proj.bias")[e]
            y = y.index_add(0, t_idx, gates[t_idx, j_idx].unsqueeze(1) * out)
        f = F.one_hot(order[:, 0], E).to(h.dtype).mean(dim=0)
        aux = m["aux_coef"] * E * (f * probs.mean(dim=0)).sum()
        return y.reshape(B, T, C), aux

    def block(self, x, l):
        p = lambda n: self.p[f"h.{l}.{n}"]
        B, T, C = x.shape
        hs = C // self.NH
        h = F.layer_norm(x, (C,), p("ln1.weight"), p("ln1.bias"), 1e-5)
        qkv = F.linear(h, p("attn.qkv.weight"), p("attn.qkv.bias"))
        q, k, v = (t.view(B, T, self.NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p("attn.proj.weight"), p("attn.proj.bias"))
        h = F.layer_norm(x, (C,), p("ln2.weight"), p("ln2.bias"), 1e-5)
        if self.is_moe(l):
            y, aux = self.moe_mlp(h, l)
            return x + y, aux
        h = F.gelu(F.linear(h, p("mlp.fc.weight"), p("mlp.fc.bias")), approximate="tanh")
        return x + F.linear(h, p("mlp.proj.weight"), p("mlp.proj.bias")), 0.0

    def loss(self, tokens, targets):
        """Cross-entropy of one micro-batch plus its MoE auxiliary losses."""
        T = tokens.shape[1]
        x = self.p["wte"][tokens] + self.p["wpe"][:T]
        aux = 0.0
        for l in range(self.L):
            x, a = self.block(x, l)
            aux = aux + a
        x = F.layer_norm(x, (x.shape[-1],), self.p["lnf.weight"], self.p["lnf.bias"], 1e-5)
        logits = x @ self.p["wte"].T
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)) + aux


def rel(a, b):
    return float((a - b).norm() / max(b.norm(), 1e-30))


def main():
    tool, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    failures = []
    # The dense GPT, then a MoE GPT (4 experts in every other block, top-2,
    # a capacity that drops some assignments, the auxiliary loss on).
    run_case(tool, os.path.join(work, "export.h5"), [], failures)
    run_case(tool, os.path.join(work, "export-moe.h5"),
             ['model.kind="moe"', "model.moe_experts=4", "model.moe_every=2", "model.moe_top_k=2",
              "model.moe_capacity_factor=1.0", "model.moe_aux_coef=0.05"], failures)
    print(f"{len(failures)} failed" if failures else "all parity checks passed")
    return 1 if failures else 0


def run_case(tool, out, sets, failures):
    subprocess.run([tool, out, *sets], check=True)
    case = "moe: " if sets else ""

    def check(what, err, bound=TOL):
        ok = err <= bound
        print(f"{'ok  ' if ok else 'FAIL'} {case + what:<50} err {err:.2e} (bound {bound:.0e})")
        if not ok:
            failures.append(case + what)

    with h5py.File(out, "r") as h5:
        cfg = parse_config(h5.attrs["resolved_config"])
        init, final = load(h5, "/initial"), load(h5, "/final")
        tokens = torch.tensor(np.asarray(h5["/batches/tokens"][...]).reshape(h5["/batches/tokens"].attrs["shape"]),
                              dtype=torch.long)
        targets = torch.tensor(np.asarray(h5["/batches/targets"][...]).reshape(h5["/batches/targets"].attrs["shape"]),
                               dtype=torch.long)
        loss0 = float(h5["/step0/loss"][()])
        grads = {k[len("grad."):]: torch.tensor(np.asarray(v[...]).reshape(tuple(v.attrs["shape"])), dtype=torch.float64)
                 for k, v in h5["/step0"].items() if k.startswith("grad.")}
        traj = {k: np.asarray(h5["/trajectory"][k][...], dtype=np.float64) for k in ("loss", "lr", "grad_norm")}

    L, NH = int(cfg["model.layers"]), int(cfg["model.heads"])
    steps, G, mb = int(cfg["run.steps"]), int(cfg["data.global_batch"]), int(cfg["data.micro_batch"])
    lr, warmup, min_lr = float(cfg["optim.lr"]), int(cfg["optim.warmup"]), float(cfg["optim.min_lr"])
    clip = float(cfg["optim.grad_clip"])
    assert cfg["optim.schedule"] == "cosine"

    moe = None
    if cfg.get("model.kind") == "moe":
        moe = {"experts": int(cfg["model.moe_experts"]), "every": int(cfg["model.moe_every"]),
               "top_k": int(cfg["model.moe_top_k"]), "capacity": float(cfg["model.moe_capacity_factor"]),
               "drop": cfg["model.moe_drop_tokens"] == "true", "renormalize": cfg["model.moe_renormalize"] == "true",
               "aux_coef": float(cfg["model.moe_aux_coef"])}
    params = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    model = Gpt(params, L, NH, moe)

    # Step 0: loss and every gradient, over the step's micro-batches (a MoE
    # model routes each micro-batch as its own group).
    nmb = G // mb
    loss = sum(model.loss(tokens[0, k * mb:(k + 1) * mb], targets[0, k * mb:(k + 1) * mb]) for k in range(nmb)) / nmb
    loss.backward()
    check("step 0 loss", abs(loss0 - loss.item()) / abs(loss.item()))
    if moe is not None:  # the capacity must have bitten, or dropping went untested
        check("step 0 assignments dropped (> 0)", 0.0 if model.dropped > 0 else 1.0, 0.5)
    for name, p in params.items():
        check(f"step 0 grad {name}", rel(grads[name], p.grad))

    # The trainer's run: AdamW with decay on matrices only (2-D parameters),
    # gradient accumulation over micro-batches, clipping, cosine schedule.
    params = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    model = Gpt(params, L, NH, moe)
    # Decay on weight matrices (and the experts' stacked ones), not on
    # biases or norm gains.
    decayed = lambda n, p: p.dim() >= 2 and not n.endswith("bias")
    decay = [p for n, p in params.items() if decayed(n, p)]
    no_decay = [p for n, p in params.items() if not decayed(n, p)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": float(cfg["optim.weight_decay"])},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(float(cfg["optim.beta1"]), float(cfg["optim.beta2"])),
                            eps=float(cfg["optim.eps"]))

    def schedule(s):
        if s < warmup:
            return lr * (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))

    for s in range(steps):
        opt.zero_grad()
        total = 0.0
        for k in range(G // mb):
            l = model.loss(tokens[s, k * mb:(k + 1) * mb], targets[s, k * mb:(k + 1) * mb]) / (G // mb)
            l.backward()
            total += l.item()
        norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), clip if clip > 0 else float("inf")))
        for g in opt.param_groups:
            g["lr"] = schedule(s)
        opt.step()
        check(f"step {s} loss", abs(traj["loss"][s] - total) / abs(total))
        check(f"step {s} grad norm", abs(traj["grad_norm"][s] - norm) / norm)
        check(f"step {s} lr", abs(traj["lr"][s] - schedule(s)) / schedule(s))
    # The key bias of attention has an exactly zero gradient: adding q.b_k
    # shifts a whole row of scores, and softmax ignores shifts. Numerically it
    # is rounding noise (~1e-12 in fp32), which Adam's m / (sqrt(v) + eps)
    # turns into updates of a small absolute size; so the key slice is checked
    # for being noise-sized in both runs (below 1e-5 absolute after these
    # steps) and the query and value slices by relative error as everything else.
    C = int(cfg["model.d_model"])
    for name, p in params.items():
        ref, got = p.detach(), final[name]
        if name.endswith("attn.qkv.bias"):
            g = grads[name]
            key_noise = float(g[C:2 * C].abs().max() / g.abs().max())
            check(f"step 0 {name} key slice / max (~0)", key_noise, 1e-6)
            check(f"final {name} query+value", rel(torch.cat([got[:C], got[2 * C:]]),
                                                   torch.cat([ref[:C], ref[2 * C:]])), FINAL_TOL)
            check(f"final {name} key, absolute", float((got[C:2 * C] - ref[C:2 * C]).abs().max()), 1e-5)
        else:
            check(f"final {name}", rel(got, ref), FINAL_TOL)


if __name__ == "__main__":
    sys.exit(main())

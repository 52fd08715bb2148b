#!/usr/bin/python3
"""PyTorch parity for strata's decoders: GPT and Llama, each dense and
Mixture-of-Experts.

Builds the same model in PyTorch (float64, the reference), loads strata's
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


class Decoder:
    """The decoder of models/decoder/decoder.cpp, written with torch ops over
    named tensors. GPT-2's blocks, or with `llama` (a dict of rope_theta and
    kv_heads) Llama's: RMSNorm, grouped-query attention with rotary
    positions (pairs 2i, 2i + 1, as Meta's reference turns them), a SwiGLU
    MLP, no biases, an untied head. With `moe` (a dict of the deck's moe_*
    keys), every moe_every-th block's MLP is the Mixture-of-Experts layer of
    models/moe.cpp (its experts GELU or SwiGLU MLPs), its routing written
    here from the same rules."""

    def __init__(self, params, layers, heads, moe=None, llama=None):
        self.p, self.L, self.NH, self.moe, self.llama = params, layers, heads, moe, llama
        self.dropped = 0  # MoE assignments past capacity, over every forward

    def norm(self, x, name):
        if self.llama is None:
            return F.layer_norm(x, (x.shape[-1],), self.p[f"{name}.weight"], self.p[f"{name}.bias"], 1e-5)
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-5) * self.p[f"{name}.weight"]

    def mlp(self, h, fc_w, fc_b, proj_w, proj_b):
        """GELU MLP, or SwiGLU: fc's outputs are the gate's F then up's F."""
        a = F.linear(h, fc_w, fc_b)
        if self.llama is None:
            a = F.gelu(a, approximate="tanh")
        else:
            gate, up = a.chunk(2, dim=-1)
            a = F.silu(gate) * up
        return F.linear(a, proj_w, proj_b)

    def rope(self, x):
        """x [B, heads, T, hs]: pair (2i, 2i + 1) at position t turned by t theta^(-2i / hs)."""
        B, H, T, hs = x.shape
        i = torch.arange(hs // 2, dtype=torch.float64)
        angle = torch.arange(T, dtype=torch.float64)[:, None] * self.llama["theta"] ** (-2.0 * i / hs)
        c, s = angle.cos(), angle.sin()
        pairs = x.reshape(B, H, T, hs // 2, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        return torch.stack([a * c - b * s, a * s + b * c], dim=-1).reshape(B, H, T, hs)

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
            bias = lambda n: self.p[f"h.{l}.moe.{n}"][e] if self.llama is None else None
            out = self.mlp(x[t_idx], p("experts.fc.weight")[e], bias("experts.fc.bias"), p("experts.proj.weight")[e],
                           bias("experts.proj.bias"))
            y = y.index_add(0, t_idx, gates[t_idx, j_idx].unsqueeze(1) * out)
        f = F.one_hot(order[:, 0], E).to(h.dtype).mean(dim=0)
        aux = m["aux_coef"] * E * (f * probs.mean(dim=0)).sum()
        return y.reshape(B, T, C), aux

    def block(self, x, l):
        p = lambda n: self.p.get(f"h.{l}.{n}")  # None: a bias the model has not
        B, T, C = x.shape
        hs = C // self.NH
        NKV = self.NH if self.llama is None else self.llama["kv_heads"]
        h = self.norm(x, f"h.{l}.ln1")
        if p("attn.qkv.weight") is not None:
            q, k, v = F.linear(h, p("attn.qkv.weight"), p("attn.qkv.bias")).split(C, dim=2)
        else:  # grouped-query: q, then k and v of the key-value heads
            q = F.linear(h, p("attn.q.weight"), p("attn.q.bias"))
            k, v = F.linear(h, p("attn.kv.weight"), p("attn.kv.bias")).split(NKV * hs, dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k, v = (t.view(B, T, NKV, hs).transpose(1, 2) for t in (k, v))
        if self.llama is not None:
            q, k = self.rope(q), self.rope(k)
        # Query head h reads key-value head h // (NH / NKV).
        k, v = (t.repeat_interleave(self.NH // NKV, dim=1) for t in (k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p("attn.proj.weight"), p("attn.proj.bias"))
        h = self.norm(x, f"h.{l}.ln2")
        if self.is_moe(l):
            y, aux = self.moe_mlp(h, l)
            return x + y, aux
        return x + self.mlp(h, p("mlp.fc.weight"), p("mlp.fc.bias"), p("mlp.proj.weight"), p("mlp.proj.bias")), 0.0

    def loss(self, tokens, targets):
        """Cross-entropy of one micro-batch plus its MoE auxiliary losses."""
        T = tokens.shape[1]
        x = self.p["wte"][tokens]
        if "wpe" in self.p:
            x = x + self.p["wpe"][:T]
        aux = 0.0
        for l in range(self.L):
            x, a = self.block(x, l)
            aux = aux + a
        x = self.norm(x, "lnf")
        logits = x @ self.p.get("lm_head.weight", self.p["wte"]).T
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
    moe = ["model.moe_experts=4", "model.moe_every=2", "model.moe_top_k=2", "model.moe_capacity_factor=1.0",
           "model.moe_aux_coef=0.05"]
    run_case(tool, os.path.join(work, "export-moe.h5"), ['model.kind="moe"', *moe], failures)
    # Llama: 4 query heads sharing 2 key-value heads, rotary positions, a
    # SwiGLU MLP of its own width, an untied head; then Mixtral's MoE blocks.
    llama = ['model.kind="llama"', "model.kv_heads=2", "model.ffn_dim=48", "model.rope_theta=10000"]
    run_case(tool, os.path.join(work, "export-llama.h5"), llama, failures)
    run_case(tool, os.path.join(work, "export-mixtral.h5"), [*llama, *moe], failures)
    print(f"{len(failures)} failed" if failures else "all parity checks passed")
    return 1 if failures else 0


def run_case(tool, out, sets, failures):
    subprocess.run([tool, out, *sets], check=True)
    case = os.path.basename(out)[len("export"):-len(".h5")].lstrip("-")
    case = case + ": " if case else ""

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

    moe, llama = None, None
    if cfg["model.kind"] == "llama":
        llama = {"theta": float(cfg["model.rope_theta"]), "kv_heads": int(cfg["model.kv_heads"]) or NH}
    if cfg["model.kind"] == "moe" or (llama is not None and int(cfg["model.moe_experts"]) > 0):
        moe = {"experts": int(cfg["model.moe_experts"]), "every": int(cfg["model.moe_every"]),
               "top_k": int(cfg["model.moe_top_k"]), "capacity": float(cfg["model.moe_capacity_factor"]),
               "drop": cfg["model.moe_drop_tokens"] == "true", "renormalize": cfg["model.moe_renormalize"] == "true",
               "aux_coef": float(cfg["model.moe_aux_coef"])}
    params = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    model = Decoder(params, L, NH, moe, llama)

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
    model = Decoder(params, L, NH, moe, llama)
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

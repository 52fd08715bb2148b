#!/usr/bin/python3
"""Expert parallelism's cost, side by side in one run: the MoE deck
(inputs/moe-ep.toml, 8 experts per MoE block, dp 8) with its experts split
over ep ranks and, for comparison, replicated on every rank (ep = 1, no
all-to-all). Per run:

* all-to-all time and bytes per step (the counts exchange and the token
  rows out and back, forward and backward), from the report's /comm table,
  mean and max over ranks, with the algorithm bandwidth;
* the share of the step spent in all-to-all, the median step time and the
  expert parameters each rank holds;
* the per-expert load (share of each block's assignments, share dropped)
  and the rows each ep rank's experts processed (their load balance), from
  /experts.

Rounds alternate the layouts so machine noise hits both. Run from the
repository root after building:
    /usr/bin/python3 bench/moe_all_to_all.py [--ranks 8] [--ep 4] [--rounds 1]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "analysis"))

from strata_report.read import Report, text  # noqa: E402


def run(ranks, ep, out, deck):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = ["mpiexec", "-n", str(ranks), os.path.join(ROOT, "build", "strata"), "run", deck, "--output", out,
           "--set", "run.log_every=0", "--set", f"parallel.dp={ranks}", "--set", f"parallel.ep={ep}"]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return Report(out)


def measure(rep):
    steps = rep.measured_steps()
    measured = np.unique(steps["step"])
    n = len(measured)
    c = rep.array("comm")
    ops = np.array([text(o) for o in c["op"]])
    axes = np.array([text(a) for a in c["axis"]])
    sel = np.isin(c["step"], measured) & (axes == "ep") & np.char.startswith(ops.astype(str), "all_to_all")
    per_rank_bytes, per_rank_time = [], []
    for r in range(rep.world):
        mine = sel & (c["rank"] == r)
        per_rank_bytes.append(c["bytes"][mine].sum() / n)
        per_rank_time.append((c["end"][mine] - c["start"][mine]).sum() / n)
    step_time = float(np.median([steps["step_time"][steps["step"] == k].max() for k in measured]))
    return np.array(per_rank_bytes), np.array(per_rank_time), step_time


def expert_params(rep):
    """Bytes of expert parameters per rank, from the resolved deck."""
    import tomllib
    cfg = tomllib.loads(rep.attrs["resolved_config"])
    m, p = cfg["model"], cfg["parallel"]
    blocks = sum(1 for l in range(m["layers"]) if l % m["moe_every"] == m["moe_every"] - 1)
    C, F = m["d_model"], m["d_model"] * m["ffn_mult"]
    per_expert = 2 * C * F + F + C
    return 4 * blocks * per_expert * m["moe_experts"] // p["ep"], m["moe_experts"], p["ep"]


def load_table(rep, experts, ep):
    e = rep.array("experts")
    measured = np.unique(rep.measured_steps()["step"])
    e = e[np.isin(e["step"], measured)]
    lines = []
    for layer in np.unique(e["layer"]):
        b = e[e["layer"] == layer]
        total = max(int(b["tokens_routed"].sum()), 1)
        cells = []
        for x in range(experts):
            r = b[b["expert"] == x]
            routed, dropped = int(r["tokens_routed"].sum()), int(r["tokens_dropped"].sum())
            cells.append(f"e{x} {100 * routed / total:4.1f}%/{100 * dropped / max(routed, 1):4.1f}%")
        lines.append(f"    block {layer}: " + "  ".join(cells))
        kept = [int((b["tokens_routed"] - b["tokens_dropped"])[b["expert"] // (experts // ep) == q].sum())
                for q in range(ep)]
        mean = max(np.mean(kept), 1)
        lines.append(f"      rows processed per ep rank (all its copies): {kept}  max/mean {max(kept) / mean:.3f}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--ep", type=int, default=4, help="expert-parallel ranks of the EP run (the other run has 1)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--deck", default=os.path.join(ROOT, "inputs", "moe-ep.toml"))
    a = ap.parse_args()
    best = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(a.rounds):
            for ep in (a.ep, 1):
                rep = run(a.ranks, ep, os.path.join(tmp, f"ep{ep}-{k}.h5"), a.deck)
                b, t, step = measure(rep)
                if ep not in best or step < best[ep][3]:
                    best[ep] = (rep, b, t, step)
        print(f"MoE deck {os.path.relpath(a.deck, ROOT)} on {a.ranks} rank(s), dp {a.ranks}; best of {a.rounds} "
              f"round(s) per layout; per measured step, over ranks")
        print(f"  {'ep':>3} {'step_ms':>9} {'a2a_ms mean/max':>16} {'a2a share':>9} {'a2a bytes mean/max':>21} "
              f"{'algbw MB/s':>10} {'expert params/rank':>18}")
        for ep in (a.ep, 1):
            rep, b, t, step = best[ep]
            pbytes, experts, _ = expert_params(rep)
            bw = b.mean() / t.mean() / 1e6 if t.mean() > 0 else 0.0
            print(f"  {ep:>3} {1e3 * step:>9.2f} {1e3 * t.mean():>7.2f}/{1e3 * t.max():<8.2f} "
                  f"{100 * t.mean() / step:>8.1f}% {b.mean():>10.0f}/{b.max():<10.0f} {bw:>10.2f} "
                  f"{pbytes / 2**20:>15.2f} MiB")
        rep, _, _, _ = best[a.ep]
        _, experts, ep = expert_params(rep)
        ratio = best[a.ep][3] / best[1][3]
        print(f"  step time ep {a.ep} / ep 1: {ratio:.3f}; expert parameters per rank ep {a.ep} / ep 1: {1 / ep:.3f}")
        print(f"per-expert load with ep {a.ep} (share of the block's assignments / share of them dropped):")
        for line in load_table(rep, experts, ep):
            print(line)


if __name__ == "__main__":
    main()

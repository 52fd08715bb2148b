"""Pictures of one run: the pipeline timeline, memory per rank, communication."""
import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .read import text  # noqa: E402
from .summary import CATEGORIES, comm_per_axis_op, memory_per_rank  # noqa: E402
from .summary import expert_load as expert_load_of  # noqa: E402

PHASE_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "backward_input": "#dd8452",
                 "backward_weight": "#55a868", "optimizer": "#8172b3"}
AXIS_COLOURS = {"dp": "#c44e52", "tp": "#937860", "pp": "#da8bc3", "emb": "#8c8c8c", "world": "#ccb974"}


def shown_step(rep):
    """The step the timeline shows: the last measured one."""
    s = rep.measured_steps()
    return int(s["step"].max()) if len(s) else 0


def timeline(rep, path, step=None):
    """Ranks down, time across, one step: a compute lane per rank (spans
    coloured by kind, gaps are bubbles) and a communication lane beneath it."""
    tl, cm = rep.array("timeline"), rep.array("comm")
    step = shown_step(rep) if step is None else step
    ranks = list(range(rep.world))
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.6 * len(ranks)))
    t0 = None
    if len(tl):
        sel = tl[tl["step"] == step]
        if len(sel):
            t0 = sel["start"].min()
    if t0 is None and len(cm) and (cm["step"] == step).any():
        t0 = cm["start"][cm["step"] == step].min()
    t0 = 0.0 if t0 is None else t0
    seen = set()
    for r in ranks:
        y = 2 * (len(ranks) - 1 - r)
        if len(tl):
            spans = tl[(tl["step"] == step) & (tl["rank"] == r)]
            for s in spans:
                ph = text(s["phase"])
                ax.broken_barh([(1e3 * (s["start"] - t0), 1e3 * (s["end"] - s["start"]))], (y + 1, 0.8),
                               color=PHASE_COLOURS.get(ph, "grey"), edgecolor="white", linewidth=0.3,
                               label=None if ph in seen else ph)
                seen.add(ph)
        if len(cm):
            calls = cm[(cm["step"] == step) & (cm["rank"] == r)]
            for c in calls:
                # Blocking calls (and receives) solid; non-blocking ones, in
                # flight beside the compute, pale.
                a = text(c["axis"])
                key = f"comm {a}" + (" (non-blocking)" if c["nonblocking"] else "")
                ax.broken_barh([(1e3 * (c["start"] - t0), max(1e3 * (c["end"] - c["start"]), 1e-3))], (y + 0.1, 0.7),
                               color=AXIS_COLOURS.get(a, "black"), alpha=0.3 if c["nonblocking"] else 0.9,
                               label=None if key in seen else key)
                seen.add(key)
    ax.set_yticks([2 * (len(ranks) - 1 - r) + 1 for r in ranks])
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_xlabel(f"ms since the first span of step {step}")
    ax.set_title(f"timeline of step {step}: compute (upper lane) and communication (lower lane) per rank")
    fig.legend(loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12 + 0.1 / len(ranks), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def memory(rep, path):
    """Held bytes per rank at the end of the last step, stacked by category,
    with each rank's sum of per-category peaks marked (the categories peak at
    different moments, so this bounds the true peak from above)."""
    mem = memory_per_rank(rep)
    ranks = sorted(mem)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(ranks) + 4), 4))
    bottom = np.zeros(len(ranks))
    colours = plt.get_cmap("tab10")
    for i, c in enumerate(CATEGORIES):
        v = np.array([mem[r][0][c] for r in ranks], dtype=float) / 2**20
        ax.bar(ranks, v, bottom=bottom, color=colours(i), label=c)
        bottom += v
    peaks = np.array([sum(mem[r][1].values()) for r in ranks], dtype=float) / 2**20
    ax.scatter(ranks, peaks, marker="_", s=600, color="black", label="sum of category peaks", zorder=3)
    ax.set_xticks(ranks)
    ax.set_xlabel("rank")
    ax.set_ylabel("MiB")
    ax.set_ylim(0, 1.1 * max(peaks.max(initial=0), bottom.max(initial=0), 1e-9))
    ax.set_title("memory per rank: held at the end of the last step", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def communication(rep, path):
    """Time per rank (mean over the ranks that issue it) for each axis and op,
    with the exposed part (wait) darker, and bytes written on each bar."""
    rows = comm_per_axis_op(rep)
    fig, ax = plt.subplots(figsize=(8, 0.5 * max(len(rows), 1) + 1.5))
    labels = [f"{a} {o} (n={g})" for a, o, g, *_ in rows]
    y = np.arange(len(rows))
    times = np.array([r[6] for r in rows]) * 1e3
    waits = np.array([r[7] for r in rows]) * 1e3
    ax.barh(y, times, color=[AXIS_COLOURS.get(r[0], "grey") for r in rows], alpha=0.5, label="time")
    ax.barh(y, waits, color=[AXIS_COLOURS.get(r[0], "grey") for r in rows], label="exposed (wait)")
    for i, r in enumerate(rows):
        ax.text(times[i], i, f" {r[5] / 2**20:.2f} MiB, {r[4]:.0f} calls", va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms per rank over the measured steps")
    ax.set_title("communication per axis and op")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def expert_load(rep, path):
    """MoE: per block, each expert's share of the block's assignments over the
    measured steps (bars) against a perfect balance (the line), and the share
    of its assignments dropped past its capacity (hatched)."""
    load = expert_load_of(rep)
    blocks = sorted(load)
    fig, axes = plt.subplots(1, len(blocks), figsize=(3 + 2.5 * len(blocks), 3.5), squeeze=False)
    for ax, b in zip(axes[0], blocks):
        rows = load[b]
        xs = [x for x, _, _ in rows]
        share = np.array([s for _, s, _ in rows])
        dropped = np.array([d for _, _, d in rows])
        ax.bar(xs, 100 * share, color="#4c72b0", label="assignments")
        ax.bar(xs, 100 * share * dropped, color="#c44e52", hatch="//", label="dropped")
        ax.axhline(100 / len(rows), color="k", lw=0.8, ls="--", label="balanced")
        ax.set_title(f"block {b}", fontsize=10)
        ax.set_xlabel("expert")
        ax.set_xticks(xs)
    axes[0][0].set_ylabel("% of the block's assignments")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("expert load over the measured steps (every rank)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(rep, directory):
    os.makedirs(directory, exist_ok=True)
    paths = []
    pictures = [("timeline", timeline), ("memory", memory), ("comm", communication)]
    if expert_load_of(rep):
        pictures.append(("experts", expert_load))
    for name, fn in pictures:
        p = os.path.join(directory, f"{name}.png")
        fn(rep, p)
        paths.append(p)
    return paths

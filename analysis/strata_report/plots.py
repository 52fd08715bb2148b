"""Pictures of one run: the pipeline timeline, memory per rank, communication."""
import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import outputs  # noqa: E402
from .read import text  # noqa: E402
from .trace import mesh_dims  # noqa: E402
from .summary import (CATEGORIES, alike, byte_unit, comm_per_axis_op, human_bytes, memory_capacity,  # noqa: E402
                      memory_per_rank, pool_peaks)
from .summary import expert_load as expert_load_of  # noqa: E402

PHASE_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "backward_input": "#dd8452",
                 "backward_weight": "#55a868", "optimizer": "#8172b3"}
AXIS_COLOURS = {"dp": "#c44e52", "tp": "#937860", "pp": "#da8bc3", "emb": "#8c8c8c", "world": "#ccb974"}


def shown_step(rep):
    """The step the timeline shows: the last measured one."""
    s = rep.measured_steps()
    return int(s["step"].max()) if len(s) else 0


# The most lanes (ranks or classes) the timeline draws, and bars the memory
# picture draws: beyond them a picture is too tall or too wide to read.
MAX_LANES = 16
MAX_BARS = 24
MAX_BLOCKS = 8


def lanes(rep):
    """(the ranks the timeline draws, {rank: label}): every rank (or class)
    that has rows, or, past MAX_LANES, the first of each pipeline stage and
    then others evenly spread up to MAX_LANES. Each is labelled by its ranks
    and by the mesh coordinates that vary among those shown."""
    have = rep.row_ranks
    rk = rep.array("ranks")
    coords = {}
    dims = mesh_dims(rk)
    for row in rk:
        coords[int(row["rank"])] = {d: int(row[d]) for d in dims}
    shown = have
    if len(have) > MAX_LANES:
        firsts, seen = [], set()
        for r in have:
            st = coords.get(r, {}).get("pp")
            if st is not None and st not in seen:
                seen.add(st)
                firsts.append(r)
        shown = firsts[:MAX_LANES]
        first = set(shown)
        rest = [r for r in have if r not in first]
        room = MAX_LANES - len(shown)
        if room > 0 and rest:
            shown += [rest[int(i)] for i in np.linspace(0, len(rest) - 1, min(room, len(rest)))]
        shown = sorted(set(shown))
    varies = [d for d in dims if len({coords.get(r, {}).get(d) for r in shown}) > 1]
    labels = {}
    for r in shown:
        where = ", ".join(f"{d} {coords[r][d]}" for d in varies if r in coords)
        labels[r] = rep.rank_label(r, 20) + (f" ({where})" if where else "")
    return shown, labels


def timeline(rep, path, step=None):
    """Ranks down, time across, one step: a compute lane per rank or class
    (spans coloured by kind, gaps are bubbles) and a communication lane
    beneath it; at most MAX_LANES of them."""
    tl, cm = rep.array("timeline"), rep.array("comm")
    step = shown_step(rep) if step is None else step
    ranks, labels = lanes(rep)
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.6 * len(ranks)))
    t0 = None
    if len(tl):
        sel = tl[tl["step"] == step]
        if len(sel):
            t0 = sel["start"].min()
    if t0 is None and len(cm) and (cm["step"] == step).any():
        t0 = cm["start"][cm["step"] == step].min()
    t0 = 0.0 if t0 is None else t0
    # One drawing call per lane and kind: a call per span is slow past a few
    # thousand spans.
    bars = {}  # (y, height, kind) -> [(start, width)]
    tl = tl[tl["step"] == step] if len(tl) else tl
    cm = cm[cm["step"] == step] if len(cm) else cm
    for i, r in enumerate(ranks):
        y = 2 * (len(ranks) - 1 - i)
        if len(tl):
            for s in tl[tl["rank"] == r]:
                bars.setdefault((y + 1, 0.8, text(s["phase"])), []).append(
                    (1e3 * (s["start"] - t0), 1e3 * (s["end"] - s["start"])))
        if len(cm):
            for c in cm[cm["rank"] == r]:
                # Blocking calls (and receives) solid; non-blocking ones, in
                # flight beside the compute, pale.
                key = f"comm {text(c['axis'])}" + (" (non-blocking)" if c["nonblocking"] else "")
                bars.setdefault((y + 0.1, 0.7, key), []).append(
                    (1e3 * (c["start"] - t0), max(1e3 * (c["end"] - c["start"]), 1e-3)))
    seen = set()
    for (y, h, kind), xs in bars.items():
        if kind.startswith("comm "):
            style = dict(color=AXIS_COLOURS.get(kind.split(" ")[1], "black"),
                         alpha=0.3 if kind.endswith("(non-blocking)") else 0.9)
        else:
            style = dict(color=PHASE_COLOURS.get(kind, "grey"), edgecolor="white", linewidth=0.3)
        ax.broken_barh(xs, (y, h), label=None if kind in seen else kind, **style)
        seen.add(kind)
    ax.set_yticks([2 * (len(ranks) - 1 - i) + 1 for i in range(len(ranks))])
    ax.set_yticklabels([labels[r] for r in ranks], fontsize=8)
    ax.set_xlabel(f"ms since the first span of step {step}")
    of = len(rep.row_ranks)
    ax.set_title(f"timeline of step {step}: compute (upper lane) and communication (lower lane)"
                 + (f"; {len(ranks)} of {of} lanes" if of > len(ranks) else ""), fontsize=10)
    fig.legend(loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12 + 0.1 / max(len(ranks), 1), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


# Past this ratio of the highest to the lowest of the capacity and the
# tallest bar, the memory picture's axis is logarithmic: on a linear one the
# smaller would be a sliver at the bottom.
LOG_RATIO = 20


def memory(rep, path):
    """Held bytes per rank at the end of the last step, stacked by category,
    with each rank's sum of per-category peaks marked (the categories peak at
    different moments, so this bounds the true peak from above), its device
    peak (the most held at once, what must fit) where the report has it, and
    the device capacity (root attribute memory_capacity) as a line. Ranks of
    equal figures share a bar; at most MAX_BARS bars."""
    device = pool_peaks(rep) if "pool_peak_bytes" in (rep.array("memory").dtype.names or ()) else {}
    per_rank = {r: (held, peak, device.get(r)) for r, (held, peak) in memory_per_rank(rep).items()}
    groups = alike(rep, per_rank)
    shown = groups[:MAX_BARS]
    capacity = memory_capacity(rep)
    held = np.array([[h[c] for c in CATEGORIES] for _, (h, _, _) in shown], dtype=float).reshape(len(shown),
                                                                                                 len(CATEGORIES))
    peaks = np.array([sum(peak.values()) for _, (_, peak, _) in shown], dtype=float)
    at_once = np.array([np.nan if d is None else d for _, (_, _, d) in shown], dtype=float)
    top = max(peaks.max(initial=0), held.sum(axis=1).max(initial=0), np.nanmax(at_once, initial=0))
    div, unit = byte_unit(max(top, capacity))
    x = np.arange(len(shown))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(shown) + 4), 4.5))
    bottom = np.zeros(len(shown))
    colours = plt.get_cmap("tab10")
    for i, c in enumerate(CATEGORIES):
        v = held[:, i] / div
        ax.bar(x, v, bottom=bottom, color=colours(i), label=c)
        bottom += v
    ax.scatter(x, peaks / div, marker="_", s=600, color="black", label="sum of category peaks", zorder=3)
    if np.isfinite(at_once).any():
        ax.scatter(x, at_once / div, marker="v", s=40, color="#c44e52", label="device peak (held at once)", zorder=4)
    lo, hi = (min(top, capacity), max(top, capacity)) if capacity else (top, top)
    log = capacity > 0 and lo > 0 and hi / lo > LOG_RATIO
    if capacity:
        ax.axhline(capacity / div, color="#c44e52", ls="--", lw=1.2, label=f"device capacity ({human_bytes(capacity)})",
                   zorder=5)
    ax.set_xticks(x)
    ax.set_xticklabels([label for label, _ in shown], rotation=30 if len(shown) > 4 else 0, ha="right"
                       if len(shown) > 4 else "center", fontsize=8)
    ax.set_ylabel(unit + (" (log scale)" if log else ""))
    if log:
        # Both the capacity and the tallest bar in view, a decade below the
        # lower of them for the bars' smaller categories.
        ax.set_yscale("log")
        first = held.cumsum(axis=1)
        first = first[first > 0]
        ax.set_ylim(min(lo / 10, first.min(initial=lo) / 2) / div, 2 * hi / div)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    else:
        ax.set_ylim(0, 1.1 * max(hi / div, 1e-9))
    fits = rep.attrs.get("fits")  # a whole number where present (read.WHOLE_ATTRS)
    verdict = "" if fits is None else ": fits" if int(fits) == 1 else ": DOES NOT FIT"
    ax.set_title("memory per rank: held at the end of the last step"
                 + (f" ({len(shown)} of {len(groups)} groups of ranks)" if len(groups) > len(shown) else "") + verdict,
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def communication(rep, path):
    """Time per rank (mean over the ranks that issue it) for each axis and op,
    with the exposed part (wait) darker, and bytes written on each bar."""
    rows = comm_per_axis_op(rep, size=human_bytes)
    fig, ax = plt.subplots(figsize=(8, 0.5 * max(len(rows), 1) + 1.5))
    labels = [f"{a} {o} (n={g})" for a, o, g, *_ in rows]
    y = np.arange(len(rows))
    times = np.array([r[6] for r in rows]) * 1e3
    waits = np.array([r[7] for r in rows]) * 1e3
    ax.barh(y, times, color=[AXIS_COLOURS.get(r[0], "grey") for r in rows], alpha=0.5, label="time")
    ax.barh(y, waits, color=[AXIS_COLOURS.get(r[0], "grey") for r in rows], label="exposed (wait)")
    for i, r in enumerate(rows):
        ax.text(times[i], i, f" {human_bytes(r[5])}, {r[4]:.0f} calls", va="center", fontsize=8)
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
    if len(blocks) > MAX_BLOCKS:  # the most unbalanced ones
        blocks = sorted(sorted(blocks, key=lambda b: -max(s for _, s, _ in load[b]))[:MAX_BLOCKS])
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
    fig.suptitle("expert load over the measured steps (every rank)"
                 + (f": the {len(blocks)} most unbalanced of {len(load)} blocks" if len(load) > len(blocks) else ""),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# The pictures write_all may write (experts.png for a MoE model).
FILES = ("timeline.png", "memory.png", "comm.png", "experts.png")


def write_all(rep, directory):
    pictures = [("timeline.png", timeline), ("memory.png", memory), ("comm.png", communication)]
    if expert_load_of(rep):
        pictures.append(("experts.png", expert_load))
    outputs.check([("the report", rep.path)], dirs=[("plots directory", directory, [n for n, _ in pictures])])
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, fn in pictures:
        p = os.path.join(directory, name)
        fn(rep, p)
        paths.append(p)
    return paths

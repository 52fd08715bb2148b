"""A sweep's index (schema strata-sweep v1) or a plan (strata-plan v1, from
`strata plan`: predicted, not run): its points ranked by throughput, and
throughput against peak memory with the Pareto front."""
import os

import numpy as np

from . import outputs
from .read import (Report, ReportError, checked_table, data_frame, read_attrs, read_file, read_isolated,
                   read_open_report, text, texts, units_of)
from .summary import fmt_bytes

SCHEMAS = ("strata-sweep", "strata-plan")
# The most points the bar chart of sweep.png draws.
MAX_BARS = 30
# The picture plot writes.
PLOT_FILE = "sweep.png"


# The columns of /points the tools read (kinds as read.COLUMNS).
POINT_COLUMNS = {"point": "n", "status": "s", "world": "n", "tokens_per_s": "n", "mfu": "n", "step_time": "n",
                 "peak_bytes": "n", "overrides": "s", "reason": "s", "runs": "n?", "step_time_spread": "n?"}


def _read_open_index(path, f):
    attrs = read_attrs(path, f)
    if attrs.get("schema", "") not in SCHEMAS or attrs.get("schema_version", 0) != 1:
        raise ReportError(f"{path}: not a strata-sweep or strata-plan v1 index")
    if "points" not in f:
        raise ReportError(f"{path}: the index has no /points table")
    return attrs, checked_table(path, "points", f["points"], POINT_COLUMNS), units_of(f["points"])


def _read_either(path):
    """("index", its parts) or ("report", its parts): one read of the file,
    as its schema says."""

    def body(f):
        if text(f.attrs.get("schema", "")) in SCHEMAS:
            return "index", _read_open_index(path, f)
        return "report", read_open_report(path, f)

    return read_file(path, body)


def open_file(path):
    """The Index or the Report at `path`, read once (in a child process)."""
    kind, parts = read_isolated(path, _read_either)
    return Index(path, parts) if kind == "index" else Report(path, parts)


class Index:
    def __init__(self, path, read=None):
        """`read`: what _read_open_index returned for the file, when the
        caller has read it already."""
        attrs, self.points, self.units = read if read is not None else read_isolated(
            path, lambda p: read_file(p, lambda f: _read_open_index(p, f)))
        self.schema = attrs.get("schema", "")
        self.machine = text(attrs.get("machine", ""))
        self.name = text(attrs.get("sweep", ""))
        self.axes = text(attrs.get("axes", ""))
        self.where = text(attrs.get("where", ""))
        # A plan stopped by a signal says so (status, interrupted_by) and how
        # far it got; a sweep's index has no status.
        self.status = text(attrs.get("status", ""))
        self.interrupted_by = text(attrs.get("interrupted_by", ""))
        self.layouts = attrs.get("layouts")
        self.layouts_judged = attrs.get("layouts_judged")
        self.path = path

    def col(self, c):
        v = self.points[c]
        return texts(v) if v.dtype.kind == "S" else v

    def table(self):
        """/points as a pandas DataFrame, strings as str, and one column more
        per deck key the points set (a sweep's axes, a plan's searches),
        named by the key and holding its values as numbers where they are;
        the units in df.attrs["units"]."""
        per_point = [overrides_of(o) for o in self.col("overrides")]
        keys = []
        for o in per_point:
            keys += [k for k in o if k not in keys and k not in self.points.dtype.names]
        more = {k: ([o.get(k) for o in per_point], "") for k in keys}
        return data_frame(self.points, self.units, more)


def literal(v):
    """A deck value as written in an override: an int, a float, a bool, or
    the text (quotes removed)."""
    if v in ("true", "false"):
        return v == "true"
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v


def overrides_of(text_):
    """{section.key: value} of "parallel.pp=2 backend.memory_limit=\"64KiB\""
    (space-separated section.key=value; a space inside a value stays in it)."""
    out, key = {}, None
    for word in text_.split(" "):
        name, eq, value = word.partition("=")
        if eq and "." in name and name.replace(".", "").replace("_", "").isalnum():
            key = name
            out[key] = value
        elif key is not None:
            out[key] += " " + word
    return {k: literal(v) for k, v in out.items()}


def pareto(throughput, memory):
    """Indices of the points no other point beats on both (higher
    throughput, lower memory), sorted by memory."""
    order = np.lexsort((-throughput, memory))
    front, best = [], -np.inf
    for i in order:
        if throughput[i] > best:
            front.append(int(i))
            best = throughput[i]
    return front


def render(ix):
    st = ix.col("status")
    done = np.where(st == "complete")[0]
    kind = f"plan on machine {ix.machine} (predicted)" if ix.schema == "strata-plan" else "sweep"
    out = [f"{kind} '{ix.name}' ({ix.path}): {len(st)} point(s): " +
           ", ".join(f"{(st == s).sum()} {s}" for s in ("complete", "failed", "not_run", "skipped") if (st == s).any()),
           f"axes: {ix.axes}" + (f" | where: {ix.where}" if ix.where else "")]
    if ix.status == "interrupted":
        reached = (f": {ix.layouts_judged} of {ix.layouts} layouts judged, the rest not reached"
                   if ix.layouts is not None and ix.layouts_judged is not None else "")
        out.insert(1, f"INTERRUPTED by {ix.interrupted_by or 'a signal'}{reached}")
    if len(done):
        tp, mem = ix.col("tokens_per_s"), ix.col("peak_bytes")
        front = set(pareto(tp[done], mem[done]))
        # run.repeats: the median of the runs, and their spread.
        runs = ix.points["runs"] if "runs" in ix.points.dtype.names else np.ones(len(st), dtype=int)
        repeated = bool((runs[done] > 1).any())
        spread_head = f" {'runs':>4} {'spread':>7}" if repeated else ""
        out += ["", "complete points by throughput (* on the Pareto front of throughput and peak memory"
                + ("; medians over the runs, spread = (max - min) / median of the step time" if repeated else "") + ")",
                f"  {'point':>5} {'ranks':>5} {'tokens/s':>10} {'MFU%':>6} {'step_ms':>9}{spread_head} {'peak mem':>11}"
                "  overrides"]
        for rank_i in np.argsort(-tp[done], kind="stable"):
            i = done[rank_i]
            spread = (f" {runs[i]:>4} {100 * ix.col('step_time_spread')[i]:>6.1f}%" if repeated else "")
            out.append(f"{'*' if rank_i in front else ' '} {ix.col('point')[i]:>5} {ix.col('world')[i]:>5} "
                       f"{tp[i]:>10.0f} {100 * ix.col('mfu')[i]:>6.1f} {1e3 * ix.col('step_time')[i]:>9.2f}{spread} "
                       f"{fmt_bytes(mem[i]):>11}  {ix.col('overrides')[i]}")
    for s in ("failed", "not_run", "skipped"):
        idx = np.where(st == s)[0]
        if len(idx):
            out += ["", f"{s} points"]
            out += [f"  {ix.col('point')[i]:>5}  {ix.col('overrides')[i]}: {ix.col('reason')[i]}" for i in idx]
    return "\n".join(out)


def plot(ix, directory):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outputs.check([("the index", ix.path)], dirs=[("plots directory", directory, [PLOT_FILE])])
    os.makedirs(directory, exist_ok=True)
    st = ix.col("status")
    done = np.where(st == "complete")[0]
    tp, mem = ix.col("tokens_per_s")[done], ix.col("peak_bytes")[done] / 2**20
    labels = [f"{ix.col('point')[i]}: {ix.col('overrides')[i]}" for i in done]
    bars = min(len(done), MAX_BARS)  # the fastest points: past that, a bar chart is too tall to read
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 0.35 * max(bars, 4) + 2),
                                 gridspec_kw={"width_ratios": [1, 1.3]})
    front = pareto(tp, mem) if len(done) else []
    a1.scatter(mem, tp, color="#4c72b0", label="point")
    if front:
        a1.plot(mem[front], tp[front], "-o", color="#c44e52", label="Pareto front")
    for k, i in enumerate(done):
        a1.annotate(str(ix.col("point")[i]), (mem[k], tp[k]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    a1.set_xlabel("peak memory of the largest rank (MiB, sum of category peaks)")
    a1.set_ylabel("tokens/s")
    a1.set_title("throughput against memory (higher and further left is better)", fontsize=10)
    a1.legend(fontsize=8)
    order = np.argsort(tp, kind="stable")[len(done) - bars:]
    a2.barh(range(bars), tp[order], color=["#c44e52" if k in front else "#4c72b0" for k in order])
    a2.set_yticks(range(bars))
    a2.set_yticklabels([labels[k] for k in order], fontsize=7)
    a2.set_xlabel("tokens/s")
    a2.set_title("throughput per point (red: on the Pareto front)"
                 + (f": the fastest {bars} of {len(done)}" if bars < len(done) else ""), fontsize=10)
    fig.tight_layout()
    path = os.path.join(directory, PLOT_FILE)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]

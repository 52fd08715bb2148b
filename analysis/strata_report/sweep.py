"""A sweep's index (schema strata-sweep v1) or a plan (strata-plan v1, from
`strata plan`: predicted, not run): its points ranked by throughput, and
throughput against peak memory with the Pareto front."""
import os
import re

import numpy as np

from . import outputs
from .read import (Report, ReportError, checked_table, data_frame, read_attrs, read_file, read_isolated,
                   read_open_report, text, texts, units_of)
from .summary import byte_unit, fmt_bytes, human_bytes

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
        self.layouts_pruned = attrs.get("layouts_pruned")
        # A plan's bytes per device a candidate must fit in.
        self.memory_limit = attrs.get("memory_limit")
        self.path = path
        self._decoded = {}

    def col(self, c):
        """A column of /points, strings as str: decoded once, as a plan's
        tens of thousands of rows make a decoding per use add up."""
        v = self.points[c]
        if v.dtype.kind != "S":
            return v
        if c not in self._decoded:
            self._decoded[c] = texts(v)
        return self._decoded[c]

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


def _override_texts(text_):
    """{section.key: value as written} of "parallel.pp=2
    backend.memory_limit=\"64KiB\"" (space-separated section.key=value; a
    space inside a value stays in it)."""
    out, key = {}, None
    for word in text_.split(" "):
        name, eq, value = word.partition("=")
        if eq and "." in name and name.replace(".", "").replace("_", "").isalnum():
            key = name
            out[key] = value
        elif key is not None:
            out[key] += " " + word
    return out


def overrides_of(text_):
    """{section.key: value} of "parallel.pp=2 backend.memory_limit=\"64KiB\""
    (space-separated section.key=value; a space inside a value stays in it)."""
    return {k: literal(v) for k, v in _override_texts(text_).items()}


def short_overrides(texts_):
    """Each of `texts_` (overrides) cut to the keys whose values differ
    among them, the section dropped where no other key shares the name
    ("tp=4 zero=3"): a plan's rows set a dozen keys, most alike among its
    fastest."""
    parsed = [_override_texts(t) for t in texts_]
    keys = []
    for o in parsed:
        keys += [k for k in o if k not in keys]
    # One point (or points alike): nothing differs, so every key.
    varies = [k for k in keys if len({o.get(k) for o in parsed}) > 1] or keys
    names = [k.rsplit(".", 1)[-1] for k in varies]
    short = {k: (n if names.count(n) == 1 else k) for k, n in zip(varies, names)}
    return [" ".join(f"{short[k]}={o[k]}" for k in varies if k in o) for o in parsed]


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


# The most lines render prints, and within them the most complete points it
# lists (the fastest), further points of the Pareto front, and reasons per
# status: a plan holds tens of thousands of rows, nearly all skipped for a
# handful of reasons, and a line per row buries the few that matter.
MAX_LINES = 100
MAX_BEST = 20
MAX_FRONT = 5
MAX_REASONS = 10
# The most characters of a reason's line, and the points named on a line of
# a status whose points one goes to look at (a failed run's log).
MAX_REASON_WIDTH = 300
MAX_POINTS_NAMED = 4
STATUSES = ("complete", "failed", "diverged", "interrupted", "not_run", "skipped")
# What a row of each status that gives no reason stands for.
NO_REASON = {"not_run": "not run yet: valid, no report (e.g. more ranks than the allocation, or the sweep is "
                        "under way)",
             "failed": "failed without a message (the job died before publishing a report)"}

# A reason's first line begins with where the value came from (a deck's
# file:line or an override), and names each value's provenance in
# parentheses: neither says why, and both vary from row to row.
_WHERE = re.compile(r"^(?:--set [^\n]*?|[^\s:]+:\d+): ")
_PROVENANCE = re.compile(r" \((?:--set [^()]*|line \d+)\)")
# A number (a unit after it) that is a word of its own: not the digits of
# "1f1b", "zb-h1", "llama3-70b" or "10th".
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50, "s": 1, "ms": 1e-3,
          "us": 1e-6}
_NUMBER = re.compile(r"(?<![\w.-])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w|\.\d)(?: (?:" + "|".join(_UNITS) + r")\b)?")
SLOT = "\0"


def _magnitude(value):
    """A slot's value as a number in its unit's base (bytes, seconds), for
    ordering values of mixed units."""
    number, _, unit = value.partition(" ")
    try:
        return float(number) * _UNITS.get(unit, 1)
    except ValueError:
        return 0.0


def reason_kind(reason):
    """(kind, values): the reason's first line with where its value came
    from and the provenance in parentheses removed, and each number outside
    double quotes (a where clause, a string value) replaced by SLOT; the
    numbers in order. Rows whose reasons differ only in their numbers (the
    pipeline depth that does not divide the layers, the peak that does not
    fit) are of one kind."""
    line = _PROVENANCE.sub("", _WHERE.sub("", reason.split("\n", 1)[0]))
    parts, values = line.split('"'), []
    for i in range(0, len(parts), 2):  # the text outside quotes
        values += _NUMBER.findall(parts[i])
        parts[i] = _NUMBER.sub(SLOT, parts[i])
    return '"'.join(parts), values


def _spread(values):
    """A slot's values over a kind's rows: the one value, up to three
    joined by "/", else the least and the most ("0.52..3.35 s")."""
    distinct = sorted(set(values), key=_magnitude)
    if len(distinct) <= 3:
        return "/".join(distinct)
    lo, hi = distinct[0], distinct[-1]
    lo_n, _, lo_u = lo.partition(" ")
    hi_n, _, hi_u = hi.partition(" ")
    return f"{lo_n}..{hi}" if lo_u == hi_u else f"{lo}..{hi}"


def count(n):
    """A count with its thousands apart: 28 731 (anything but a whole
    number, from a damaged file, as it is)."""
    try:
        return f"{int(n):,}".replace(",", " ") if int(n) == n else str(n)
    except (TypeError, ValueError, OverflowError):
        return str(n)


def reasons(raw, status):
    """([(rows, label)], several, kind_of_row) of the rows whose reasons
    (bytes) are `raw`: one entry per kind of reason (reason_kind), the most
    rows first, its label the kind with every number filled in by its
    spread over the kind's rows; how many rows give more than one problem;
    and each row's entry. Each distinct reason is looked at once, so the
    work grows with the distinct reasons, not with the rows."""
    distinct, inverse, per = np.unique(raw, return_inverse=True, return_counts=True)
    kinds = {}  # kind -> [rows, [the values of each slot]]
    kind_of = []  # per distinct reason
    several = 0
    for r, n in zip(distinct, per):
        why = text(r).strip()
        if not why:
            why = NO_REASON.get(status, f"{status}, no reason given")
        several += int(n) if "\n" in why else 0
        kind, values = reason_kind(why)
        entry = kinds.setdefault(kind, [0, [[] for _ in values]])
        entry[0] += int(n)
        for slot, v in zip(entry[1], values):
            slot.append(v)
        kind_of.append(kind)
    out = []
    for kind, (n, slots) in kinds.items():
        pieces = kind.split(SLOT)
        label = pieces[0] + "".join(_spread(v) + piece for v, piece in zip(slots, pieces[1:]))
        if len(label) > MAX_REASON_WIDTH:
            label = label[:MAX_REASON_WIDTH - 3] + "..."
        out.append((n, label, kind))
    out.sort(key=lambda x: (-x[0], x[1]))
    at = {kind: j for j, (_, _, kind) in enumerate(out)}
    kind_of_row = np.array([at[k] for k in kind_of], dtype=np.int64)[inverse.reshape(-1)]
    return [(n, label) for n, label, _ in out], several, kind_of_row


def render(ix):
    """The index in at most MAX_LINES lines: the counts per status, the
    fastest complete points (and further ones on the Pareto front), then
    the others per status grouped by their reason, with counts that add up
    to the status's rows."""
    p = ix.points
    st = texts(p["status"])  # each column decoded once, the rows shown looked up in it
    point = p["point"]
    statuses = [s for s in STATUSES if (st == s).any()] + sorted(set(np.unique(st)) - set(STATUSES))
    done = np.flatnonzero(st == "complete")
    kind = f"plan on machine {ix.machine} (predicted)" if ix.schema == "strata-plan" else "sweep"
    out = [f"{kind} '{ix.name}' ({ix.path}): {count(len(st))} point(s): "
           + ", ".join(f"{count((st == s).sum())} {s}" for s in statuses),
           f"axes: {ix.axes}" + (f" | where: {ix.where}" if ix.where else "")]
    if ix.status == "interrupted":
        reached = (f": {ix.layouts_judged} of {ix.layouts} layouts judged, the rest not reached"
                   if ix.layouts is not None and ix.layouts_judged is not None else "")
        out.insert(1, f"INTERRUPTED by {ix.interrupted_by or 'a signal'}{reached}")
    elif ix.layouts is not None and ix.layouts_judged is not None:
        pruned = f", {count(ix.layouts_pruned)} pruned (one row each)" if ix.layouts_pruned is not None else ""
        out.append(f"layouts: {count(ix.layouts)} enumerated, {count(ix.layouts_judged)} judged{pruned}")
    if len(done):
        tp, mem = p["tokens_per_s"], p["peak_bytes"]
        front = pareto(tp[done], mem[done])
        on_front = set(front)
        # run.repeats: the median of the runs, and their spread.
        runs = p["runs"] if "runs" in p.dtype.names else np.ones(len(st), dtype=int)
        repeated = bool((runs[done] > 1).any())
        spread_head = f" {'runs':>4} {'spread':>7}" if repeated else ""
        by_tp = np.argsort(-tp[done], kind="stable")
        best = list(by_tp[:MAX_BEST])
        # The front's points past the fastest: slower, on less memory.
        rest_front = [k for k in by_tp[MAX_BEST:] if k in on_front][:MAX_FRONT]
        out += ["", "complete points by throughput (* on the Pareto front of throughput and peak memory"
                + ("; medians over the runs, spread = (max - min) / median of the step time" if repeated else "")
                + ")" + (f": the fastest {len(best)} of {count(len(done))}" if len(best) < len(done) else ""),
                f"  {'point':>5} {'ranks':>5} {'tokens/s':>10} {'MFU%':>6} {'step_ms':>9}{spread_head} {'peak mem':>11}"
                "  overrides"]

        def row(k):
            i = done[k]
            spread = (f" {runs[i]:>4} {100 * p['step_time_spread'][i]:>6.1f}%"
                      if "step_time_spread" in p.dtype.names else f" {runs[i]:>4} {'':>7}") if repeated else ""
            return (f"{'*' if k in on_front else ' '} {point[i]:>5} {p['world'][i]:>5} {tp[i]:>10.0f} "
                    f"{100 * p['mfu'][i]:>6.1f} {1e3 * p['step_time'][i]:>9.2f}{spread} {fmt_bytes(mem[i]):>11}  "
                    f"{text(p['overrides'][i])}")

        out += [row(k) for k in best]
        if rest_front:
            more_front = len([k for k in by_tp[MAX_BEST:] if k in on_front])
            out.append("  further on the Pareto front (slower, less memory)"
                       + (f": {len(rest_front)} of {more_front}" if len(rest_front) < more_front else ""))
            out += [row(k) for k in rest_front]
        unlisted = len(done) - len(best) - len(rest_front)
        if unlisted:
            out.append(f"  and {count(unlisted)} more complete point(s): all of them in "
                       "strata_report.Index(path).table(), drawn by --plots")
    others = [s for s in statuses if s != "complete"]
    for n_left, s in zip(range(len(others), 0, -1), others):
        idx = np.flatnonzero(st == s)
        kinds, several, kind_of_row = reasons(p["reason"][idx], s)
        # What is left of MAX_LINES, shared among the statuses still to
        # print: each a blank line, its heading, its reasons and one line
        # for the rest.
        room = max(1, min(MAX_REASONS, (MAX_LINES - len(out)) // n_left - 3))
        shown = kinds if len(kinds) <= room else kinds[:room - 1]
        out += ["", f"{count(len(idx))} {s}, by reason"
                + (f" (the first problem each gives; {count(several)} give more than one)" if several else "") + ":"]
        # A failed run's point is one to go and look at (its log); a
        # skipped point's reason says all there is.
        named = s != "skipped"
        for j, (n, label) in enumerate(shown):
            where = ""
            if named:
                pts = point[idx[kind_of_row == j]]
                where = (" (point" + ("s " if len(pts) > 1 else " ") + ", ".join(str(x) for x in pts[:MAX_POINTS_NAMED])
                         + (", ..." if len(pts) > MAX_POINTS_NAMED else "") + ")")
            out.append(f"  {count(n):>7}  {label}{where}")
        if len(shown) < len(kinds):
            rest = kinds[len(shown):]
            out.append(f"  {count(sum(n for n, _ in rest)):>7}  and {len(rest)} more reason(s)")
    return "\n".join(out)


def plot(ix, directory):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outputs.check([("the index", ix.path)], dirs=[("plots directory", directory, [PLOT_FILE])])
    os.makedirs(directory, exist_ok=True)
    done = np.flatnonzero(ix.points["status"] == b"complete")
    tp, mem_bytes = ix.points["tokens_per_s"][done], ix.points["peak_bytes"][done]
    try:
        capacity = max(0.0, float(ix.memory_limit or 0))
    except (TypeError, ValueError):
        capacity = 0.0
    div, unit = byte_unit(max(mem_bytes.max(initial=0), capacity))
    mem = mem_bytes / div
    point = ix.points["point"][done]
    bars = min(len(done), MAX_BARS)  # the fastest points: past that, a bar chart is too tall to read
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 0.35 * max(bars, 4) + 2),
                                 gridspec_kw={"width_ratios": [1, 1.3]})
    front = pareto(tp, mem) if len(done) else []
    order = np.argsort(tp, kind="stable")[len(done) - bars:]
    a1.scatter(mem, tp, color="#4c72b0", s=12 if len(done) > 100 else 36, label="point")
    if front:
        a1.plot(mem[front], tp[front], "-o", color="#c44e52", label="Pareto front")
    if capacity:
        a1.axvline(capacity / div, color="#c44e52", ls="--", lw=1, label=f"device capacity ({human_bytes(capacity)})")
    # The points named: the front and the bars' (a plan has hundreds).
    for k in sorted(set(front) | set(order.tolist())):
        a1.annotate(str(point[k]), (mem[k], tp[k]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    a1.set_xlabel(f"peak memory of the largest rank ({unit}, "
                  + ("the most held at once)" if ix.schema == "strata-plan" else "sum of category peaks)"))
    a1.set_ylabel("tokens/s")
    a1.set_title("throughput against memory (higher and further left is better)", fontsize=10)
    a1.legend(fontsize=8)
    # Each bar's overrides written on it, not beside it: beside it, a plan's
    # dozen keys would squeeze the other picture to a sliver.
    labels = short_overrides([text(ix.points["overrides"][done[k]]) for k in order])
    a2.barh(range(bars), tp[order], color=["#c44e52" if k in front else "#4c72b0" for k in order], alpha=0.45)
    for y, label in enumerate(labels):
        a2.text(0, y, " " + label, va="center", ha="left", fontsize=7)
    a2.set_yticks(range(bars))
    a2.set_yticklabels([str(point[k]) for k in order], fontsize=7)
    a2.set_ylabel("point")
    a2.set_xlabel("tokens/s")
    a2.set_title("throughput per point (red: on the Pareto front)"
                 + (f": the fastest {bars} of {len(done)}" if bars < len(done) else ""), fontsize=10)
    fig.tight_layout()
    path = os.path.join(directory, PLOT_FILE)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]

"""Runs side by side: where their configurations differ, and their headline
figures, as a text table, JSON or CSV (for CI)."""
import csv
import io
import json

from .read import text
from .summary import comm_per_axis_op, fmt_bytes


def schedule(rep):
    p = rep.array("summary/pipeline")
    return text(p["schedule"][0]) if len(p) and p["stages"][0] > 1 else "-"


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(reps):
    """{section.key: [value per report]} for every key whose value is not the
    same in all of them (a key a report lacks is None there)."""
    flat = [flatten(r.config) for r in reps]
    keys = sorted(set().union(*flat))
    return {k: [f.get(k) for f in flat] for k in keys if len({repr(f.get(k)) for f in flat}) > 1}


def figures(rep):
    """[(name, value, format)]: the report's own headline figures (/summary),
    so that compare, strata-report and the sweep table say the same."""
    s = rep.summary
    exposed = sum(r[7] for r in comm_per_axis_op(rep))
    return [
        ("status", rep.status, None),
        ("simulated on", text(rep.attrs.get("machine", "")) if rep.simulated else "no (measured)", None),
        ("layout", s.get("layout", "?"), None),
        ("strategy", s.get("strategy", "?"), None),
        ("precision", s.get("precision", "fp32"), None),
        ("schedule", schedule(rep), None),
        ("ranks", rep.world, None),
        ("tokens/s", s.get("tokens_per_s", 0.0), "{:.0f}"),
        ("tokens/s per device", s.get("tokens_per_s_per_device", s.get("tokens_per_s", 0.0) / max(rep.world, 1)),
         "{:.0f}"),
        ("MFU %", 100 * s.get("mfu", 0.0), "{:.1f}"),
        ("median step ms (slowest rank)", 1e3 * s.get("step_time", 0.0), "{:.2f}"),
        ("final loss", s.get("final_loss", float("nan")), "{:.4f}"),
        ("largest rank peak (sum of category peaks)", s.get("peak_bytes_total", 0.0), "bytes"),
        ("exposed comm per rank ms", 1e3 * exposed, "{:.2f}"),
    ]


def _label(i):
    return chr(ord("A") + i) if i < 26 else f"R{i}"


def render(reps, fmt="text"):
    """The reports side by side: fmt "text" (a table, ratios to the first),
    "json" or "csv"."""
    diffs = config_differences(reps)
    figs = [figures(r) for r in reps]
    names = [n for n, _, _ in figs[0]]
    if fmt == "json":
        return json.dumps({"reports": [r.path for r in reps], "config_differences": diffs,
                           "figures": {n: [f[i][1] for f in figs] for i, n in enumerate(names)}}, indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["field"] + [r.path for r in reps])
        for k, vs in diffs.items():
            w.writerow([f"config:{k}"] + ["" if v is None else v for v in vs])
        for i, n in enumerate(names):
            w.writerow([n] + [f[i][1] for f in figs])
        return buf.getvalue().rstrip("\n")
    width = 20
    out = [f"{_label(i)}  {r.path}" for i, r in enumerate(reps)]
    head = "".join(f"{_label(i):>{width}}" for i in range(len(reps)))
    ratios = "".join(f"{_label(i) + ' / A':>10}" for i in range(1, len(reps)))
    out += ["", "configuration differences" if diffs else "configuration: the same in every report"]
    for k, vs in diffs.items():
        out.append(f"  {k:<42}" + "".join(f"{'-' if v is None else str(v):>{width}}" for v in vs))
    out += ["", f"{'':<44}{head}{ratios}"]
    for i, n in enumerate(names):
        f = figs[0][i][2]
        vals = [fg[i][1] for fg in figs]
        if f is None:
            out.append(f"{n:<44}" + "".join(f"{str(v):>{width}}" for v in vals))
            continue
        cells = [fmt_bytes(v) if f == "bytes" else f.format(v) for v in vals]
        rat = "".join(f"{v / vals[0]:>10.3f}" if vals[0] else f"{'-':>10}" for v in vals[1:])
        out.append(f"{n:<44}" + "".join(f"{c:>{width}}" for c in cells) + rat)
    return "\n".join(out)

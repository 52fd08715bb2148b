"""Runs side by side: where their configurations differ, and their headline
figures, as a text table, JSON or CSV (for CI)."""
import csv
import io
import json

import numpy as np

from .read import text, texts
from .summary import comm_per_axis_op, fmt_bytes, fmt_flops, span_compute


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


def _ms(x):
    return f"{1e3 * x:.2f}"


# The headline figures, one row each: (key, label, unit, shown): the key and
# SI unit name the figure in JSON and CSV; the label and shown (a value to
# text) in the text table; shown None: the value as it is.
FIELDS = [
    ("status", "status", None, None),
    ("simulated_on", "simulated on", None, None),
    ("layout", "layout", None, None),
    ("strategy", "strategy", None, None),
    ("precision", "precision", None, None),
    ("schedule", "schedule", None, None),
    ("ranks", "ranks", "1", None),
    ("tokens_per_s", "tokens/s", "token/s", "{:.0f}".format),
    ("tokens_per_s_per_device", "tokens/s per device", "token/s", "{:.0f}".format),
    ("mfu", "MFU %", "1", lambda x: f"{100 * x:.1f}"),
    ("peak_flops_per_device", "peak per device (MFU's divisor)", "FLOP/s", fmt_flops),
    ("step_time_s", "median step ms (slowest rank)", "s", _ms),
    ("final_loss", "final loss", "nats/token", "{:.4f}".format),
    ("peak_memory_bytes", "largest rank peak (sum of category peaks)", "B", fmt_bytes),
    ("exposed_comm_s", "exposed comm per rank and step ms", "s", _ms),
]
UNITS = {k: u for k, _, u, _ in FIELDS if u is not None}


def figures(rep):
    """{key: value}: the report's own headline figures (/summary), so that
    compare, strata-report and the sweep table say the same; SI units, as
    UNITS."""
    s = rep.summary
    return {
        "status": rep.status,
        "simulated_on": text(rep.attrs.get("machine", "")) if rep.simulated else "no (measured)",
        "layout": s.get("layout", "?"),
        "strategy": s.get("strategy", "?"),
        "precision": s.get("precision", "fp32"),
        "schedule": schedule(rep),
        "ranks": rep.world,
        "tokens_per_s": s.get("tokens_per_s", 0.0),
        "tokens_per_s_per_device": s.get("tokens_per_s_per_device", s.get("tokens_per_s", 0.0) / max(rep.world, 1)),
        "mfu": s.get("mfu", 0.0),
        "peak_flops_per_device": s.get("peak_flops_per_device", s.get("peak_flops", 0.0) / max(rep.world, 1)),
        "step_time_s": s.get("step_time", 0.0),
        "final_loss": s.get("final_loss", float("nan")),
        "peak_memory_bytes": s.get("peak_bytes_total", 0.0),
        # /summary/comm sums the measured steps (a simulation's one): per
        # step, so that a run and its prediction compare.
        "exposed_comm_s": sum(r[7] for r in comm_per_axis_op(rep)) / max(1.0, float(s.get("measured_steps", 1.0))),
    }


def peaks_differ(reps, figs):
    """The line that says MFU divides by different peaks, or None."""
    peaks = [f["peak_flops_per_device"] for f in figs]
    if max(peaks) <= 0 or (max(peaks) - min(peaks)) <= 1e-9 * max(peaks):
        return None
    each = ", ".join(f"{_label(i)} {fmt_flops(p)} ({f['precision']})" for i, (p, f) in enumerate(zip(peaks, figs)))
    return (f"note: MFU divides by a different peak per report ({each}): its ratio is not the ratio of "
            f"throughput; compare tokens/s")


def _label(i):
    return chr(ord("A") + i) if i < 26 else f"R{i}"


def phase_figures(rep):
    """{(figure, stage): value}: the step time (stage -1) and, per pipeline
    stage, its compute per phase (span_compute: the step's spans less the
    waits inside them), its exposed communication per axis (the step's summed
    /comm wait), each the median over measured steps and the mean over the
    stage's ranks, and its bubble (/summary/pipeline). Seconds, the bubble a
    share of the step."""
    out = {("step time s", -1): rep.summary.get("step_time", 0.0)}
    rk = rep.array("ranks")
    stage = {int(r["rank"]): int(r["pp"]) if "pp" in rk.dtype.names else 0 for r in rk}
    s = rep.measured_steps()
    steps = set(int(k) for k in np.unique(s["step"])) if len(s) else set()
    sums = {}  # (figure, stage) -> {rank: {step: seconds}}

    def add(figure, ranks, steps_, values):
        for r, k, v in zip(ranks, steps_, values):
            r, k = int(r), int(k)
            if k in steps and r in stage:
                cell = sums.setdefault((figure, stage[r]), {}).setdefault(r, {})
                cell[k] = cell.get(k, 0.0) + float(v)

    tl = rep.array("timeline")
    if len(tl):
        phases = texts(tl["phase"])
        compute = span_compute(rep)
        for ph in np.unique(phases):
            sel = phases == ph
            add(f"compute {ph} s", tl["rank"][sel], tl["step"][sel], compute[sel])
    cm = rep.array("comm")
    if len(cm):
        axes = texts(cm["axis"])
        for ax in np.unique(axes):
            sel = axes == ax
            add(f"exposed comm {ax} s", cm["rank"][sel], cm["step"][sel], cm["wait"][sel])
    for (figure, st), per_rank in sums.items():
        ranks = sorted(per_rank)
        medians = [float(np.median([per_rank[r].get(k, 0.0) for k in sorted(steps)])) for r in ranks]
        w = rep.weights(ranks)
        out[(figure, st)] = float((np.array(medians) * w).sum() / w.sum()) if w.sum() > 0 else 0.0
    pipe = rep.array("summary/pipeline")
    if len(pipe) and pipe["stages"].max() > 1:
        for st in np.unique(pipe["pp_rank"]):
            sel = pipe["pp_rank"] == st
            w = rep.weights(pipe["rank"][sel])
            out[("bubble", int(st))] = float((pipe["bubble"][sel] * w).sum() / w.sum()) if w.sum() > 0 else 0.0
    return out


def predictions(reps):
    """[(predicted report's index, measured's index, [(figure, stage,
    measured, predicted, error)])]: each simulated report against the first
    measured one, phase by phase, over the figures both have; error =
    (predicted - measured) / measured."""
    measured = [i for i, r in enumerate(reps) if not r.simulated]
    if not measured:
        return []
    m = measured[0]
    mf = phase_figures(reps[m])
    out = []
    for i, r in enumerate(reps):
        if not r.simulated:
            continue
        pf = phase_figures(r)
        keys = sorted(set(mf) & set(pf), key=lambda k: (k[1], k[0]))
        rows = [(f, st, mf[(f, st)], pf[(f, st)], (pf[(f, st)] - mf[(f, st)]) / mf[(f, st)] if mf[(f, st)] else None)
                for f, st in keys]
        out.append((i, m, rows))
    return out


def finite(x):
    """x with every NaN or infinity (a simulation's loss) as None: JSON has
    no such numbers, and strict parsers refuse them."""
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    if isinstance(x, (float, np.floating)) and not np.isfinite(x):
        return None
    return x


def render(reps, fmt="text"):
    """The reports side by side: fmt "text" (a table, ratios to the first),
    "json" (one object per report, snake_case keys, the units alongside) or
    "csv" (one row per report)."""
    diffs = config_differences(reps)
    figs = [figures(r) for r in reps]
    if fmt == "json":
        return json.dumps(finite({"units": UNITS, "reports": [
            {"path": r.path, **f, "config": {k: vs[i] for k, vs in diffs.items()}}
            for i, (r, f) in enumerate(zip(reps, figs))],
            "predictions": [{"predicted": reps[i].path, "measured": reps[m].path, "figures": [
                {"figure": f, "stage": st, "measured": a, "predicted": b, "error": e} for f, st, a, b, e in rows]}
                for i, m, rows in predictions(reps)]}), indent=2, allow_nan=False)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        keys = [k for k, _, _, _ in FIELDS]
        w.writerow(["path"] + [f"{k} [{UNITS[k]}]" if k in UNITS else k for k in keys]
                   + [f"config.{k}" for k in diffs])
        for i, (r, f) in enumerate(zip(reps, figs)):
            w.writerow([r.path] + [f[k] for k in keys] + ["" if vs[i] is None else vs[i] for vs in diffs.values()])
        return buf.getvalue().rstrip("\n")
    width = 20
    out = [f"{_label(i)}  {r.path}" for i, r in enumerate(reps)]
    head = "".join(f"{_label(i):>{width}}" for i in range(len(reps)))
    ratios = "".join(f"{_label(i) + ' / A':>10}" for i in range(1, len(reps)))
    out += ["", "configuration differences" if diffs else "configuration: the same in every report"]
    for k, vs in diffs.items():
        out.append(f"  {k:<42}" + "".join(f"{'-' if v is None else str(v):>{width}}" for v in vs))
    out += ["", f"{'':<44}{head}{ratios}"]
    for key, label, _, shown in FIELDS:
        vals = [f[key] for f in figs]
        if shown is None:
            out.append(f"{label:<44}" + "".join(f"{str(v):>{width}}" for v in vals))
            continue
        rat = "".join(f"{v / vals[0]:>10.3f}" if vals[0] else f"{'-':>10}" for v in vals[1:])
        out.append(f"{label:<44}" + "".join(f"{shown(v):>{width}}" for v in vals) + rat)
    note = peaks_differ(reps, figs)
    if note:
        out += ["", note]
    for i, m, rows in predictions(reps):
        out += ["", f"prediction against measurement, phase by phase: {_label(i)} (simulated) against {_label(m)} "
                    f"(measured); error = (predicted - measured) / measured",
                f"  {'figure':<32}{'stage':>6}{'measured':>14}{'predicted':>14}{'error':>9}"]
        for f, st, a, b, e in rows:
            shown = (lambda x: f"{100 * x:.1f}%") if f == "bubble" else (lambda x: f"{1e3 * x:.3f} ms")
            out.append(f"  {f.removesuffix(' s'):<32}"
                       f"{'-' if st < 0 else st:>6}{shown(a):>14}{shown(b):>14}"
                       f"{'-' if e is None else f'{100 * e:+.1f}%':>9}")
    return "\n".join(out)

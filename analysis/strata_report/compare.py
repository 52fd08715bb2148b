"""Two runs side by side: their layouts and headline figures, and the ratio."""
import numpy as np

from .read import text
from .summary import comm_per_axis_op, fmt_bytes, memory_per_rank, step_times


def schedule(rep):
    p = rep.table("summary/pipeline")
    return text(p["schedule"][0]) if len(p) and p["stages"][0] > 1 else "-"


def figures(rep):
    s = rep.summary
    times = step_times(rep)
    mem = memory_per_rank(rep)
    peak = max((sum(p.values()) for _, p in mem.values()), default=0)
    exposed = sum(r[7] for r in comm_per_axis_op(rep))
    return [
        ("status", rep.status, None),
        ("simulated on", text(rep.attrs.get("machine", "")) if int(rep.attrs.get("simulated", 0)) == 1 else "no (measured)",
         None),
        ("layout", s.get("layout", "?"), None),
        ("strategy", s.get("strategy", "?"), None),
        ("precision", s.get("precision", "fp32"), None),
        ("schedule", schedule(rep), None),
        ("ranks", rep.world, None),
        ("tokens/s", s.get("tokens_per_s", 0.0), "{:.0f}"),
        ("MFU %", 100 * s.get("mfu", 0.0), "{:.1f}"),
        ("median step ms", 1e3 * float(np.median(times)) if len(times) else 0.0, "{:.2f}"),
        ("final loss", s.get("final_loss", float("nan")), "{:.4f}"),
        ("largest rank peak (sum of category peaks)", peak, "bytes"),
        ("exposed comm per rank ms", 1e3 * exposed, "{:.2f}"),
    ]


def render(a, b):
    fa, fb = figures(a), figures(b)
    out = [f"A  {a.path}", f"B  {b.path}", "", f"{'':<44}{'A':>22}{'B':>22}{'B / A':>10}"]
    for (name, va, f), (_, vb, _) in zip(fa, fb):
        if f is None:
            out.append(f"{name:<44}{str(va):>22}{str(vb):>22}")
            continue
        sa = fmt_bytes(va) if f == "bytes" else f.format(va)
        sb = fmt_bytes(vb) if f == "bytes" else f.format(vb)
        ratio = f"{vb / va:.3f}" if va else "-"
        out.append(f"{name:<44}{sa:>22}{sb:>22}{ratio:>10}")
    return "\n".join(out)

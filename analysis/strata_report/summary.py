"""The summary of one run as text tables."""
import numpy as np

from .read import merge_ranges, ranges_label, text, texts

CATEGORIES = ["params", "grads", "optimizer", "activations", "workspace", "comm"]
# The most terms span_compute and layer_times hold in one array (32 MiB of
# floats): beyond it they work in blocks.
BLOCK = 1 << 22


def fmt_bytes(b):
    b = float(b)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.2f} {unit}"
        b /= 1024


BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def byte_unit(b):
    """(divisor, unit) that writes `b` bytes as a number under 1000 in the
    largest unit it needs (B below 1000 B; TiB past that)."""
    b = abs(float(b))
    for k, unit in enumerate(BYTE_UNITS):
        # Rounded to 3 significant figures, as human_bytes writes it.
        if float(f"{b / 1024 ** k:.3g}") < 1000 or unit == BYTE_UNITS[-1]:
            return 1024 ** k, unit
    return 1024 ** (len(BYTE_UNITS) - 1), BYTE_UNITS[-1]


def human_bytes(b):
    """Bytes to 3 significant figures in their unit: 16 B, 1.50 KiB,
    126 GiB, 0.977 MiB (not 1000 KiB). For pictures, whose labels must be
    short and never read "0.00 MiB"."""
    div, unit = byte_unit(b)
    v = float(b) / div
    if unit == "B":
        return f"{v:.0f} B"
    r = abs(float(f"{v:.3g}"))
    digits = 0 if r >= 100 or r == 0 else 1 if r >= 10 else 2 if r >= 1 else 3
    return f"{v:.{digits}f} {unit}"


def fmt_flops(x):
    """FLOP/s in engineering units: 285.49 PFLOP/s, 7.78 GFLOP/s."""
    x = float(x)
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} FLOP/s"


def runs(keys):
    """(order, starts, counts): `order` sorts the rows by `keys` (a column,
    or a list of columns, the first the major one), stably, so that a
    group's rows keep their order; `starts` and `counts` locate each group
    of equal keys in that order (cuts). Sorting once and cutting it into
    runs is n log n in rows, where a mask per group is rows x groups."""
    keys = [keys] if isinstance(keys, np.ndarray) else list(keys)
    order = np.lexsort(keys[::-1]) if len(keys[0]) else np.zeros(0, dtype=np.int64)
    return (order, *cuts([k[order] for k in keys]))


def cuts(keys):
    """(starts, counts) of the runs of equal rows of `keys` (a column, or a
    list of columns), which are in order already."""
    keys = [keys] if isinstance(keys, np.ndarray) else list(keys)
    n = len(keys[0])
    new = np.zeros(n, dtype=bool)
    new[:1] = True
    for k in keys:
        new[1:] |= k[1:] != k[:-1]
    starts = np.flatnonzero(new)
    return starts, np.diff(np.append(starts, n))


def sums(values, counts):
    """The sums of consecutive runs of `values`, counts[i] of them in run i,
    each bit for bit what values[run].sum() gives: numpy sums an array
    pairwise, not one value after another as np.add.at, bincount and
    reduceat do, so the runs of one length are summed as the rows of a
    matrix (a row's sum along axis 1 is its sum alone)."""
    values = np.asarray(values)
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(counts) - counts
    out = np.zeros(len(counts), dtype=values[:0].sum().dtype)
    for n in np.unique(counts[counts > 0]):
        at = np.flatnonzero(counts == n)
        out[at] = values[starts[at][:, None] + np.arange(n)].sum(axis=1)
    return out


def step_times(rep):
    """Per measured step, the slowest rank's time (the step ends for all then)."""
    s = rep.measured_steps()
    if len(s) == 0:
        return np.zeros(0)
    order, starts, _ = runs(s["step"])
    return np.maximum.reduceat(s["step_time"][order], starts)


def memory_per_rank(rep, pool="device"):
    """{rank: (held at the end of the last step, peak over the run)} per category, in one pool: the
    device, or the host arena optimizer offload uses (reports before the pool column are all device)."""
    m = rep.array("memory")
    out = {}
    if len(m) == 0:
        return out
    # Strings compared as the file's bytes: as decoding every row would, at
    # a fraction of the cost on a long run's table.
    if "pool" in m.dtype.names:
        m = m[m["pool"] == pool.encode()]
    elif pool != "device":
        return out
    if len(m) == 0:
        return out
    cats = m["category"]
    at_last = m["step"] == m["step"].max()
    ranks, rank_of = np.unique(m["rank"], return_inverse=True)
    held, peak = {}, {}
    for c in CATEGORIES:
        sel = cats == c.encode()
        held[c] = np.zeros(len(ranks), dtype=m["current_bytes"][:0].sum().dtype)
        np.add.at(held[c], rank_of[sel & at_last], m["current_bytes"][sel & at_last])
        peak[c] = np.zeros(len(ranks), dtype=m["peak_bytes"].dtype)
        np.maximum.at(peak[c], rank_of[sel], m["peak_bytes"][sel])
    for i, r in enumerate(ranks):
        out[int(r)] = ({c: int(held[c][i]) for c in CATEGORIES}, {c: int(peak[c][i]) for c in CATEGORIES})
    return out


def pool_peaks(rep, pool="device"):
    """{rank: bytes}: the most bytes of the pool each rank (or class) held
    at once over the run (/memory's pool_peak_bytes), what a device's
    capacity is compared with; in a report without that column, the sum of
    its categories' peaks, which bounds it from above."""
    m = rep.array("memory")
    if len(m) and "pool" in m.dtype.names:
        m = m[m["pool"] == pool.encode()]
    elif pool != "device":
        return {}
    if len(m) == 0:
        return {}
    if "pool_peak_bytes" not in m.dtype.names:
        return {r: sum(peak.values()) for r, (_, peak) in memory_per_rank(rep, pool).items()}
    ranks, rank_of = np.unique(m["rank"], return_inverse=True)
    top = np.zeros(len(ranks), dtype=m["pool_peak_bytes"].dtype)
    np.maximum.at(top, rank_of.reshape(-1), m["pool_peak_bytes"])
    return {int(r): int(v) for r, v in zip(ranks, top)}


def memory_capacity(rep):
    """Bytes of device memory per device the report was judged against
    (root attribute memory_capacity: the machine's, or the deck's
    backend.memory_limit where lower), 0 where unknown."""
    try:
        return max(0, int(rep.attrs.get("memory_capacity", 0)))
    except (TypeError, ValueError):
        return 0


def fit_line(rep):
    """Whether a prediction fits, as one line, or None where the report does
    not say (a measured run, or a report from before root attribute fits):
    the largest device peak against the capacity per device, the ranks
    over it, and by how much; or the host arena against
    backend.host_memory_limit, which an estimate also judges."""
    if "fits" not in rep.attrs:
        return None
    try:
        fits = int(rep.attrs["fits"]) == 1
    except (TypeError, ValueError):
        return None
    capacity = memory_capacity(rep)
    peaks = pool_peaks(rep)
    backend = rep.config.get("backend", {}) if isinstance(rep.config.get("backend"), dict) else {}
    whose = ("backend.memory_limit" if capacity and backend.get("memory_limit") == capacity
             else f"machine {rep.attrs['machine']}" if capacity and rep.attrs.get("machine") else "")
    per_device = f"the {human_bytes(capacity)} per device" + (f" of {whose}" if whose else "")
    if peaks:
        top = max(peaks, key=lambda r: (peaks[r], -r))
        peak, where = peaks[top], rep.rank_label(top, 30)
    if not fits:
        if peaks and capacity and peak > capacity:
            over = sum(rep.members(r) for r, v in peaks.items() if v > capacity)
            return (f"DOES NOT FIT: device peak {human_bytes(peak)} on {where} exceeds {per_device} by "
                    f"{human_bytes(peak - capacity)}"
                    + (f"; {over} of {rep.world} ranks are over it" if over > 1 else ""))
        host, host_limit = pool_peaks(rep, "host"), backend.get("host_memory_limit", 0)
        if host and isinstance(host_limit, int) and 0 < host_limit < max(host.values()):
            r = max(host, key=lambda k: (host[k], -k))
            return (f"DOES NOT FIT: host arena peak {human_bytes(host[r])} on {rep.rank_label(r, 30)} exceeds "
                    f"backend.host_memory_limit = {human_bytes(host_limit)} by {human_bytes(host[r] - host_limit)}")
        return "DOES NOT FIT (as the report says)" + (
            f": device peak {human_bytes(peak)} on {where}" + (f", {per_device}" if capacity else "") if peaks else "")
    if not peaks:
        return "fits" + (f" {per_device}" if capacity else "")
    if not capacity:
        return f"fits: device peak {human_bytes(peak)} on {where} (no device capacity given)"
    return (f"fits: device peak {human_bytes(peak)} on {where}, within {per_device}, "
            f"{human_bytes(capacity - peak)} spare")


def mean(x, w):
    """The mean of x weighted by w (each row's ranks)."""
    return float((np.asarray(x, dtype=float) * w).sum() / w.sum()) if w.sum() > 0 else 0.0


def comm_per_axis_op(rep, size=fmt_bytes):
    """[(axis, op, group, ranks, mean calls, mean bytes, mean time, mean wait, mean peer wait, mean busbw,
    mean hidden, mean group wait)] over the ranks that issued the op (from /summary/comm; a class's row counts
    for each of its ranks). Where the report has message-size classes, each is its own row and its op reads
    "all_reduce <=4.00 MiB" (`size` writes the bytes)."""
    c = rep.array("summary/comm")
    rows = []
    if len(c) == 0:
        return rows
    axes = texts(c["axis"])
    ops = texts(c["op"])
    sizes = c["size_class"] if "size_class" in c.dtype.names else np.full(len(c), -1)
    seen = []
    for a, o, g, k in zip(axes, ops, c["group_size"], sizes):
        if (a, o, g, k) in seen:
            continue
        seen.append((a, o, g, k))
        sel = (axes == a) & (ops == o) & (c["group_size"] == g) & (sizes == k)
        t = c[sel]
        w = rep.weights(t["rank"])
        peer = mean(t["peer_wait"], w) if "peer_wait" in t.dtype.names else 0.0
        label = o if k < 0 else f"{o} <={size(float(k))}"
        late = mean(t["group_wait"], w) if "group_wait" in t.dtype.names else 0.0
        rows.append((a, label, int(g), int(w.sum()), mean(t["count"], w), mean(t["bytes"], w), mean(t["time"], w),
                     mean(t["wait"], w), peer, mean(t["busbw"], w), mean(t["hidden_fraction"], w), late))
    return rows


def moe_per_step(rep):
    """[(step, auxiliary loss, load imbalance, drop rate)] per measured step:
    the mean over ranks of /steps' MoE columns (empty for a dense model)."""
    s = rep.measured_steps()
    if len(s) == 0 or "drop_rate" not in s.dtype.names or len(rep.array("experts")) == 0:
        return []
    order, starts, counts = runs(s["step"])
    s = s[order]
    w = rep.weights(s["rank"])
    den = sums(w, counts)

    def per_step(col):
        """mean(col's rows of a step, their weights), for every step at once."""
        num = sums(np.asarray(s[col], dtype=float) * w, counts)
        return [float(a / b) if b > 0 else 0.0 for a, b in zip(num, den)]

    return list(zip((int(k) for k in s["step"][starts]), per_step("moe_aux_loss"), per_step("load_imbalance"),
                    per_step("drop_rate")))


def expert_load(rep):
    """{layer: [(expert, share of the block's assignments, share of its own
    assignments dropped)]} over the measured steps and every rank. Shares,
    so that tensor-parallel ranks recording the same routing count alike."""
    e = rep.array("experts")
    if len(e) == 0:
        return {}
    s = rep.measured_steps()
    steps = np.unique(s["step"]) if len(s) else np.unique(e["step"])
    e = e[np.isin(e["step"], steps)]
    w = rep.weights(e["rank"])
    out = {}
    for layer in np.unique(e["layer"]):
        at = e["layer"] == layer
        b, wb = e[at], w[at]
        total = max(int((b["tokens_routed"] * wb).sum()), 1)
        rows = []
        for x in np.unique(b["expert"]):
            r, wr = b[b["expert"] == x], wb[b["expert"] == x]
            routed, dropped = int((r["tokens_routed"] * wr).sum()), int((r["tokens_dropped"] * wr).sum())
            rows.append((int(x), routed / total, dropped / routed if routed else 0.0))
        out[int(layer)] = rows
    return out


def span_compute(rep):
    """Per /timeline row, its span less the communication waits inside it
    (a blocking call waits over its whole span, a non-blocking one at its
    end, for its `wait`): the span's own compute. A span's waits are another
    rank's lateness or a transfer, not the layer's work."""
    tl, cm = rep.array("timeline"), rep.array("comm")
    out = (tl["end"] - tl["start"]).astype(float) if len(tl) else np.zeros(0)
    if len(tl) == 0 or len(cm) == 0:
        return out
    w0 = np.where(cm["nonblocking"] != 0, cm["end"] - cm["wait"], cm["start"])
    key_c = cm["rank"].astype(np.int64) * (1 << 32) + cm["step"].astype(np.int64)
    key_t = tl["rank"].astype(np.int64) * (1 << 32) + tl["step"].astype(np.int64)
    # The waits' union per (rank, step): calls waited for together overlap,
    # and a moment blocked counts once.
    u0, u1, ukey = unions(key_c, w0, cm["end"])
    if len(ukey) == 0:
        return np.maximum(out, 0.0)
    ufirst, ucount = cuts(ukey)  # a run per (rank, step): its intervals
    ukeys = ukey[ufirst]
    order, first, count = runs(key_t)  # the spans of each (rank, step), in row order
    tkeys = key_t[order][first]
    at = np.minimum(np.searchsorted(ukeys, tkeys), len(ukeys) - 1)
    waited = np.flatnonzero(ukeys[at] == tkeys)  # the (rank, step)s that waited at all
    first, count, ufirst, ucount = first[waited], count[waited], ufirst[at[waited]], ucount[at[waited]]
    # Each (rank, step)'s spans against its intervals, a matrix of their
    # overlaps summed along each span's row, as a loop per (rank, step)
    # would: the same terms in the same order, so the same sums. The
    # (rank, step)s of one shape (spans x intervals: a run's steps mostly
    # share a few) are stacked and done at once, at most BLOCK terms a time.
    by_shape, shape_first, shape_count = runs([count, ucount])
    for f, k in zip(shape_first, shape_count):
        n_spans, n_intervals = count[by_shape[f]], ucount[by_shape[f]]
        stack = max(1, BLOCK // (n_spans * n_intervals))
        for lo in range(f, f + k, stack):
            these = by_shape[lo:min(lo + stack, f + k)]
            rows = order[first[these][:, None] + np.arange(n_spans)]
            ivl = ufirst[these][:, None] + np.arange(n_intervals)
            a, b = tl["start"][rows][:, :, None], tl["end"][rows][:, :, None]
            a0, a1 = u0[ivl][:, None, :], u1[ivl][:, None, :]
            out[rows] -= np.clip(np.minimum(b, a1) - np.maximum(a, a0), 0, None).sum(axis=2)
    return np.maximum(out, 0.0)


def unions(keys, starts, ends):
    """Per key, the intervals [starts, ends) of its rows merged where they
    overlap (empty ones dropped): (starts, ends, keys) of the merged
    intervals, sorted by key and then start."""
    order = np.lexsort((starts, keys))  # by key, then start; ties in row order
    k, a, b = keys[order], np.asarray(starts, dtype=float)[order], np.asarray(ends, dtype=float)[order]
    live = ~(b <= a)
    k, a, b = k[live], a[live], b[live]
    n = len(k)
    if n == 0:
        return a, b, k
    # An interval starts a merged one unless it begins by the latest end of
    # the ones before it of its key: that running maximum within each key is
    # one np.maximum.accumulate over (key's index, rank of the end) as an
    # integer, which orders as the pair does.
    first = np.ones(n, dtype=bool)
    first[1:] = k[1:] != k[:-1]
    by_end = np.argsort(b, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[by_end] = np.arange(n)
    group = np.cumsum(first) - 1
    latest = b[by_end][np.maximum.accumulate(group * n + rank) - group * n]
    new = first.copy()
    new[1:] |= ~(a[1:] <= latest[:-1])
    at = np.flatnonzero(new)
    return a[at], np.maximum.reduceat(b, at), k[at]


LAYER_PHASES = ("forward", "backward", "backward_input", "backward_weight", "waits")


def layer_times(rep):
    """[(layer, {phase: seconds, "waits": seconds})]: per layer of /timeline,
    per phase, the median over measured steps of the step's compute in its
    spans (summed over micro-batches and chunks, less the communication waits
    inside them: span_compute), and under "waits" those waits over every
    phase; averaged over the ranks that ran the layer (a class's row counting
    for each of its ranks)."""
    tl = rep.array("timeline")
    if len(tl) == 0:
        return []
    s = rep.measured_steps()
    steps = np.unique(s["step"]) if len(s) else np.unique(tl["step"])
    keep = np.isin(tl["step"], steps) & (tl["layer"] >= 0)
    compute = span_compute(rep)[keep]
    tl = tl[keep]
    waits = (tl["end"] - tl["start"]) - compute
    # The phase's bytes, compared with the names' bytes: as decoding each
    # row (texts) would, without the per-row cost.
    phases = tl["phase"]
    layers, ranks, steps_of = tl["layer"], tl["rank"], np.searchsorted(steps, tl["step"])
    # One sort by (layer, rank, step) for every phase: a phase's rows taken
    # in that order are in order too, each group's spans in row order, as a
    # mask would take them.
    order = np.lexsort((steps_of, ranks, layers))
    rows = {int(layer): {} for layer in np.unique(layers)}
    for ph in LAYER_PHASES:
        sel = (phases != b"optimizer") if ph == "waits" else (phases == ph.encode())
        if not sel.any():
            continue
        mine = order[sel[order]]
        what = (waits if ph == "waits" else compute)[mine]
        layer, rank, step = layers[mine], ranks[mine], steps_of[mine]
        # Sum per (layer, rank, step); then per (layer, rank) the median over
        # every measured step, 0 where it has no span.
        starts, counts = cuts([layer, rank, step])
        total = sums(what, counts)
        layer, rank, step = layer[starts], rank[starts], step[starts]
        first, per_series = cuts([layer, rank])
        series = np.repeat(np.arange(len(first)), per_series)
        medians = np.zeros(len(first))
        block = max(1, BLOCK // len(steps))
        for lo in range(0, len(first), block):
            hi = min(lo + block, len(first))
            here = slice(first[lo], first[hi] if hi < len(first) else len(series))
            per_step = np.zeros((hi - lo, len(steps)))
            per_step[series[here] - lo, step[here]] = total[here]
            medians[lo:hi] = np.median(per_step, axis=1)
        # The mean over each layer's ranks.
        at, n = cuts(layer[first])
        for a, k in zip(at, n):
            rows[int(layer[first[a]])][ph] = mean(medians[a:a + k], rep.weights(rank[first[a:a + k]]))
    return list(rows.items())


def hidden(busy, waited):
    """Share of a background transfer's time the step did not wait for (0 when
    the wait, which includes starting the transfer's thread, is the longer)."""
    return max(0.0, 1.0 - waited / busy) if busy > 0 else 0.0


def alike(rep, per_rank):
    """[(label, figures)] of {rank: figures}: ranks (or classes) with equal
    figures on one line, labelled by their ranks, in order of the first."""
    groups = {}
    for r, v in sorted(per_rank.items()):
        groups.setdefault(repr(v), (v, []))[1].extend(rep.ranges(r))
    return [(ranges_label(merge_ranges(ranges), 14), v) for v, ranges in groups.values()]


def render(rep):
    out = []
    p = out.append
    a = rep.attrs
    p(f"report  {rep.path}")
    p(f"status  {rep.status}" + (f": {a['error']}" if rep.status != "complete" and "error" in a else "")
      + (f" | SIMULATED on machine {text(a.get('machine', '?'))}: predicted, not measured"
         if rep.simulated else ""))
    s = rep.summary
    p(f"run     {a.get('deck_path', '?')} | {rep.world} rank(s): {s.get('layout', '?')} | strategy "
      f"{s.get('strategy', '?')} | {s.get('precision', 'fp32')} | {s.get('parameters', 0) / 1e6:.3f} M parameters | "
      f"started {a.get('start_time', '?')}"
      + (f" | SLURM job {a['slurm_job_id']}" if str(a.get("slurm_job_id", "")) not in ("", "0") else ""))
    if "kernel_libraries" in a:
        p(f"built   {a.get('git_commit', '?')}{' (uncommitted changes)' if int(a.get('git_dirty', 0)) == 1 else ''} "
          f"with {a.get('compiler', '?')} | {a.get('mpi_library', '?')} | {a.get('hdf5_library', '?')} | "
          f"{a.get('kernel_libraries', '?')} | CPU {a.get('cpu_model', '?')}")
    if a.get("warnings"):
        p(f"warning {a['warnings']}")
    said = {
        "failed": "(a failed run: its tables hold what it wrote before failing)",
        "diverged": "(stopped early: its tables hold the steps it ran)",
        "interrupted": "(stopped early: its tables hold the steps it ran)",
        "running": "(still being written: the rows of the windows written so far; the summary comes at the end)",
        "estimate": "(a dry run's estimate: memory and compute per class of ranks, counted on the meta device; "
                    "nothing ran)",
    }
    if rep.status != "complete":
        p(said.get(rep.status, f"(status {rep.status}: not a complete run)"))
    # Whether the prediction fits a device: said at the top and again as
    # the last line, where a long summary leaves the eye.
    fit = fit_line(rep)
    if fit:
        p(fit)
    times = step_times(rep)
    if len(times):
        med = float(np.median(times))
        p("")
        p("throughput")
        # The peak is a device's; MFU divides by it times the ranks.
        per_device = s.get("peak_flops_per_device", s.get("peak_flops", 0) / max(rep.world, 1))
        p(f"  tokens/s {s.get('tokens_per_s', 0):.0f} ({s.get('tokens_per_s_per_device', 0):.0f} per device)   "
          f"model {fmt_flops(s.get('flops_per_s', 0))} ({fmt_flops(s.get('flops_per_s', 0) / max(rep.world, 1))} "
          f"per device)   MFU {100 * s.get('mfu', 0):.1f}% HFU {100 * s.get('hfu', s.get('mfu', 0)):.1f}% "
          f"(peak {fmt_flops(per_device)} per device, {s.get('peak_source', '?')})")
        if rep.simulated:
            p(f"  predicted step time {1e3 * med:.2f} ms (a simulation: no loss, no spread)")
        else:
            p(f"  step time over {len(times)} measured steps: min {1e3 * times.min():.2f} ms, median "
              f"{1e3 * med:.2f} ms, max {1e3 * times.max():.2f} ms, spread (max-min)/median "
              f"{100 * (times.max() - times.min()) / med:.1f}%")
            p(f"  loss {s.get('initial_loss', float('nan')):.4f} -> {s.get('final_loss', float('nan')):.4f}")
        all_steps = rep.array("steps")
        if len(all_steps) and "loss_scale" in all_steps.dtype.names and s.get("precision") == "fp16":
            r0 = all_steps[all_steps["rank"] == all_steps["rank"].min()]
            p(f"  fp16 loss scale {r0['loss_scale'][0]:g} -> {r0['loss_scale'][-1]:g}, "
              f"{int(r0['skipped'].sum())} step(s) skipped on overflow"
              + (f" (steps {', '.join(str(int(x)) for x in r0['step'][r0['skipped'] == 1][:10])})" if r0['skipped'].any() else ""))
    layers = layer_times(rep)
    if layers:
        last = max(l for l, _ in layers)
        phases = [ph for ph in ("forward", "backward", "backward_input", "backward_weight", "waits")
                  if any(ph in row for _, row in layers)]
        p("")
        p("time per layer: compute per phase (the step's spans less the communication waits inside them, summed "
          "over micro-batches) and those waits; median over measured steps, mean over the ranks that run it")
        p("  layer              " + "".join(f"{ph + '_ms':>20}" for ph in phases))
        # Consecutive blocks of equal figures (as shown) on one line.
        shown = [(layer, "".join(f"{1e3 * row.get(ph, 0.0):>20.3f}" for ph in phases)) for layer, row in layers]
        i = 0
        while i < len(shown):
            layer, cells = shown[i]
            j = i
            if 0 < layer < last:
                while j + 1 < len(shown) and 0 < shown[j + 1][0] < last and shown[j + 1][1] == cells \
                        and shown[j + 1][0] == shown[j][0] + 1:
                    j += 1
            to = shown[j][0]
            name = ("embedding" if layer == 0 else "head + loss" if layer == last
                    else f"block {layer}" if to == layer else f"blocks {layer}-{to}")
            p(f"  {layer if to == layer else f'{layer}-{to}':>5} {name:<14}" + cells)
            i = j + 1
    mem = memory_per_rank(rep)
    if mem:
        p("")
        p("memory per rank: held at the end of the last step / peak during the run (ranks of equal figures "
          "on one line)")
        p(f"  {'ranks':<26}" + "".join(f"{c:>26}" for c in CATEGORIES))
        for label, (held, peak) in alike(rep, mem):
            p(f"  {label:<26}" + "".join(f"{fmt_bytes(held[c]) + ' / ' + fmt_bytes(peak[c]):>26}" for c in CATEGORIES))
    host = memory_per_rank(rep, "host")
    if host:
        p("host arena (optimizer offload), held at the end of the last step")
        p(f"  {'ranks':<26}" + "".join(f"{c:>14}" for c in ("params", "grads", "optimizer")))
        for label, (held, _) in alike(rep, host):
            p(f"  {label:<26}" + "".join(f"{fmt_bytes(held[c]):>14}" for c in ("params", "grads", "optimizer")))
        s_ = rep.measured_steps()
        ws = rep.weights(s_["rank"]) if len(s_) else np.zeros(0)

        def tot(col):
            """The column summed over ranks and measured steps (a class's row for each of its ranks)."""
            return float((s_[col] * ws).sum())

        if len(s_) and "offload_bytes_to_host" in s_.dtype.names:
            n = len(np.unique(s_["step"]))
            p(f"  per step, mean over ranks: {fmt_bytes(tot('offload_bytes_to_host') / n / rep.world)} to the host, "
              f"{fmt_bytes(tot('offload_bytes_to_device') / n / rep.world)} back, copies "
              f"{1e3 * tot('offload_copy_time') / n / rep.world:.2f} ms"
              + (f" on copy threads, waited for {1e3 * tot('offload_copy_wait') / n / rep.world:.2f} ms "
                 f"(with the threads' start; {100 * hidden(tot('offload_copy_time'), tot('offload_copy_wait')):.0f}% hidden)"
                 if "offload_copy_wait" in s_.dtype.names else "")
              + ", host update "
              f"{1e3 * tot('offload_update_time') / n / rep.world:.2f} ms")
        if len(s_) and "nvme_bytes_read" in s_.dtype.names and tot('nvme_bytes_read') > 0:
            io, wait = tot('nvme_io_time'), tot('nvme_wait_time')
            p(f"  NVMe ({a.get('offload_io', '?')}), per step, mean over ranks: "
              f"{fmt_bytes(tot('nvme_bytes_read') / n / rep.world)} read, "
              f"{fmt_bytes(tot('nvme_bytes_written') / n / rep.world)} written, "
              f"I/O {1e3 * io / n / rep.world:.2f} ms at {tot('nvme_bytes_read') * 2 / max(io, 1e-12) / 2**30:.2f} GiB/s, "
              f"waited {1e3 * wait / n / rep.world:.2f} ms ({100 * hidden(io, wait):.0f}% hidden)")
    pipe = rep.array("summary/pipeline")
    if len(pipe) and pipe["stages"].max() > 1:
        p("")
        sched = text(pipe["schedule"][0])
        p(f"pipeline bubble ({sched}, p {pipe['stages'][0]}, m {pipe['micro_batches'][0]}"
          + (f", v {pipe['virtual_stages'][0]}" if "virtual_stages" in pipe.dtype.names else "") + ")")
        p(f"  {'ranks':<26}  stage   bubble  idle/compute   theory")
        for row in sorted(pipe, key=lambda x: x["rank"]):
            p(f"  {rep.rank_label(row['rank'], 18):<26}  {row['pp_rank']:>5}   {row['bubble']:.3f}         "
              f"{row['bubble_over_compute']:.3f}    {row['theory']:.3f}")
    moe = moe_per_step(rep)
    if moe:
        p("")
        p("mixture of experts per measured step (mean over ranks)")
        p("  step   aux_loss  load_imbalance  drop_rate")
        for k, aux, imb, drop in moe:
            p(f"  {k:>4}   {aux:.5f}  {imb:>14.3f}  {100 * drop:>8.2f}%")
        p("expert load over the measured steps (share of the block's assignments / share of them dropped)")
        for layer, rows in expert_load(rep).items():
            p(f"  block {layer}: " + "  ".join(f"e{x} {100 * share:.1f}%/{100 * drop:.1f}%" for x, share, drop in rows))
    comm = comm_per_axis_op(rep)
    if comm:
        p("")
        p("communication per axis and op (mean over the ranks that issue it, measured steps): xfer_ms the "
          "transfer, late_ms the time waiting for the group's last member (another rank's lateness, not the "
          "network), wait_ms the time blocked, peer_ms a receive's wait for its sender")
        p(f"  {'axis':<5} {'op':<28} {'n':>3} {'ranks':>5} {'calls':>7} {'bytes':>12} {'xfer_ms':>9} {'late_ms':>9} "
          f"{'wait_ms':>9} {'peer_ms':>8} {'busbw_GB/s':>10} {'hidden':>7}")
        for ax, op, g, nr, calls, b, t, w, pw, bw, h, late in comm:
            # A run's time holds its wait for the last member; a simulation's
            # is the transfer alone (docs/report-schema.md, group_wait).
            xfer = t if rep.simulated else t - late
            p(f"  {ax:<5} {op:<28} {g:>3} {nr:>5} {calls:>7.0f} {fmt_bytes(b):>12} {1e3 * xfer:>9.2f} "
              f"{1e3 * late:>9.2f} {1e3 * w:>9.2f} {1e3 * pw:>8.2f} {bw / 1e9:>10.3f} {100 * h:>6.0f}%")
    if fit:
        p("")
        p(fit)
    return "\n".join(out)

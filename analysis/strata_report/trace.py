"""Chrome/Perfetto trace JSON: one process per rank (or class of ranks), named by its mesh
coordinates and host; one track per kind of work (compute; the optimizer;
communication per axis, split into lanes so overlapping non-blocking calls
never share one), complete ("X") events in microseconds, properly nested on
every track; a marker where each step begins; memory per category as
counters; and a flow arrow from each pipeline send to its receive.

`write_per_rank` writes one file per rank with a `distributedInfo` record,
as Holistic Trace Analysis reads a job's traces. A report of rank classes
(a simulation's) has one process, and one file, per class."""
import json
import math
import os
import re

import numpy as np

from . import outputs
from .read import text, texts

# The names write_per_rank gives its files.
PER_RANK_FILE = re.compile(r"rank-\d+\.json")


def lanes(events):
    """Assigns each (start, end, payload) to the first lane whose last event
    ended before it starts: events on a lane never overlap."""
    ends = []
    out = []
    for start, end, payload in sorted(events, key=lambda e: (e[0], -e[1])):
        for i, e in enumerate(ends):
            if e <= start:
                ends[i] = end
                out.append((i, start, end, payload))
                break
        else:
            ends.append(end)
            out.append((len(ends) - 1, start, end, payload))
    return out


def mesh_dims(ranks):
    """The mesh's dims, in nesting order: /ranks' columns besides the rank
    and its host (pp, dp, cp, tp, and any other a layout declares)."""
    if len(ranks) == 0:
        return []
    return [n for n in ranks.dtype.names if n not in ("rank", "host")]


def rank_names(rep):
    """{rank: "rank 3 (pp 1, dp 0, cp 0, tp 1) on node07"} from /ranks, one
    coordinate per dim of the mesh (reports without /ranks: "rank 3"); a
    class of ranks is named by its ranks and its first one's coordinates."""
    rk = rep.array("ranks")
    dims = mesh_dims(rk)
    names = {r: rep.rank_label(r) for r in rep.row_ranks}
    for row in rk:
        r = int(row["rank"])
        where = ", ".join(f"{d} {int(row[d])}" for d in dims)
        first = " of the first" if rep.members(r) > 1 else ""
        names[r] = f"{rep.rank_label(r)} ({where}{first}) on {text(row['host'])}"
    return names


def pipeline_flows(cm, ranks):
    """[(send row, recv row)]: the k-th pp send from a rank to its peer
    stage with a tag, with the k-th pp receive there from it with that tag
    (MPI's order). The peer is the rank whose coordinates equal the
    sender's but along pp (every dim the report's /ranks has)."""
    if len(cm) == 0 or "peer" not in cm.dtype.names or len(ranks) == 0:
        return []
    dims = mesh_dims(ranks)
    if "pp" not in dims:
        return []
    at = dims.index("pp")
    coords = {int(r["rank"]): tuple(int(r[d]) for d in dims) for r in ranks}
    world = {v: k for k, v in coords.items()}
    sends, recvs = {}, {}
    for c in cm:
        if text(c["axis"]) != "pp" or int(c["peer"]) < 0:
            continue
        me = int(c["rank"])
        if me not in coords:  # a row of a rank /ranks does not list: nothing to pair it with
            continue
        there = list(coords[me])
        there[at] = int(c["peer"])
        other = world.get(tuple(there))
        if other is None:
            continue
        op, tag = text(c["op"]), int(c["tag"]) if "tag" in c.dtype.names else -1
        if op == "send":
            sends.setdefault((me, other, tag), []).append(c)
        elif op == "recv":
            recvs.setdefault((other, me, tag), []).append(c)
    out = []
    for key, ss in sends.items():
        rs = recvs.get(key, [])
        ss = sorted(ss, key=lambda c: float(c["start"]))
        rs = sorted(rs, key=lambda c: float(c["start"]))
        out += list(zip(ss, rs))
    return out


def build(rep, only_rank=None):
    ev = []
    tracks = {}
    keep = (lambda r: True) if only_rank is None else (lambda r: r == only_rank)

    def tid(rank, name):
        key = (rank, name)
        if key not in tracks:
            tracks[key] = len([k for k in tracks if k[0] == rank]) + 1
            ev.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tracks[key], "args": {"name": name}})
        return tracks[key]

    names = rank_names(rep)
    for r in rep.row_ranks:
        if keep(r):
            ev.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": names[r]}})
            ev.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
    tl = rep.array("timeline")
    step_start, step_end = {}, {}
    for s in tl:
        r = int(s["rank"])
        if not keep(r):
            continue
        ph = text(s["phase"])
        track = "optimizer" if ph == "optimizer" else "compute"
        layer = int(s["layer"])
        name = ph if layer < 0 else f"{ph} L{layer}"
        key = (r, int(s["step"]))
        step_start[key] = min(step_start.get(key, np.inf), float(s["start"]))
        step_end[key] = max(step_end.get(key, -np.inf), float(s["end"]))
        ev.append({"ph": "X", "name": name, "cat": ph, "pid": r, "tid": tid(r, track),
                   "ts": 1e6 * float(s["start"]), "dur": 1e6 * float(s["end"] - s["start"]),
                   "args": {"step": int(s["step"]), "micro_batch": int(s["micro_batch"]), "chunk": int(s["chunk"])
                            if "chunk" in s.dtype.names else 0, "layer": layer}})
    # A marker at each step's first span, on every rank's compute track.
    for (r, step), t in sorted(step_start.items()):
        ev.append({"ph": "i", "s": "p", "name": f"step {step}", "cat": "step", "pid": r, "tid": tid(r, "compute"),
                   "ts": 1e6 * t})
    # Memory held per category at the end of each step, as counters.
    mem = rep.array("memory")
    if len(mem):
        pools = texts(mem["pool"]) if "pool" in mem.dtype.names else np.full(len(mem), "device")
        cats = texts(mem["category"])
        for r in np.unique(mem["rank"]):
            r = int(r)
            if not keep(r):
                continue
            for step in np.unique(mem["step"][mem["rank"] == r]):
                t = step_end.get((r, int(step)))
                if t is None:
                    continue
                sel = (mem["rank"] == r) & (mem["step"] == step) & (pools == "device")
                args = {c: int(b) / 2**20 for c, b in zip(cats[sel], mem["current_bytes"][sel])}
                ev.append({"ph": "C", "name": "device memory (MiB)", "pid": r, "ts": 1e6 * t, "args": args})
    cm = rep.array("comm")
    by_track = {}
    for c in cm:
        if keep(int(c["rank"])):
            by_track.setdefault((int(c["rank"]), text(c["axis"])), []).append((float(c["start"]), float(c["end"]), c))
    lane_of = {}
    for (r, axis), events in sorted(by_track.items()):
        for lane, start, end, c in lanes(events):
            name = f"comm {axis}" + (f" #{lane + 1}" if lane else "")
            lane_of[(r, start, text(c["op"]))] = tid(r, name)
            args = {"step": int(c["step"]), "bytes": int(c["bytes"]), "group_size": int(c["group_size"]),
                    "nonblocking": bool(c["nonblocking"]), "wait_us": 1e6 * float(c["wait"])}
            if "peer_wait" in c.dtype.names:
                args["peer_wait_us"] = 1e6 * float(c["peer_wait"])
            if "transfer_start" in c.dtype.names:
                args["transfer_us"] = 1e6 * float(c["transfer_end"] - c["transfer_start"])
            if "peer" in c.dtype.names and int(c["peer"]) >= 0:
                args["peer"] = int(c["peer"])
            ev.append({"ph": "X", "name": text(c["op"]), "cat": f"comm {axis}", "pid": r, "tid": tid(r, name),
                       "ts": 1e6 * start, "dur": 1e6 * (end - start), "args": args})
    # Each pipeline send to its receive, as a flow arrow.
    if only_rank is None:
        for i, (s, rcv) in enumerate(pipeline_flows(cm, rep.array("ranks"))):
            a, b = int(s["rank"]), int(rcv["rank"])
            ev.append({"ph": "s", "id": i, "name": "pp send", "cat": "pp flow", "pid": a,
                       "tid": lane_of[(a, float(s["start"]), "send")], "ts": 1e6 * float(s["start"])})
            ev.append({"ph": "f", "bp": "e", "id": i, "name": "pp send", "cat": "pp flow", "pid": b,
                       "tid": lane_of[(b, float(rcv["start"]), "recv")], "ts": 1e6 * float(rcv["end"])})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"report": rep.path, "status": rep.status, "layout": rep.summary.get("layout", "")}}


def write(rep, path):
    outputs.check([("the report", rep.path)], files=[("trace file", path)])
    doc = build(rep)  # before the file is opened: a failure leaves no empty file behind
    with open(path, "w") as f:
        json.dump(doc, f)


# The streams of a per-rank trace for Holistic Trace Analysis: the compute
# spans on one, each lane of each axis's communication on its own (calls on
# one stream never overlap).
COMPUTE_STREAM = 7
COMM_STREAM = 20


def hta(rep, r, names=None):
    """Rank r's trace in the form Holistic Trace Analysis parses (PyTorch's
    profiler's): a `ProfilerStep#N` span per step (cat user_annotation) on
    the host; each compute span as a host `cpu_op` and a device `kernel` on
    stream COMPUTE_STREAM, linked by a `correlation` id; each communication
    call as a host `cpu_op` over the call and a `kernel` over its transfer on
    a stream of its own lane, named `nccl:<op>` whatever the library (HTA
    tells communication from computation by that name; args.backend says
    which). Times in microseconds. `names`: rank_names(rep), when the
    caller has them."""
    backend = text(rep.attrs.get("comm_backend", "mpi")).split(" ")[0]
    tl, cm = rep.array("timeline"), rep.array("comm")
    tl = tl[tl["rank"] == r] if len(tl) else tl
    cm = cm[cm["rank"] == r] if len(cm) else cm
    names = rank_names(rep) if names is None else names
    ev = [{"ph": "M", "name": "process_name", "pid": r, "args": {"name": names.get(r, f"rank {r}")}}]
    bounds = {}
    for row in list(tl) + list(cm):
        k = int(row["step"])
        a, b = bounds.get(k, (np.inf, -np.inf))
        bounds[k] = (min(a, float(row["start"])), max(b, float(row["end"])))
    for k, (a, b) in sorted(bounds.items()):
        # Whole microseconds, out to the step's first and last: HTA rounds
        # other events' times inwards and then finds their step by start.
        ts = math.floor(1e6 * a)
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": r, "tid": 1,
                   "ts": ts, "dur": math.ceil(1e6 * b) - ts})
    corr = 0

    def launch(name, tid, start, end, stream, k_start, k_end, args):
        nonlocal corr
        corr += 1
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": r, "tid": tid, "ts": 1e6 * start,
                   "dur": 1e6 * (end - start), "args": {"correlation": corr, **args}})
        ev.append({"ph": "X", "cat": "kernel", "name": name if stream == COMPUTE_STREAM else args["kernel"],
                   "pid": r, "tid": stream, "ts": 1e6 * k_start, "dur": 1e6 * (k_end - k_start),
                   "args": {"stream": stream, "correlation": corr, "device": 0, **args}})

    for s_ in tl:
        ph, layer = text(s_["phase"]), int(s_["layer"])
        name = ph if layer < 0 else f"{ph} L{layer}"
        launch(name, 1, float(s_["start"]), float(s_["end"]), COMPUTE_STREAM, float(s_["start"]), float(s_["end"]),
               {"step": int(s_["step"]), "layer": layer})
    by_axis = {}
    for c in cm:
        by_axis.setdefault(text(c["axis"]), []).append((float(c["start"]), float(c["end"]), c))
    stream = COMM_STREAM
    for axis, calls in sorted(by_axis.items()):
        placed = lanes(calls)
        for lane in sorted({p[0] for p in placed}):
            for _, start, end, c in (p for p in placed if p[0] == lane):
                op = text(c["op"])
                t0 = float(c["transfer_start"]) if "transfer_start" in c.dtype.names else start
                t1 = float(c["transfer_end"]) if "transfer_end" in c.dtype.names else end
                launch(f"{op} {axis}", 100 + stream, start, end, stream, t0, max(t1, t0), {
                    "step": int(c["step"]), "kernel": f"nccl:{op}", "backend": backend, "axis": axis,
                    "bytes": int(c["bytes"]), "Group size": int(c["group_size"])})
            ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": stream,
                       "args": {"name": f"stream {stream}: comm {axis}" + (f" #{lane + 1}" if lane else "")}})
            stream += 1
    ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": COMPUTE_STREAM,
               "args": {"name": f"stream {COMPUTE_STREAM}: compute"}})
    ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 1, "args": {"name": "host"}})
    return {"schemaVersion": 1, "traceEvents": ev, "displayTimeUnit": "ms",
            "distributedInfo": {"backend": backend, "rank": r, "world_size": rep.world,
                                "layout": rep.summary.get("layout", "")}}


def write_per_rank(rep, directory):
    """One trace per rank, rank-R.json, in the form Holistic Trace Analysis
    reads (hta: ProfilerStep#N, streams, kernel and cpu_op events, and the
    distributedInfo record it groups a job's traces by); for a report of
    rank classes, one per class, named by its first rank, with its ranks."""
    outputs.check([("the report", rep.path)],
                  dirs=[("per-rank trace directory", directory, [f"rank-{r}.json" for r in rep.row_ranks])])
    os.makedirs(directory, exist_ok=True)
    paths = []
    names = rank_names(rep)
    for r in rep.row_ranks:
        t = hta(rep, r, names)
        if rep.members(r) > 1:
            t["distributedInfo"]["ranks"] = rep.rank_label(r, 10**6)
        p = os.path.join(directory, f"rank-{r}.json")
        with open(p, "w") as f:
            json.dump(t, f)
        paths.append(p)
    return paths

"""Chrome/Perfetto trace JSON: one process per rank, one track per kind of
work (compute; the optimizer; communication per axis, split into lanes so
overlapping non-blocking calls never share one), complete ("X") events in
microseconds, properly nested on every track."""
import json

from .read import text


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


def build(rep):
    ev = []
    tracks = {}

    def tid(rank, name):
        key = (rank, name)
        if key not in tracks:
            tracks[key] = len([k for k in tracks if k[0] == rank]) + 1
            ev.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tracks[key], "args": {"name": name}})
        return tracks[key]

    for r in range(rep.world):
        ev.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
    tl = rep.array("timeline")
    for s in tl:
        ph = text(s["phase"])
        track = "optimizer" if ph == "optimizer" else "compute"
        layer = int(s["layer"])
        name = ph if layer < 0 else f"{ph} L{layer}"
        ev.append({"ph": "X", "name": name, "cat": ph, "pid": int(s["rank"]), "tid": tid(int(s["rank"]), track),
                   "ts": 1e6 * float(s["start"]), "dur": 1e6 * float(s["end"] - s["start"]),
                   "args": {"step": int(s["step"]), "micro_batch": int(s["micro_batch"]), "chunk": int(s["chunk"])
                            if "chunk" in s.dtype.names else 0, "layer": layer}})
    cm = rep.array("comm")
    by_track = {}
    for c in cm:
        by_track.setdefault((int(c["rank"]), text(c["axis"])), []).append(
            (float(c["start"]), float(c["end"]), c))
    for (r, axis), events in sorted(by_track.items()):
        for lane, start, end, c in lanes(events):
            name = f"comm {axis}" + (f" #{lane + 1}" if lane else "")
            args = {"step": int(c["step"]), "bytes": int(c["bytes"]), "group_size": int(c["group_size"]),
                    "nonblocking": bool(c["nonblocking"]), "wait_us": 1e6 * float(c["wait"])}
            if "peer_wait" in c.dtype.names:
                args["peer_wait_us"] = 1e6 * float(c["peer_wait"])
            ev.append({"ph": "X", "name": text(c["op"]), "cat": f"comm {axis}", "pid": r, "tid": tid(r, name),
                       "ts": 1e6 * start, "dur": 1e6 * (end - start), "args": args})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"report": rep.path, "status": rep.status, "layout": rep.summary.get("layout", "")}}


def write(rep, path):
    with open(path, "w") as f:
        json.dump(build(rep), f)

#!/usr/bin/python3
"""Checks that a strata report is complete and self-describing (schema v1):
root provenance, the /steps, /memory and /timeline tables with a rank column
and a unit on every column, and the /summary figures.

usage: check_report.py REPORT.h5 --steps N --layers L
"""
import argparse
import sys

import h5py
import numpy as np

ROOT_ATTRS = ["schema", "schema_version", "strata_version", "git_commit", "command_line", "start_time", "hosts",
              "world_size", "deck", "resolved_config", "status"]
TABLES = {
    "ranks": ["rank", "host", "pp", "dp", "cp", "tp"],
    "steps": ["rank", "step", "loss", "lr", "grad_norm", "step_time", "rank_step_time", "tokens_per_s", "model_flops",
              "mfu", "moe_aux_loss", "load_imbalance", "drop_rate", "exposed_comm_dp", "exposed_comm_tp",
              "exposed_comm_pp"],
    "memory": ["rank", "step", "category", "pool", "current_bytes", "peak_bytes", "pool_peak_bytes"],
    "experts": ["rank", "step", "layer", "expert", "tokens_routed", "tokens_dropped", "prob_mass"],
    "timeline": ["rank", "step", "micro_batch", "chunk", "layer", "phase", "start", "end"],
    "comm": ["rank", "step", "op", "axis", "group_size", "bytes", "nonblocking", "start", "end", "wait", "peer_wait",
             "transfer_start", "transfer_end", "peer", "tag"],
    "summary/comm": ["rank", "axis", "op", "group_size", "size_class", "count", "bytes", "time", "group_time", "span", "wait",
                     "peer_wait", "group_wait", "algbw", "busbw"],
    "summary/pipeline": ["rank", "pp_rank", "stages", "micro_batches", "virtual_stages", "schedule", "bubble",
                         "bubble_over_compute", "theory"],
}
# A run's alone: a simulation has no processes.
RUN_TABLES = {"summary/host_memory": ["rank", "peak_rss", "records_bytes"]}
SUMMARY = ["tokens_per_s", "tokens_per_s_per_device", "step_time", "model_flops_per_step", "mfu", "peak_flops",
           "peak_flops_per_device", "peak_bytes_rank", "final_loss"]


def text(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--world", type=int, default=1, help="ranks: each writes its own rows")
    a = ap.parse_args()
    errors = []
    with h5py.File(a.report, "r") as f:
        simulated = int(f.attrs.get("simulated", 0)) == 1
        for k in ROOT_ATTRS:
            if k not in f.attrs:
                errors.append(f"root attribute {k} missing")
        if not isinstance(f.attrs.get("status"), str):
            errors.append("string attributes are not read as str (variable-length UTF-8)")
        if text(f.attrs.get("schema", "")) != "strata-report" or int(f.attrs.get("schema_version", 0)) != 1:
            errors.append("schema is not strata-report v1")
        if text(f.attrs.get("status", "")) != "complete":
            errors.append(f"status is {f.attrs.get('status')}")
        tables = dict(TABLES) if simulated else {**TABLES, **RUN_TABLES}
        for name, cols in tables.items():
            if name not in f:
                errors.append(f"table /{name} missing")
                continue
            d = f[name]
            for c in cols:
                if c not in d.dtype.names:
                    errors.append(f"/{name} lacks column {c}")
            for c in d.dtype.names:
                if f"unit:{c}" not in d.attrs:
                    errors.append(f"/{name} column {c} has no unit attribute")
        # The ranks whose rows the tables hold: every rank of a run; in a
        # simulation the first rank of each class of identical ranks, the
        # classes together holding every rank once.
        rows_of = list(range(a.world))
        if simulated:
            if text(f.attrs.get("rank_rows", "")) != "classes" or "rank_classes" not in f:
                errors.append("a simulation without rank classes (rank_rows, /rank_classes)")
            else:
                members = {}
                for c in f["rank_classes"][...]:
                    members.setdefault(int(c["rank"]), []).extend(range(int(c["first"]), int(c["last"]) + 1))
                every = sorted(r for m in members.values() for r in m)
                if every != list(range(a.world)):
                    errors.append(f"/rank_classes does not hold each of the {a.world} ranks once: {every}")
                if any(r != min(m) for r, m in members.items()):
                    errors.append("/rank_classes names a class by other than its first rank")
                rows_of = sorted(members)
        steps = f["steps"][...]
        if len(steps) != a.steps * len(rows_of):
            errors.append(f"/steps has {len(steps)} rows, expected {a.steps} x {len(rows_of)} ranks")
        if sorted(set(steps["rank"])) != rows_of:
            errors.append(f"/steps ranks {sorted(set(steps['rank']))}, expected {rows_of}")
        for name in ("memory", "ranks", "summary/pipeline"):
            if sorted(set(f[name]["rank"])) != rows_of:
                errors.append(f"/{name} ranks {sorted(set(f[name]['rank']))}, expected {rows_of}")
        if a.world > 1:
            comm = f["comm"][...]
            if len(comm) == 0 or sorted(set(comm["rank"])) != rows_of:
                errors.append("/comm lacks rows of some rank")
            if not np.all(comm["end"] >= comm["start"]) or not np.all(comm["wait"] >= 0):
                errors.append("/comm has spans that end before they start")
            if not np.all(comm["transfer_end"] >= comm["transfer_start"]):
                errors.append("/comm has transfers that end before they start")
            if not simulated and text(f.attrs.get("device", "cpu")) != "cuda":
                # On the host the transfer lies within the call's span.
                if not np.all((comm["transfer_start"] >= comm["start"] - 1e-9) & (comm["transfer_end"] <= comm["end"] + 1e-9)):
                    errors.append("/comm has transfers outside their calls' spans")
            # A collective row's group time is the largest of its members' times.
            sc = f["summary/comm"][...]
            coll = sc[(sc["op"] != b"send") & (sc["op"] != b"recv")]
            if not simulated and not np.all(coll["group_time"] >= coll["time"]):
                errors.append("/summary/comm has a group time below a member's time")
            # Waiting for the last member is part of a member's time (of its
            # time blocked, in a simulation, whose time is the transfer
            # alone), and the member that came last waited for no one.
            bound = coll["wait"] if simulated else coll["time"]
            if not np.all((coll["group_wait"] >= 0) & (coll["group_wait"] <= bound + 1e-12)):
                errors.append("/summary/comm has a group wait outside [0, time]")
            if not np.all(sc["group_wait"][(sc["op"] == b"send") | (sc["op"] == b"recv")] == 0):
                errors.append("/summary/comm gives a send or recv a group wait")
            if not simulated:
                whole = coll[coll["group_size"] == a.world]
                for key in {(r["axis"], r["op"], r["size_class"]) for r in whole}:
                    rows = whole[(whole["axis"] == key[0]) & (whole["op"] == key[1]) & (whole["size_class"] == key[2])]
                    if len(rows) == a.world and rows["group_wait"].min() != 0:
                        errors.append(f"/summary/comm {key}: every member waited for another")
            # One step time per step: the slowest rank's, on every rank.
            for s in range(a.steps):
                t = steps["step_time"][steps["step"] == s]
                r = steps["rank_step_time"][steps["step"] == s]
                if not simulated and (t.max() != t.min() or abs(t[0] - r.max()) > 1e-12):
                    errors.append(f"step {s}: step_time is not the slowest rank's on every rank")
            # The loss is the same number on every rank of the group.
            pipe = f["summary/pipeline"][...]
            if not np.all((pipe["bubble"] >= 0) & (pipe["bubble"] <= 1)):
                errors.append("/summary/pipeline bubbles outside [0, 1]")
            for s in range(a.steps):
                l = steps["loss"][steps["step"] == s]
                if not simulated and l.max() != l.min():
                    errors.append(f"step {s}: ranks disagree on the loss")
        # A simulated step trains nothing: its loss is NaN on every rank.
        losses_ok = np.all(np.isnan(steps["loss"])) if simulated else np.all(np.isfinite(steps["loss"]))
        if not losses_ok or not np.all(steps["tokens_per_s"] > 0):
            errors.append("/steps has non-finite losses (NaN when simulated) or non-positive throughput")
        mem = f["memory"][...]
        pools = np.array([text(p) for p in mem["pool"]])
        host, mem = mem[pools == "host"], mem[pools == "device"]
        cats = {text(c) for c in mem["category"]}
        if cats != {"params", "grads", "optimizer", "activations", "workspace", "comm"}:
            errors.append(f"/memory categories {cats}")
        # Held bytes at the end of every step: the ZeRO paper's figures for
        # AdamW, with the stated shard padding (psi_p = psi + padding): 4 + 4
        # + 8 bytes per parameter in fp32, 2 + 2 + 12 in mixed precision.
        # (Only for pure data parallelism: with tp or pp a rank holds a slice
        # of the model, whose size the parity tests check instead.)
        layout = text(f["summary/layout"][()])
        pure_dp = "pp 1 " in layout and layout.endswith("tp 1")
        psi = int(f["summary/parameters"][()])
        psi_p = psi + int(f["summary/padding_elements"][()])
        n = a.world
        mixed = "summary/precision" in f and text(f["summary/precision"][()]) != "fp32"
        e, k = (2, 12) if mixed else (4, 8)  # bytes per parameter (and gradient), per optimizer element
        expect = {"dp": (e * psi, e * psi, k * psi), "zero1": (e * psi_p, e * psi_p, k * psi_p // n),
                  "zero2": (e * psi_p, e * psi_p // n, k * psi_p // n),
                  "zero3": (e * psi_p // n, e * psi_p // n, k * psi_p // n)}[text(f["summary/strategy"][()])]
        # With optimizer offload the optimizer state is in the host arena, none on the device.
        offloaded = len(host) > 0
        for cat, want in zip(("params", "grads", "optimizer"), expect if pure_dp else ()):
            held = mem[[text(c) == cat for c in mem["category"]]]["current_bytes"]
            if not np.all(held == (0 if offloaded and cat == "optimizer" else want)):
                errors.append(f"{cat} bytes {sorted(set(held))} differ from the analytical {want}")
            if offloaded and cat == "optimizer":
                on_host = host[[text(c) == cat for c in host["category"]]]["current_bytes"]
                if text(f.attrs.get("offload_io", "")):
                    # NVMe: the state is in the file, streamed every step (whole
                    # chunks, so at least the state's bytes); the host holds two chunks.
                    st = f["steps"][...]
                    if not np.all(st["nvme_bytes_read"] >= want) or not np.all(st["nvme_bytes_written"] >= want):
                        errors.append(f"NVMe bytes per step {sorted(set(st['nvme_bytes_read']))} below the state's {want}")
                elif not np.all(on_host == want):
                    errors.append(f"host optimizer bytes {sorted(set(on_host))} differ from {want}")
        # The summary's memory is the largest rank's: per rank, the sum over
        # categories of the largest peak over steps.
        totals = {r: sum(int(mem[(mem["rank"] == r) & (np.array([text(c) for c in mem["category"]]) == c)]["peak_bytes"].max())
                         for c in cats) for r in sorted(set(mem["rank"]))}
        worst = max(totals, key=lambda r: (totals[r], -r))
        if int(f["summary/peak_bytes_total"][()]) != totals[worst] or int(f["summary/peak_bytes_rank"][()]) != worst:
            errors.append(f"/summary/peak_bytes_total {f['summary/peak_bytes_total'][()]} on rank "
                          f"{f['summary/peak_bytes_rank'][()]}: the largest rank's is {totals[worst]} on rank {worst}")
        tl = f["timeline"][...]
        phases = {text(x) for x in tl["phase"]}
        whole = {"forward", "backward", "optimizer"}
        split = {"forward", "backward_input", "backward_weight", "optimizer"}  # a zero-bubble schedule
        if phases != whole and phases != split:
            errors.append(f"timeline phases {sorted(phases)}: expected {sorted(whole)} or {sorted(split)}")
        if tl["layer"].max() != a.layers + 1 or not np.all(tl["end"] >= tl["start"]):
            errors.append("timeline layers or spans wrong")
        for k in SUMMARY:
            if f"summary/{k}" not in f:
                errors.append(f"/summary/{k} missing")
            elif "unit" not in f[f"summary/{k}"].attrs and k != "peak_source":
                errors.append(f"/summary/{k} has no unit")
    for e in errors:
        print("FAIL", e)
    print("report ok" if not errors else f"{len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

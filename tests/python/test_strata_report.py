"""strata-report on reports this test writes with the real binary: a 2-rank
zero-bubble pipeline, a single-rank run and a run that failed; its summary,
plots, trace and comparison, its refusal of files that are not reports and
of outputs that would overwrite its input or one another, and the summary
of 100 000 steps (a short run's, repeated) in seconds.

Run by CTest (python.strata_report) as
  /usr/bin/python3 -m pytest tests/python/test_strata_report.py
with STRATA_BIN naming the strata binary (by default build/strata).
"""
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "analysis", "strata-report")
STRATA = os.environ.get("STRATA_BIN") or os.path.join(ROOT, "build", "strata")
sys.path.insert(0, os.path.join(ROOT, "analysis"))

from strata_report import plots as plots_mod  # noqa: E402
from strata_report import read as read_mod  # noqa: E402
from strata_report import summary as summary_mod  # noqa: E402
from strata_report import sweep as sweep_mod  # noqa: E402
from snapshot import snapshot  # noqa: E402
from tiny_deck import DECK  # noqa: E402
from strata_report import trace as trace_mod  # noqa: E402
from strata_report.read import Report, ReportError  # noqa: E402



def strata(tmp, *args, ranks=1, expect=0):
    cmd = (["mpiexec", "-n", str(ranks)] if ranks > 1 else []) + [STRATA, "run", "deck.toml", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    assert r.returncode == expect, r.stdout + r.stderr
    return r


def tool(*args, expect=0):
    r = subprocess.run([TOOL, *args], capture_output=True, text=True)
    assert r.returncode == expect, r.stdout + r.stderr
    return r


@pytest.fixture(scope="session")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reports")
    (tmp / "deck.toml").write_text(DECK)
    strata(tmp, "--set", "parallel.pp=2", "--set", 'parallel.schedule="zb-h1"', "--output", "pp.h5", ranks=2)
    # Context parallelism inside a pipeline: two ranks of each stage share
    # their (pp, dp, tp) coordinates and differ in cp.
    strata(tmp, "--set", "parallel.pp=2", "--set", "parallel.cp=2", "--set", "run.steps=2", "--output", "cppp.h5",
           ranks=4)
    strata(tmp, "--output", "one.h5")
    # A MoE model with its 4 experts over ep 2 of dp 2, tokens dropped.
    strata(tmp, "--set", 'model.kind="moe"', "--set", "model.moe_experts=4", "--set", "model.moe_capacity_factor=1.0",
           "--set", "parallel.dp=2", "--set", "parallel.ep=2", "--output", "moe.h5", ranks=2)
    strata(tmp, "--set", "backend.memory_limit=64KiB", "--output", "failed.h5", expect=1)
    # A sweep: three valid points (one fails on its memory limit), one skipped.
    (tmp / "sweep.toml").write_text(DECK + '[sweep]\nname = "t"\n"parallel.pp" = [1, 2]\n'
                                    '"backend.memory_limit" = ["0", "64KiB"]\n'
                                    'where = ["parallel.pp == 1 or backend.memory_limit == 0"]\n')
    r = subprocess.run([STRATA, "sweep", "sweep.toml", "--results", "sweeps"], cwd=tmp,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr  # one point failed
    # The 2-rank pipeline above, predicted.
    r = subprocess.run([STRATA, "simulate", "deck.toml", "--machine", "a100-80gb", "--set",
                        "parallel.pp=2", "--set", 'parallel.schedule="zb-h1"', "--output", "simpp.h5"], cwd=tmp,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # Simulations, whose reports hold one row per class of identical ranks:
    # 8 ranks, and the README's 4096.
    for deck, name in (("deck.toml", "sim8.h5"), (os.path.join(ROOT, "inputs", "gpt-7b-4096.toml"), "sim4096.h5")):
        more = ["--set", "parallel.pp=2", "--set", "parallel.dp=2", "--set", "parallel.tp=2"] if name == "sim8.h5" else []
        r = subprocess.run([STRATA, "simulate", deck, "--machine", "h100-80gb", *more, "--output",
                            name], cwd=tmp, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(tmp / "other.h5", "w") as f:
        f.attrs["schema"] = "something-else"
    return tmp


def test_summary_states_the_reports_figures(reports):
    out = tool(str(reports / "pp.h5")).stdout
    rep = Report(str(reports / "pp.h5"))
    assert "status  complete" in out
    assert (f"tokens/s {rep.summary['tokens_per_s']:.0f} ({rep.summary['tokens_per_s_per_device']:.0f} per device)"
            in out)
    built = next(l for l in out.splitlines() if l.startswith("built   "))
    assert rep.attrs["compiler"] in built and rep.attrs["hdf5_library"] in built
    for section in ("throughput", "memory per rank", "pipeline bubble (zb-h1, p 2, m 4, v 1)",
                    "communication per axis and op"):
        assert section in out, section
    # One bubble row per rank, with the schedule's theory (p-1)/(3m+p-1).
    lines = out.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("pipeline bubble")) + 2
    rows = [l.split() for l in lines[start:start + 2]]
    assert [r[:3] for r in rows] == [["rank", "0", "0"], ["rank", "1", "1"]]
    assert all(abs(float(r[5]) - 1 / 13) < 1e-3 for r in rows)
    # The recv row carries its peer wait.
    assert any(l.split()[:2] == ["pp", "recv"] for l in out.splitlines() if l.strip())


def test_summary_shows_expert_load_and_all_to_all(reports):
    out = tool(str(reports / "moe.h5")).stdout
    rep = Report(str(reports / "moe.h5"))
    lines = out.splitlines()
    start = lines.index("mixture of experts per measured step (mean over ranks)") + 2
    steps = rep.measured_steps()
    for k, line in zip(np.unique(steps["step"]), lines[start:start + 3]):
        f = line.split()
        assert int(f[0]) == k
        assert abs(float(f[3].rstrip("%")) / 100 - steps["drop_rate"][steps["step"] == k].mean()) < 1e-4
    # Each block's expert shares sum to 100%.
    blocks = [l for l in lines if l.strip().startswith("block ")]
    assert len(blocks) == 4
    for b in blocks:
        shares = [float(x.split("/")[0].rstrip("%")) for x in b.split()[3::2]]
        assert len(shares) == 4 and abs(sum(shares) - 100) < 0.5, b
    assert any(l.split()[:2] == ["ep", "all_to_allv"] for l in lines if l.strip())
    # Dense gradients over dp; the experts' edp group is one rank here (dp / ep = 1): nothing to reduce.
    assert any(l.split()[:2] == ["dp", "all_reduce"] for l in lines if l.strip())
    assert not any(l.split()[:1] == ["edp"] for l in lines if l.strip())


def test_summary_has_a_time_per_layer_table(reports):
    out = tool(str(reports / "pp.h5")).stdout
    lines = out.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("time per layer")) + 2
    rows = [l.split() for l in lines[start:start + 6]]
    # 4 blocks between the embedding (0) and the head (5); zb-h1 splits the backward.
    assert [r[0] for r in rows] == ["0", "1", "2", "3", "4", "5"]
    assert rows[0][1] == "embedding" and rows[5][1:3] == ["head", "+"] and rows[2][1:3] == ["block", "2"]
    assert "backward_input_ms" in lines[start - 1] and "backward_weight_ms" in lines[start - 1]
    # Layer 2's forward: the median over measured steps of its summed spans (one rank holds it).
    rep = Report(str(reports / "pp.h5"))
    tl = rep.table("timeline")
    tl = tl[(tl["layer"] == 2) & (tl["phase"] == "forward") & tl["step"].isin(rep.table("steps").query("warmup == 0")["step"])]
    want = 1e3 * float(np.median((tl["end"] - tl["start"]).groupby(tl["step"]).sum()))
    assert abs(float(rows[2][3]) - want) < 1e-3


def test_moe_plots_include_expert_load(reports, tmp_path):
    out = tool(str(reports / "moe.h5"), "--plots", str(tmp_path)).stdout
    assert (tmp_path / "experts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "experts.png" in out


def test_plots_are_pictures(reports, tmp_path):
    tool(str(reports / "pp.h5"), "--plots", str(tmp_path))
    import matplotlib.image as mpimg
    for name in ("timeline", "memory", "comm"):
        p = tmp_path / f"{name}.png"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(p)
        assert img.shape[0] > 100 and img.shape[1] > 100
        assert img[..., :3].std() > 0.01, f"{name}.png is blank"


def nested(events):
    """Complete events of one track: each starts after the previous ended or
    ends within the innermost open one."""
    stack = []
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        end = e["ts"] + e["dur"]
        while stack and stack[-1] <= e["ts"] + 1e-3:
            stack.pop()
        if stack and end > stack[-1] + 1e-3:
            return False
        stack.append(end)
    return True


def test_trace_has_a_process_per_rank_and_nested_tracks(reports, tmp_path):
    out = tmp_path / "trace.json"
    tool(str(reports / "pp.h5"), "--trace", str(out))
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    procs = {e["pid"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0, 1}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "optimizer", "comm pp"} <= set(names.values())
    complete = [e for e in ev if e["ph"] == "X"]
    rep = Report(str(reports / "pp.h5"))
    assert sum(1 for e in complete if not e["cat"].startswith("comm")) == len(rep.array("timeline"))
    assert sum(1 for e in complete if e["cat"].startswith("comm")) == len(rep.array("comm"))
    assert {"forward", "backward_input", "backward_weight", "optimizer"} <= {e["cat"] for e in complete}
    tracks = {}
    for e in complete:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, events in tracks.items():
        assert nested(events), names[key]


def test_trace_names_ranks_marks_steps_counts_memory_and_links_sends(reports, tmp_path):
    out = tmp_path / "trace.json"
    tool(str(reports / "pp.h5"), "--trace", str(out))
    ev = json.loads(out.read_text())["traceEvents"]
    rep = Report(str(reports / "pp.h5"))
    host = rep.table("ranks")["host"][0]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: f"rank 0 (pp 0, dp 0, cp 0, tp 0) on {host}", 1: f"rank 1 (pp 1, dp 0, cp 0, tp 0) on {host}"}
    marks = [e for e in ev if e["ph"] == "i"]
    assert sorted((e["pid"], e["name"]) for e in marks) == sorted((r, f"step {s}") for r in (0, 1) for s in range(4))
    counters = [e for e in ev if e["ph"] == "C"]
    assert len(counters) == 2 * 4 and all(set(e["args"]) == {"params", "grads", "optimizer", "activations",
                                                               "workspace", "comm"} for e in counters)
    # A flow from every pp send (stage 0 -> 1 activations, 1 -> 0 gradients) to its receive.
    comm = rep.table("comm")
    sends = comm[(comm["axis"] == "pp") & (comm["op"] == "send")]
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert len(sends) > 0 and len(starts) == len(ends) == len(sends)
    for i, s in starts.items():
        assert ends[i]["pid"] != s["pid"] and ends[i]["ts"] >= s["ts"]


def test_trace_of_cp_within_a_pipeline_keeps_ranks_apart_and_links_the_right_ones(reports, tmp_path):
    # cp 2 x pp 2: the ranks of a stage differ in cp alone. Each rank is its
    # own process track, named by every coordinate of /ranks, and each
    # pipeline flow runs from a send to the receive of the rank at the
    # sender's cp (and dp, tp) on the other stage, never its cp neighbour's.
    out = tmp_path / "trace.json"
    tool(str(reports / "cppp.h5"), "--trace", str(out))
    ev = json.loads(out.read_text())["traceEvents"]
    rep = Report(str(reports / "cppp.h5"))
    ranks = rep.table("ranks")
    assert list(ranks.columns[2:]) == ["pp", "dp", "cp", "tp"]
    coords = {int(r["rank"]): (int(r["pp"]), int(r["dp"]), int(r["cp"]), int(r["tp"])) for _, r in ranks.iterrows()}
    assert sorted(coords.values()) == [(p, 0, c, 0) for p in (0, 1) for c in (0, 1)]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs) == [0, 1, 2, 3] and len(set(procs.values())) == 4
    for r, (p, d, c, t) in coords.items():
        assert procs[r].startswith(f"rank {r} (pp {p}, dp {d}, cp {c}, tp {t}) on ")
    comm = rep.table("comm")
    sends = comm[(comm["axis"] == "pp") & (comm["op"] == "send")]
    recvs = comm[(comm["axis"] == "pp") & (comm["op"] == "recv")]
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert len(sends) > 0 and len(starts) == len(ends) == len(sends) == len(recvs)
    for i, s in starts.items():
        a, b = coords[s["pid"]], coords[ends[i]["pid"]]
        assert a[0] != b[0] and a[1:] == b[1:], (a, b)
    # Every rank both sends and receives: no two ranks' messages were merged.
    assert {s["pid"] for s in starts.values()} == set(coords) == {e["pid"] for e in ends.values()}


def read_as_hta(path):
    """(metadata, events) of a trace as Holistic Trace Analysis's parser
    takes it: a JSON object whose keys besides traceEvents are metadata;
    float times rounded inwards to whole microseconds; events without a
    duration or a category dropped; the args stream and correlation as
    columns (-1 when absent); then each host event (stream < 0) in the
    ProfilerStep#N span it starts in, and each kernel (stream > 0) in its
    correlated host event's."""
    import pandas as pd

    doc = json.loads(open(path).read())
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    df = pd.DataFrame(doc["traceEvents"])
    end = df["ts"] + df["dur"]
    df["ts"] = df["ts"].apply(lambda x: x if pd.isna(x) else float(np.ceil(x)))
    df["dur"] = end.apply(lambda x: x if pd.isna(x) else float(np.floor(x))) - df["ts"]
    df = df.dropna(subset=["dur", "cat"]).reset_index(drop=True)
    for arg in ("stream", "correlation"):
        df[arg] = df["args"].apply(lambda a: a.get(arg, -1) if isinstance(a, dict) else -1)
    steps = df[df["name"].str.match(r"ProfilerStep#\d+")]
    def step_of(ts):
        it = -1
        for _, s in steps.iterrows():
            if s["ts"] <= ts < s["ts"] + s["dur"]:
                it = int(s["name"].split("#")[1])
        return it
    df["iteration"] = -1
    host = df["stream"] < 0
    df.loc[host, "iteration"] = df.loc[host, "ts"].apply(step_of)
    by_corr = {c: it for c, it in zip(df.loc[host, "correlation"], df.loc[host, "iteration"]) if c >= 0}
    dev = df["stream"] > 0
    df.loc[dev, "iteration"] = df.loc[dev, "correlation"].apply(lambda c: by_corr.get(c, -1))
    return meta, df


@pytest.mark.parametrize("name", ["pp.h5", "moe.h5", "sim8.h5"])
def test_trace_per_rank_reads_as_holistic_trace_analysis_reads_it(reports, tmp_path, name):
    rep = Report(str(reports / name))
    tool(str(reports / name), "--trace-per-rank", str(tmp_path / "ranks"))
    tl, cm = rep.table("timeline"), rep.table("comm")
    for r in rep.row_ranks:
        meta, df = read_as_hta(tmp_path / "ranks" / f"rank-{r}.json")
        assert meta["distributedInfo"]["rank"] == r and meta["distributedInfo"]["world_size"] == rep.world
        assert set(df["cat"]) == {"user_annotation", "cpu_op", "kernel"}
        assert set(df["pid"]) == {r}
        mine_tl, mine_cm = tl[tl["rank"] == r], cm[cm["rank"] == r]
        # A ProfilerStep#N per step, and every kernel in its own step.
        steps = sorted(int(n.split("#")[1]) for n in df["name"] if n.startswith("ProfilerStep#"))
        assert steps == sorted(set(mine_tl["step"]) | set(mine_cm["step"]))
        kernels = df[df["cat"] == "kernel"]
        assert (kernels["stream"] > 0).all() and (df[df["cat"] != "kernel"]["stream"] < 0).all()
        assert list(kernels["iteration"]) == [a["step"] for a in kernels["args"]]
        # One kernel per compute span and per call; communication is named as HTA classifies it.
        comm = kernels["name"].str.startswith("nccl:")
        assert (~comm).sum() == len(mine_tl) and comm.sum() == len(mine_cm)
        # Kernels on one stream never overlap (those HTA's rounding leaves a
        # whole microsecond or more: a shorter one rounds to nothing).
        for _, k in kernels[kernels["dur"] > 0].groupby("stream"):
            k = k.sort_values("ts")
            assert ((k["ts"].values[1:] - (k["ts"] + k["dur"]).values[:-1]) >= 0).all()


def test_simulation_rows_stand_for_classes_of_ranks(reports):
    rep = Report(str(reports / "sim8.h5"))
    assert rep.world == 8 and rep.attrs["rank_rows"] == "classes"
    # pp 2 x dp 2 x tp 2: a class per pipeline stage, its first rank standing for it.
    assert len(rep.row_ranks) == 2 and sum(rep.members(r) for r in rep.row_ranks) == 8
    assert sorted(set(rep.column("steps", "rank"))) == rep.row_ranks == sorted(set(rep.column("memory", "rank")))
    assert [rep.rank_label(r) for r in rep.row_ranks] == ["ranks 0-3", "ranks 4-7"]
    out = tool(str(reports / "sim8.h5")).stdout
    mem = out[out.index("memory per rank"):].splitlines()
    assert mem[2].startswith("  ranks 0-3 ") and mem[3].startswith("  ranks 4-7 "), mem[:4]
    # The communication table: its rows, up to the blank line before
    # whether the prediction fits.
    table = out[out.index("communication per axis"):].split("\n\n")[0].splitlines()[2:]
    # A simulated call's time is its transfer alone; waiting for the group
    # is apart, and neither is negative.
    for line in table:
        xfer, late = (float(x) for x in line.split()[-6:-4])
        assert xfer >= 0 and late >= 0, line
    # The communication table counts a class's row for each of its ranks:
    # every rank issues the tensor-parallel all-reduce of the activations, a
    # stage's 4 ranks the ops of that stage alone.
    comm = [l.split() for l in table]
    tp = [c for c in comm if c[0] == "tp" and c[1] == "all_reduce"]  # op, size class (2 words), n, ranks
    assert tp and tp[0][4:6] == ["2", "8"] and all(c[5] in ("4", "8") for c in tp), tp


def test_a_4096_rank_simulation_reads_in_few_lines_small_pictures_and_a_process_per_class(reports, tmp_path):
    out = tool(str(reports / "sim4096.h5"), "--plots", str(tmp_path), "--trace", str(tmp_path / "t.json")).stdout
    summary = out[:out.index("wrote ")]
    assert len(summary.splitlines()) < 100, summary
    assert not any(l.startswith("  loss ") for l in summary.splitlines()) and "PFLOP/s" in summary
    import matplotlib.image as mpimg
    for name in ("timeline", "memory", "comm"):
        h, w = mpimg.imread(tmp_path / f"{name}.png").shape[:2]
        assert h <= 1200 and w <= 2000, (name, h, w)
    rep = Report(str(reports / "sim4096.h5"))
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs) == rep.row_ranks and len(procs) < 64
    assert procs[0].startswith("ranks 0-511 (pp 0, dp 0, cp 0, tp 0 of the first) on simulated"), procs[0]


def test_lanes_keep_overlapping_calls_apart():
    placed = trace_mod.lanes([(0, 10, "a"), (2, 5, "b"), (6, 12, "c"), (11, 13, "d")])
    lane = {p: l for l, _, _, p in placed}
    assert lane["a"] == 0 and lane["b"] == 1 and lane["c"] == 1 and lane["d"] == 0


def test_a_dry_runs_estimate_reads_as_one(tmp_path):
    # Not "a failed run" with layout "?": an estimate names its layout,
    # strategy, precision and parameters as a run does, and says what it is.
    (tmp_path / "deck.toml").write_text(DECK)
    strata(tmp_path, "--set", "parallel.dp=2", "--set", "parallel.zero=1", "--dry-run", "--output", "e.h5")
    out = tool(str(tmp_path / "e.h5")).stdout
    assert "status  estimate" in out and "(a dry run's estimate:" in out and "failed" not in out, out
    run_line = next(l for l in out.splitlines() if l.startswith("run "))
    assert "2 rank(s): pp 1 x dp 2 x tp 1" in run_line and "strategy zero1" in run_line, run_line
    assert f"{Report(str(tmp_path / 'e.h5')).summary['parameters'] / 1e6:.3f} M parameters" in run_line
    assert "0.000 M parameters" not in run_line


def test_failed_run_is_read(reports, tmp_path):
    out = tool(str(reports / "failed.h5"), "--plots", str(tmp_path), "--trace", str(tmp_path / "t.json")).stdout
    assert "status  failed" in out and "memory_limit" in out


def test_compare_puts_two_runs_side_by_side(reports):
    out = tool("compare", str(reports / "one.h5"), str(reports / "pp.h5")).stdout
    lines = {l.split("  ")[0].strip(): l for l in out.splitlines()}
    assert "zb-h1" in lines["schedule"] and "pp 2 x dp 1 x tp 1" in lines["layout"]
    assert "tokens/s" in out and "B / A" in out


def test_compare_takes_any_number_of_runs_as_json_and_csv(reports):
    paths = [str(reports / n) for n in ("one.h5", "pp.h5", "moe.h5")]
    j = json.loads(tool("compare", *paths, "--format", "json").stdout)
    # One object per report, snake_case keys, SI units alongside.
    assert [r["path"] for r in j["reports"]] == paths
    assert j["units"]["step_time_s"] == "s" and j["units"]["peak_memory_bytes"] == "B"
    assert j["units"]["tokens_per_s"] == "token/s" and j["units"]["mfu"] == "1"
    for r in j["reports"]:
        assert all(k == k.lower() and " " not in k and "%" not in k for k in r), list(r)
    assert [r["config"]["parallel.pp"] for r in j["reports"]] == [1, 2, 1]
    assert [r["config"]["model.kind"] for r in j["reports"]] == ["gpt", "gpt", "moe"]
    assert "run.steps" not in j["reports"][0]["config"]  # the same in all three
    # The headline figures are the reports' own /summary, not recomputed.
    reps = [Report(p) for p in paths]
    assert [r["tokens_per_s"] for r in j["reports"]] == [r.summary["tokens_per_s"] for r in reps]
    assert [r["step_time_s"] for r in j["reports"]] == [r.summary["step_time"] for r in reps]
    assert [r["mfu"] for r in j["reports"]] == [r.summary["mfu"] for r in reps]
    assert [r["peak_memory_bytes"] for r in j["reports"]] == [r.summary["peak_bytes_total"] for r in reps]
    # CSV: a header of keys with their units, then one row per report.
    rows = list(csv.DictReader(io.StringIO(tool("compare", *paths, "--format", "csv").stdout)))
    assert [r["path"] for r in rows] == paths
    assert [r["config.parallel.pp"] for r in rows] == ["1", "2", "1"]
    assert [float(r["step_time_s [s]"]) for r in rows] == [r.summary["step_time"] for r in reps]
    text_out = tool("compare", *paths).stdout
    assert "C / A" in text_out and "parallel.pp" in text_out
    assert "different peak" not in text_out  # one peak for all three
    assert "needs at least two" in tool("compare", paths[0], expect=2).stderr


def test_compare_gives_exposed_communication_per_step(reports):
    # A run's /summary/comm sums its measured steps; its simulation's holds
    # one step. compare's figure is per rank and step for both: the mean over
    # measured steps and ranks of /steps' exposed communication per axis.
    paths = [str(reports / "pp.h5"), str(reports / "simpp.h5")]
    j = json.loads(tool("compare", *paths, "--format", "json").stdout)
    run = Report(paths[0])
    s = run.measured_steps()
    exposed = sum(s[c] for c in s.dtype.names if c.startswith("exposed_comm_"))
    assert run.summary["measured_steps"] == 3 and len(np.unique(s["step"])) == 3
    want = exposed.sum() / len(s)
    assert abs(j["reports"][0]["exposed_comm_s"] - want) <= 1e-9 * want, (j["reports"][0]["exposed_comm_s"], want)
    sim = Report(paths[1])
    assert j["reports"][1]["exposed_comm_s"] == pytest.approx(
        sum(r[7] for r in summary_mod.comm_per_axis_op(sim)), rel=1e-12)
    assert "exposed comm per rank and step ms" in tool("compare", *paths).stdout


def test_compare_says_when_mfu_divides_by_different_peaks(reports):
    out = tool("compare", str(reports / "one.h5"), str(reports / "sim8.h5")).stdout
    note = next(l for l in out.splitlines() if l.startswith("note: MFU divides by a different peak"))
    assert "A 50.00 GFLOP/s (fp32)" in note and "B 67.00 TFLOP/s (fp32)" in note, note


def test_compare_sets_a_prediction_beside_its_run_phase_by_phase(reports):
    paths = [str(reports / "pp.h5"), str(reports / "simpp.h5")]

    def refuse(c):
        raise ValueError(f"not JSON: {c}")

    # Strict JSON: a simulation's NaN loss is null.
    j = json.loads(tool("compare", *paths, "--format", "json").stdout, parse_constant=refuse)
    assert j["reports"][1]["final_loss"] is None
    (pred,) = j["predictions"]
    assert pred["predicted"] == paths[1] and pred["measured"] == paths[0]
    rows = {(f["figure"], f["stage"]): f for f in pred["figures"]}
    run, sim = Report(paths[0]), Report(paths[1])
    assert rows[("step time s", -1)]["measured"] == run.summary["step_time"]
    assert rows[("step time s", -1)]["predicted"] == sim.summary["step_time"]
    for stage in (0, 1):
        for figure in ("compute forward s", "compute backward_input s", "compute backward_weight s",
                       "compute optimizer s", "exposed comm pp s", "bubble"):
            assert (figure, stage) in rows, (figure, stage)
    for f in pred["figures"]:
        assert f["measured"] >= 0 and f["error"] == pytest.approx((f["predicted"] - f["measured"]) / f["measured"])
    # The bubble is each stage's own, as /summary/pipeline has it.
    pipe = run.table("summary/pipeline")
    for _, p in pipe.iterrows():
        assert rows[("bubble", int(p["pp_rank"]))]["measured"] == pytest.approx(p["bubble"])
    out = tool("compare", *paths).stdout
    assert "prediction against measurement, phase by phase: B (simulated) against A (measured)" in out


class FakeReport:
    """Tables as a Report gives them, for the arithmetic of one helper."""

    def __init__(self, **tables):
        self.tables = tables

    def array(self, name):
        return self.tables.get(name, np.zeros(0))


def test_a_spans_compute_leaves_out_the_waits_inside_it():
    from strata_report.summary import span_compute

    tl = np.array([(0, 0, 0.0, 10.0), (0, 0, 10.0, 20.0), (1, 0, 0.0, 10.0)],
                  dtype=[("rank", "i8"), ("step", "i8"), ("start", "f8"), ("end", "f8")])
    # Rank 0: a blocking call over [5, 7] (wait 2); a non-blocking one from 8
    # to 15 whose 3 s of wait come at its end, [12, 15]. Rank 1's spans know
    # nothing of rank 0's calls.
    # A third call, waited for together with the second ([13, 15]), adds
    # no blocked time: a moment blocked counts once.
    cm = np.array([(0, 0, 5.0, 7.0, 2.0, 0), (0, 0, 8.0, 15.0, 3.0, 1), (0, 0, 9.0, 15.0, 2.0, 1)],
                  dtype=[("rank", "i8"), ("step", "i8"), ("start", "f8"), ("end", "f8"), ("wait", "f8"),
                         ("nonblocking", "i8")])
    assert list(span_compute(FakeReport(timeline=tl, comm=cm))) == [8.0, 7.0, 10.0]


def test_tables_carry_their_units(reports):
    r = Report(reports / "pp.h5")
    units = r.table("steps").attrs["units"]
    assert units["step_time"] == "s" and units["tokens_per_s"] == "tokens/s" and units["rank"] == "1"
    assert r.table("memory").attrs["units"]["peak_bytes"] == "B"
    assert set(units) == set(r.table("steps").columns)


def test_sweep_index_reads_through_the_api_with_a_column_per_axis(reports):
    import strata_report

    ix = strata_report.open_file(str(reports / "sweeps" / "t" / "index.h5"))
    assert isinstance(ix, strata_report.Index)
    df = ix.table()
    assert list(df["parallel.pp"]) == [1, 1, 2, 2]
    assert list(df["backend.memory_limit"]) == ["0", "64KiB", "0", "64KiB"]
    assert df.attrs["units"]["tokens_per_s"] == "tokens/s" and df.attrs["units"]["peak_bytes"] == "B"
    assert sorted(set(df["status"])) == ["complete", "failed", "skipped"]
    assert isinstance(strata_report.open_file(str(reports / "pp.h5")), strata_report.Report)


def test_the_package_installs_and_runs_without_pythonpath(reports, tmp_path):
    # A copy of analysis/, so that the build leaves nothing in the tree.
    import shutil

    src = tmp_path / "analysis"
    shutil.copytree(os.path.join(ROOT, "analysis"), src, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-build-isolation", "--no-deps", str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import strata_report; print(strata_report.__file__)"],
                       cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and str(venv) in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(venv / "bin" / "strata-report"), str(reports / "one.h5")], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "status  complete" in r.stdout, r.stdout + r.stderr


def test_report_api_gives_dataframes_summary_and_config(reports):
    import strata_report
    import pandas as pd

    r = strata_report.Report(reports / "pp.h5")
    steps = r.table("steps")
    assert isinstance(steps, pd.DataFrame) and len(steps) == 4 * 2
    assert list(steps.columns) == list(r.array("steps").dtype.names)
    phases = r.table("timeline")["phase"]
    assert all(isinstance(x, str) for x in phases) and "forward" in set(phases)
    assert r.config["parallel"]["pp"] == 2 and r.config["parallel"]["schedule"] == "zb-h1"
    assert r.summary["layout"].startswith("pp 2") and r.summary["tokens_per_s"] > 0
    # One step time per step (the slowest rank's), and the summary's median of it.
    per_step = steps[steps["warmup"] == 0].groupby("step")
    assert (per_step["step_time"].nunique() == 1).all()
    assert (per_step["step_time"].first() == per_step["rank_step_time"].max()).all()
    assert r.summary["step_time"] == pytest.approx(float(np.median(per_step["step_time"].first())), rel=1e-12)
    with pytest.raises(strata_report.ReportError, match="no table 'stepz'"):
        r.table("stepz")


def test_sweep_table_memory_is_the_largest_ranks(reports):
    ix = h5py.File(reports / "sweeps" / "t" / "index.h5")["points"][...]
    done = ix[ix["status"] == b"complete"]
    assert len(done) == 2
    for row in done:
        rep = Report(reports / "sweeps" / "t" / os.path.basename(row["report"].decode()))
        totals = {}
        m = rep.table("memory")
        m = m[m["pool"] == "device"]
        for (rank, cat), g in m.groupby(["rank", "category"]):
            totals[rank] = totals.get(rank, 0) + int(g["peak_bytes"].max())
        assert row["peak_bytes"] == max(totals.values()) == rep.summary["peak_bytes_total"]


@pytest.mark.parametrize("name,why", [("other.h5", "schema is 'something-else'"), ("missing.h5", "cannot open")])
def test_other_files_are_refused(reports, name, why):
    r = tool(str(reports / name), expect=2)
    assert why in r.stderr and "strata-report: error:" in r.stderr


def test_unusable_output_paths_are_refused_before_any_work(reports, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args, why in [(["--trace", str(tmp_path / "missing" / "t.json")], "does not exist"),
                      (["--trace", str(tmp_path)], "is a directory"),
                      (["--trace", str(fifo)], "not a regular file"),
                      (["--plots", str(a_file)], "exists and is not a directory"),
                      (["--trace-per-rank", str(a_file)], "exists and is not a directory")]:
        r = tool(str(reports / "one.h5"), *args, expect=2)
        assert why in r.stderr and "strata-report: error:" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stdout == "", "nothing is printed or written before the check"
    assert fifo.is_fifo()


# Outputs that would overwrite the input (a report, in.h5, or a sweep's
# index, index.h5) or another output: (the arguments, run in a directory
# that collision_tree set up, and what the one line must say besides the
# option and its path).
COLLISIONS = {
    "trace is the input": (["in.h5", "--trace", "in.h5"], "is the input in.h5"),
    "trace is ./ the input": (["in.h5", "--trace", "./in.h5"], "is the input in.h5"),
    "trace is the input through ..": (["in.h5", "--trace", "sub/../in.h5"], "is the input in.h5"),
    "trace is a hard link to the input": (["in.h5", "--trace", "hard.h5"], "is the input in.h5"),
    "trace is a symbolic link to the input": (["in.h5", "--trace", "sym.h5"], "is the input in.h5"),
    "plots is the input": (["in.h5", "--plots", "in.h5"], "is the input in.h5"),
    "plots would write a hard link to the input": (["in.h5", "--plots", "plots-hard"],
                                                   "would write plots-hard/timeline.png, which is the input in.h5"),
    "plots would write a symbolic link to the input": (["in.h5", "--plots", "./plots-sym"],
                                                       "which is the input in.h5"),
    "plots would write the input itself": (["plots-self/comm.png", "--plots", "plots-self"],
                                           "which is the input plots-self/comm.png"),
    "trace-per-rank is the input": (["in.h5", "--trace-per-rank", "./in.h5"], "is the input in.h5"),
    "trace-per-rank would write a hard link to the input": (["in.h5", "--trace-per-rank", "ranks-hard"],
                                                            "ranks-hard/rank-0.json, which is the input in.h5"),
    "trace-per-rank would write a symbolic link to the input": (["in.h5", "--trace-per-rank", "ranks-sym"],
                                                                "ranks-sym/rank-1.json, which is the input in.h5"),
    "index plots would write a symbolic link to the index": (["index.h5", "--plots", "index-plots"],
                                                             "index-plots/sweep.png, which is the input index.h5"),
    "index trace is the index": (["index.h5", "--trace", "index.h5"], "is the input index.h5"),
    "trace and plots write one picture": (["in.h5", "--trace", "out/timeline.png", "--plots", "out"],
                                          "also written by --trace out/timeline.png"),
    "trace and plots write one picture, spelt apart": (["in.h5", "--trace", "out/./comm.png", "--plots", "./out"],
                                                       "also written by --trace out/./comm.png"),
    "trace and trace-per-rank write one rank's file": (["in.h5", "--trace", "out/rank-1.json", "--trace-per-rank",
                                                        "out"], "also written by --trace-per-rank out"),
    "trace is the plots directory": (["in.h5", "--trace", "out", "--plots", "out"], "also written by --trace out"),
    "trace is a report being written": (["in.h5", "--trace", "in.h5.partial"], ".lock or .partial"),
    "plots is a claim": (["in.h5", "--plots", "plots.lock"], ".lock or .partial"),
}


def collision_tree(reports, top):
    """A report (in.h5) and an index (index.h5) in `top`, and links to
    them: hard.h5, sym.h5, plots-hard/timeline.png, plots-sym/memory.png,
    ranks-hard/rank-0.json, ranks-sym/rank-1.json, index-plots/sweep.png;
    plots-self/comm.png, a report of its own."""
    shutil.copy(reports / "pp.h5", top / "in.h5")
    shutil.copy(reports / "sweeps" / "t" / "index.h5", top / "index.h5")
    for d in ("sub", "plots-hard", "plots-sym", "plots-self", "ranks-hard", "ranks-sym", "index-plots"):
        (top / d).mkdir()
    shutil.copy(reports / "pp.h5", top / "plots-self" / "comm.png")
    os.link(top / "in.h5", top / "hard.h5")
    os.symlink("in.h5", top / "sym.h5")
    os.link(top / "in.h5", top / "plots-hard" / "timeline.png")
    os.symlink("../in.h5", top / "plots-sym" / "memory.png")
    os.link(top / "in.h5", top / "ranks-hard" / "rank-0.json")
    os.symlink(top / "in.h5", top / "ranks-sym" / "rank-1.json")
    os.symlink("../index.h5", top / "index-plots" / "sweep.png")


@pytest.mark.parametrize("case", list(COLLISIONS))
def test_an_output_on_an_input_or_another_output_is_refused_and_nothing_written(reports, tmp_path, case):
    args, says = COLLISIONS[case]
    collision_tree(reports, tmp_path)
    before = snapshot(tmp_path)
    r = subprocess.run([TOOL, *args], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    # One line, naming an option and its path, and what it collides with.
    named = [f"strata-report: error: {a} {b}: " for a, b in zip(args, args[1:]) if a.startswith("--")]
    assert any(r.stderr.startswith(n) for n in named) and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert r.stdout == "", "nothing is printed before the check"
    assert snapshot(tmp_path) == before, "the input is as it was, and nothing was written"


def test_the_writers_refuse_to_write_over_their_report(reports, tmp_path):
    # The API as the command: trace.write(rep, rep.path) is refused.
    shutil.copy(reports / "pp.h5", tmp_path / "in.h5")
    (tmp_path / "ranks").mkdir()
    os.link(tmp_path / "in.h5", tmp_path / "ranks" / "rank-1.json")
    before = snapshot(tmp_path)
    rep = Report(str(tmp_path / "in.h5"))
    for write, path in ((trace_mod.write, rep.path), (trace_mod.write_per_rank, str(tmp_path / "ranks")),
                        (plots_mod.write_all, rep.path)):
        with pytest.raises(ReportError, match="the report .*in.h5 \\(the same file\\)"):
            write(rep, path)
    assert snapshot(tmp_path) == before


def tile_report(src, dst, steps):
    """A report at dst that is src with its measured steps repeated to
    `steps` of them: every table with a step column (/steps, /timeline,
    /comm, /memory, /experts) keeps its warm-up rows and then holds copy c
    of measured step i as step first + c x (measured steps) + i, its rows in
    their order; the times are left as they are, so that each copy's
    figures are the source's to the bit. Everything else is copied."""
    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
        for k, v in f.attrs.items():
            g.attrs[k] = v
        s = f["steps"][...]
        measured = np.unique(s["step"][s["warmup"] == 0])
        assert steps % len(measured) == 0 and np.array_equal(measured, np.arange(measured[0], measured[-1] + 1))
        copies = steps // len(measured)
        for name, obj in f.items():
            if not (isinstance(obj, h5py.Dataset) and obj.dtype.names and "step" in obj.dtype.names):
                f.copy(obj, g, name)
                continue
            t = obj[...]
            warm, t = t[~np.isin(t["step"], measured)], t[np.isin(t["step"], measured)]
            tiled = np.tile(t, copies)
            tiled["step"] = (measured[0] + len(measured) * np.arange(copies)[:, None]
                             + (t["step"] - measured[0])[None, :]).ravel()
            d = g.create_dataset(name, data=np.concatenate([warm, tiled]))
            for k, v in obj.attrs.items():
                d.attrs[k] = v
        g["summary/measured_steps"][()] = float(steps)


def test_the_summary_of_100000_steps_takes_seconds_and_says_what_each_step_did(tmp_path, monkeypatch):
    # A 2-rank data-parallel run of 4 measured steps (waits inside its spans,
    # two ranks to average), its steps copied to 100 000: each layer's
    # medians, the step times and the memory are the source's.
    (tmp_path / "deck.toml").write_text(DECK)
    strata(tmp_path, "--set", "parallel.dp=2", "--set", "model.layers=1", "--set", "data.global_batch=2", "--set",
           "run.steps=5", "--output", "src.h5", ranks=2)
    big = tmp_path / "big.h5"
    t0 = time.monotonic()
    tile_report(tmp_path / "src.h5", big, 100_000)
    made = time.monotonic() - t0
    try:
        # A file this test wrote whole: read here, not in a child process.
        monkeypatch.setattr(read_mod, "ISOLATE", False)
        src, rep = Report(str(tmp_path / "src.h5")), Report(str(big))

        # Past two minutes (the summary was once quadratic in steps: hours
        # here), give up rather than hang.
        def too_long(*_):
            raise TimeoutError("the summary of 100 000 steps ran past 120 s")

        old = signal.signal(signal.SIGALRM, too_long)
        signal.alarm(120)
        try:
            t0 = time.monotonic()
            out = summary_mod.render(rep)  # what strata-report FILE prints
            took = time.monotonic() - t0
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        assert took < 5.0, f"the summary of 100 000 steps took {took:.1f} s (the report was made in {made:.1f} s)"
        assert len(np.unique(rep.measured_steps()["step"])) == 100_000
        layers = summary_mod.layer_times(rep)
        assert layers == summary_mod.layer_times(src) and len(layers) == 3 and len(src.array("comm")) > 0
        # The same summary but for the path and the number of steps.
        want = summary_mod.render(src)
        assert "over 4 measured steps" in want
        assert out == want.replace(src.path, rep.path, 1).replace("over 4 measured steps", "over 100000 measured steps")
    finally:
        big.unlink()


def test_sweep_index_ranks_points_and_draws_the_front(reports, tmp_path):
    out = tool(str(reports / "sweeps" / "t" / "index.h5"), "--plots", str(tmp_path)).stdout
    assert "4 point(s): 2 complete, 1 failed, 1 skipped" in out
    lines = out.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("complete points by throughput")) + 2
    ranked = [l for l in lines[start:start + 2]]
    tps = [float(l[1:].split()[2]) for l in ranked]
    assert tps == sorted(tps, reverse=True) and all(t > 0 for t in tps)
    assert "memory_limit" in out and "filtered out by where" in out
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pareto_front():
    tp = np.array([10.0, 12.0, 8.0, 12.0, 5.0])
    mem = np.array([4.0, 6.0, 3.0, 7.0, 3.0])
    # (3, 8) beats (3, 5); (4, 10); (6, 12) beats (7, 12).
    assert sweep_mod.pareto(tp, mem) == [2, 0, 1]


# A plan's /points (docs/report-schema.md, strata-plan v1): the columns
# `strata plan` writes, with their units.
PLAN_COLUMNS = [("point", "<i8", "1"), ("overrides", "S1024", ""), ("world", "<i8", "1"), ("status", "S16", ""),
                ("reason", "S512", ""), ("report", "S256", ""), ("tokens_per_s", "<f8", "tokens/s"),
                ("mfu", "<f8", "1"), ("step_time", "<f8", "s"), ("peak_bytes", "<f8", "B"),
                ("final_loss", "<f8", "nats/token"), ("bubble", "<f8", "1"), ("exposed_comm", "<f8", "s"),
                ("bound", "<f8", "s")]


def write_points(path, rows, attrs):
    """An index or plan at `path`: root attributes `attrs` and /points from
    `rows`, [(status, reason)], the complete ones with figures that differ."""
    n = len(rows)
    t = np.zeros(n, dtype=[(c, k) for c, k, _ in PLAN_COLUMNS])
    t["point"] = np.arange(n)
    t["world"] = 64
    t["status"] = [s.encode() for s, _ in rows]
    t["reason"] = [r.encode() for _, r in rows]
    tp = np.arange(n) % 997 + 1.0
    done = t["status"] == b"complete"
    t["tokens_per_s"] = np.where(done, 1000.0 * tp, 0.0)
    t["mfu"] = np.where(done, tp / 2000.0, 0.0)
    t["step_time"] = np.where(done, 1.0 / tp, 0.0)
    t["peak_bytes"] = np.where(done, (np.arange(n) % 89 + 1) * 2.0**30, 0.0)
    t["final_loss"] = np.nan
    t["overrides"] = [f"parallel.tp={1 << (i % 4)} parallel.pp={1 << (i % 5)} parallel.dp={i % 7 + 1} "
                      f'parallel.schedule="1f1b" model.recompute="none"'.encode() for i in range(n)]
    with h5py.File(path, "w") as f:
        for k, v in attrs.items():
            f.attrs[k] = v
        d = f.create_dataset("points", data=t)
        for c, _, unit in PLAN_COLUMNS:
            d.attrs[f"unit:{c}"] = unit


def plan_rows(rng):
    """30 000 rows of a plan and {kind of reason: rows}: 300 complete, the
    rest skipped for a handful of reasons whose numbers (and where the value
    came from) vary from row to row, as `strata plan` gives them, and 15
    rare reasons besides."""
    rows, want = [("complete", "")] * 300, {}

    def add(kind, reasons):
        want[kind] = want.get(kind, 0) + len(reasons)
        rows.extend(("skipped", r) for r in reasons)

    add("cannot win", [f"cannot win: a step takes at least {rng.uniform(2, 90):.3f} s (the layout's lower bound), "
                       f"the 10th best predicted takes 1.872 s" for _ in range(18_000)])
    add("does not fit", [f"does not fit: device peak {rng.uniform(75, 900):.2f} GiB > 74.50 GiB" for _ in range(4_000)])
    add("tp does not divide heads",
        [f"--set parallel.tp={t}: parallel.tp = {t} (--set parallel.tp={t}) does not divide model.heads = 64"
         for t in rng.choice([3, 5, 6, 7], 3_000)])
    # Two problems at once: the first is the one counted.
    add("layers", [f"inputs/deck.toml:16: model.layers = 80 (line 16) is not a multiple of parallel.pp = {p} "
                   f"(--set parallel.pp={p}): every pipeline stage takes the same number of layers"
                   + ("\n--set parallel.schedule=\"zb-h1\": too few micro-batches" if i % 2 else "")
                   for i, p in enumerate(rng.choice([3, 6, 7, 9, 12, 32], 2_500))])
    add("schedule", [f'--set parallel.schedule="zb-v": parallel.schedule = "zb-v" (--set parallel.schedule="zb-v") '
                     f"needs parallel.virtual_stages = 2, not {v}" for v in rng.choice([1, 3], 1_945)])
    for k in range(15):
        add(f"rare {k}", [f"rare problem number-{k} of its own kind"] * (10 + k))
    assert len(rows) == 30_000, len(rows)
    return rows, want


PLAN_ATTRS = {"schema": "strata-plan", "schema_version": 1, "sweep": "synthetic plan", "deck_path": "deck.toml",
              "command_line": "strata plan deck.toml", "start_time": "2026-01-01T00:00:00Z", "machine": "h100-80gb",
              "machine_path": "inputs/machines/h100-80gb.toml", "world_size": 64, "memory_limit": 79993765888,
              "axes": "the rows' searches", "where": "", "status": "complete", "layouts": 30_000,
              "layouts_judged": 12_000, "layouts_pruned": 18_000, "exhaustive": "false"}


def reason_lines(out, status):
    """{label: rows} of a status's section of the index summary, and the
    total its heading gives."""
    lines = out.splitlines()
    at = next(i for i, l in enumerate(lines) if re.match(rf"^[\d ]+ {status}, by reason", l))
    total = int(re.match(rf"^([\d ]+) {status},", lines[at]).group(1).replace(" ", ""))
    got = {}
    for line in lines[at + 1:]:
        m = re.match(r"^  +(\d{1,3}(?: \d{3})*)  (.*)$", line)
        if not m:
            break
        got[m.group(2)] = int(m.group(1).replace(" ", ""))
    return got, total


def test_a_plan_of_30000_rows_summarises_in_few_lines_by_reason(tmp_path, monkeypatch):
    rows, want = plan_rows(np.random.default_rng(7))
    path = tmp_path / "plan.h5"
    write_points(path, rows, PLAN_ATTRS)
    # The work, counted: each string column decoded once (not once per row
    # listed, which made a plan's summary take hours), and each distinct
    # reason looked at once, not each row.
    decoded, kinds = [], []
    real_texts, real_kind = sweep_mod.texts, sweep_mod.reason_kind
    monkeypatch.setattr(sweep_mod, "texts", lambda c: decoded.append(len(c)) or real_texts(c))
    monkeypatch.setattr(sweep_mod, "reason_kind", lambda r: kinds.append(r) or real_kind(r))
    monkeypatch.setattr(read_mod, "ISOLATE", False)
    out = sweep_mod.render(sweep_mod.Index(str(path)))
    distinct = len({r for _, r in rows})
    assert sum(decoded) <= 30_000 and len(kinds) <= distinct, (decoded, len(kinds), distinct)
    lines = out.splitlines()
    assert len(lines) <= sweep_mod.MAX_LINES, out
    assert lines[0].endswith("30 000 point(s): 300 complete, 29 700 skipped"), lines[0]
    assert "layouts: 30 000 enumerated, 12 000 judged, 18 000 pruned (one row each)" in out
    # The fastest 20, then the rest counted.
    assert "the fastest 20 of 300" in out and re.search(r"^  and \d+ more complete point", out, re.M), out
    got, total = reason_lines(out, "skipped")
    assert total == 29_700 and sum(got.values()) == total, got
    # Each kind on one line, its numbers' spread in place of the numbers and
    # without where they came from; the rare ones together on the last.
    assert len(got) <= sweep_mod.MAX_REASONS, got

    def rows_of(pattern):
        found = [n for label, n in got.items() if re.fullmatch(pattern, label)]
        assert len(found) == 1, (pattern, got)
        return found[0]

    assert rows_of(r"cannot win: a step takes at least 2\.\d+\.\.(89|90)\.\d+ s \(the layout's lower bound\), "
                   r"the 10th best predicted takes 1\.872 s") == 18_000
    assert rows_of(r"does not fit: device peak 75\.\d+\.\.(899|900)\.\d+ GiB > 74\.50 GiB") == 4_000
    assert rows_of(r"parallel\.tp = 3\.\.7 does not divide model\.heads = 64") == 3_000
    assert rows_of(r"model\.layers = 80 is not a multiple of parallel\.pp = 3\.\.32: every pipeline stage takes "
                   r"the same number of layers") == want["layers"]
    assert rows_of(r'parallel\.schedule = "zb-v" needs parallel\.virtual_stages = 2, not 1/3') == want["schedule"]
    rest = rows_of(r"and \d+ more reason\(s\)")
    shown_rare = sum(n for label, n in got.items() if label.startswith("rare problem"))
    assert rest + shown_rare == sum(want[f"rare {k}"] for k in range(15)), got
    assert "(the first problem each gives; 1 250 give more than one)" in out
    assert "--set" not in out[out.index("skipped, by reason"):] and "(line 16)" not in out


def test_an_index_of_every_status_stays_short_and_counts_every_row(tmp_path):
    # Many distinct reasons in every status: each status's reasons are cut
    # to what the lines left allow, the rest counted on one line.
    rows = [("complete", "")] * 60
    for s, n in (("failed", 30), ("diverged", 25), ("interrupted", 25), ("skipped", 40)):
        rows += [(s, f"{s} problem-{k} of its own") for k in range(n) for _ in range(k % 3 + 1)]
    rows += [("not_run", "")] * 70  # valid, not run yet: the table gives no reason
    path = tmp_path / "index.h5"
    write_points(path, rows, {"schema": "strata-sweep", "schema_version": 1, "sweep": "every", "deck_path": "d.toml",
                              "axes": "parallel.tp = [1, 2]", "where": ""})
    out = tool(str(path)).stdout
    assert len(out.splitlines()) <= sweep_mod.MAX_LINES, out
    for s in ("failed", "diverged", "interrupted", "not_run", "skipped"):
        got, total = reason_lines(out, s)
        assert total == sum(1 for r in rows if r[0] == s) and sum(got.values()) == total, (s, got)
    got, _ = reason_lines(out, "not_run")
    label = next(iter(got))
    assert len(got) == 1 and label.startswith("not run yet") and label.endswith("(points 297, 298, 299, 300, ...)"), got
    # A failed point is named, to find its log.
    got, _ = reason_lines(out, "failed")
    assert any(re.search(r"\(points? \d+", l) for l in got), got


def test_a_sweeps_skipped_points_are_counted_by_where_clause(tmp_path):
    # The index `strata sweep --index` writes for a deck of 768 points, 708
    # of them rejected by its where clauses and 60 not run: a line per
    # clause, not per point.
    deck = os.path.join(ROOT, "inputs", "sweep-strategies.toml")
    r = subprocess.run([STRATA, "sweep", deck, "--index", "--results", "sw"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tool(str(tmp_path / "sw" / "sweep-strategies" / "index.h5")).stdout
    assert len(out.splitlines()) < 20, out
    got, total = reason_lines(out, "skipped")
    assert total == 708 and sum(got.values()) == 708 and all(l.startswith("filtered out by where") for l in got), got
    got, total = reason_lines(out, "not_run")
    assert total == 60 and list(got.values()) == [60] and next(iter(got)).startswith("not run yet"), got


def simulated_copy(reports, tmp_path, name, **attrs):
    """A copy of the 4096-rank simulation with root attributes set, or
    removed where None: memory_capacity and fits, which binaries before them
    do not write, are set here whatever the binary wrote."""
    dst = tmp_path / name
    shutil.copy(reports / "sim4096.h5", dst)
    with h5py.File(dst, "a") as f:
        for k, v in attrs.items():
            if v is None:
                f.attrs.pop(k, None)
            else:
                f.attrs[k] = v
    return dst


def device_peak(path):
    """The largest device peak over ranks (the most held at once), and its ranks."""
    rep = Report(str(path))
    m = rep.array("memory")
    m = m[m["pool"] == b"device"]
    top = int(m["pool_peak_bytes"].max())
    return top, rep.rank_label(int(m["rank"][np.argmax(m["pool_peak_bytes"])]), 30)


def test_a_prediction_says_whether_it_fits_at_the_top_and_at_the_end(reports, tmp_path):
    peak, ranks = device_peak(reports / "sim4096.h5")
    # A quarter of the peak: it does not fit.
    small = simulated_copy(reports, tmp_path, "small.h5", memory_capacity=np.int64(peak // 4), fits=np.int64(0))
    lines = tool(str(small)).stdout.splitlines()
    want = (f"DOES NOT FIT: device peak {summary_mod.human_bytes(peak)} on {ranks} exceeds the "
            f"{summary_mod.human_bytes(peak // 4)} per device")
    assert lines[-1].startswith(want), lines[-1]
    assert any(l.startswith(want) for l in lines[:8]), lines[:8]
    assert f"by {summary_mod.human_bytes(peak - peak // 4)}" in lines[-1]
    # An H100's memory: it fits.
    big = simulated_copy(reports, tmp_path, "big.h5", memory_capacity=np.int64(79993765888), fits=np.int64(1))
    lines = tool(str(big)).stdout.splitlines()
    want = f"fits: device peak {summary_mod.human_bytes(peak)} on {ranks}, within the 74.5 GiB per device"
    assert lines[-1].startswith(want) and any(l.startswith(want) for l in lines[:8]), (lines[:8], lines[-1])
    # A report without the attributes (a measured run, an older simulation) says neither.
    old = simulated_copy(reports, tmp_path, "old.h5", memory_capacity=None, fits=None)
    out = tool(str(old)).stdout
    assert "FIT" not in out and "fits:" not in out


def drawn(monkeypatch, draw, rep, path):
    """The figure `draw` makes, kept open to look at."""
    figs = []
    monkeypatch.setattr(plots_mod.plt, "close", lambda fig=None: figs.append(fig))
    draw(rep, str(path))
    return next(f for f in figs if hasattr(f, "axes"))


@pytest.mark.parametrize("times", [0.25, 0.01, 40.0])
def test_the_memory_picture_draws_the_device_capacity_with_the_peak_in_view(reports, tmp_path, monkeypatch, times):
    peak, _ = device_peak(reports / "sim4096.h5")
    capacity = int(peak * times)
    path = simulated_copy(reports, tmp_path, "c.h5", memory_capacity=np.int64(capacity),
                          fits=np.int64(int(capacity >= peak)))
    fig = drawn(monkeypatch, plots_mod.memory, Report(str(path)), tmp_path / "memory.png")
    ax = fig.axes[0]
    div, unit = summary_mod.byte_unit(max(peak, capacity))
    line = next(l for l in ax.get_lines() if l.get_label().startswith("device capacity"))
    assert np.allclose(line.get_ydata(), capacity / div) and ax.get_ylabel().startswith(unit)
    lo, hi = ax.get_ylim()
    assert lo <= capacity / div <= hi and lo <= peak / div <= hi, (lo, hi, capacity / div, peak / div)
    # Far apart, the axis is logarithmic, so that the lower is no sliver.
    assert (ax.get_yscale() == "log") == (max(times, 1 / times) > plots_mod.LOG_RATIO)
    assert ("DOES NOT FIT" in ax.get_title()) == (capacity < peak)
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pictures_write_bytes_in_their_unit_to_three_figures(reports, tmp_path, monkeypatch):
    h = summary_mod.human_bytes
    assert [h(0), h(16), h(999), h(1000), h(1536), h(10 * 2**20), h(129536 * 2**20), h(80e9), h(3 * 2**40)] == \
        ["0 B", "16 B", "999 B", "0.977 KiB", "1.50 KiB", "10.0 MiB", "126 GiB", "74.5 GiB", "3.00 TiB"]
    fig = drawn(monkeypatch, plots_mod.communication, Report(str(reports / "sim4096.h5")), tmp_path / "comm.png")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.texts] + [t.get_text() for t in ax.get_yticklabels()]
    sizes = [m.group(1) for t in labels for m in re.finditer(r"([\d.]+ (?:B|KiB|MiB|GiB|TiB))\b", t)]
    assert sizes and not any(s.startswith("0.00 ") for s in sizes), labels
    # Three significant figures: no value of four digits or more before its unit.
    assert all(len(s.split()[0].replace(".", "").lstrip("0")) <= 3 for s in sizes), sizes

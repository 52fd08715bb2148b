"""docs/report-schema.md against the files, both ways.

The binary writes a run (a 2-rank ZB-H1 pipeline), a MoE run, a run with
host offload, an estimate, a simulation, a sweep index and a plan. Every
attribute, table, column and /summary scalar in them must be documented, with
the unit (or type) the document gives; and every name the document gives
must be in one of them, but for those written only in cases this test does
not make (NOT_MADE, each with its case).

Run by CTest (python.report_schema) as
  /usr/bin/python3 -m pytest tests/python/test_report_schema.py
with STRATA_BIN naming the strata binary.
"""
import os
import re
import subprocess

import h5py
import numpy as np
import pytest
from tiny_deck import DECK

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "report-schema.md")


# Documented names the files of this test lack, and the case that writes them.
NOT_MADE = {
    ("report", "/", "slurm_array_job_id"): "a job-array task",
    ("report", "/", "slurm_array_task_id"): "a job-array task",
    ("report", "/", "device_arena_bytes"): "a CUDA run",
    ("report", "/", "device_memory_total"): "a CUDA run",
    ("report", "/", "device_memory_used"): "a CUDA run",
    ("report", "/", "resumed_from"): "a resumed run",
    ("report", "/", "resumed_at_step"): "a resumed run",
    ("report", "/", "warnings"): "more threads than cores",
    ("report", "/", "error"): "a failed run",
    ("report", "/", "failed_rank"): "a rank failing alone",
    ("report", "/", "rows_of_ranks"): "a rank failing alone",
    ("report", "/", "rows_from_step"): "a rank failing alone after earlier windows",
    ("report", "/", "streamed_report"): "a rank failing alone after earlier windows",
    ("report", "/", "streamed_until_step"): "a rank failing alone after earlier windows",
    ("report", "/", "diverged_at_step"): "a diverged run",
    ("report", "/", "interrupted_by"): "an interrupted run",
    ("plan", "/", "interrupted_by"): "an interrupted plan",
}


def documented():
    """{(part, section, name): unit or type} from the document's tables of
    columns, attributes and datasets; part is report, index or plan, section
    "/" for root attributes. Names with <...> are patterns."""
    out = {}
    part, section = "report", None
    lines = open(DOC).read().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## The sweep index"):
            part = "index"
        elif line.startswith("## Plans"):
            part = "plan"
        m = re.match(r"^### (?:`(/[^`]*)`|Root attributes)", line)
        if m:
            section = m.group(1) or "/"
            continue
        if not (line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---")):
            continue
        head = [c.strip() for c in line.strip("|").split("|")]
        if section is None or head[0] not in ("column", "attribute", "dataset"):
            continue  # a table of figures, not of names
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip("|").split("|")]
            names = re.findall(r"`([^`]+)`", cells[0])
            kinds = [k.strip() for k in cells[1].split(",")]
            for k, n in enumerate(names):
                out[(part, section, n)] = kinds[k] if len(kinds) == len(names) else cells[1]
    return out


def kind_of(v):
    if isinstance(v, (str, bytes)):
        return "string"
    if isinstance(v, (int, np.integer)):
        return "int"
    return "real"


def text(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def written(path):
    """{(part, section, name): unit or type} of a file: its root attributes
    (their types), its tables' columns (their units) and /summary's scalars
    (their units; "(string)" for text)."""
    out = {}
    with h5py.File(path, "r") as f:
        part = {"strata-sweep": "index", "strata-plan": "plan"}.get(text(f.attrs["schema"]), "report")
        for k in f.attrs:
            out[(part, "/", k)] = kind_of(f.attrs[k])

        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            if obj.dtype.names:
                for c in obj.dtype.names:
                    out[(part, "/" + name, c)] = text(obj.attrs.get(f"unit:{c}", ""))
            elif name.startswith("summary/"):
                unit = obj.attrs.get("unit")
                out[(part, "/summary", name[len("summary/"):])] = "(string)" if unit is None else text(unit)
            else:
                out[(part, "/" + name, "")] = "a dataset outside the tables and /summary"

        f.visititems(visit)
    return out


def lookup(doc, key):
    """The documented entry for a written key: by name, or by a pattern."""
    if key in doc:
        return key
    part, section, name = key
    if (part, section) == ("plan", "/points") and ("index", "/points", name) in doc:
        return ("index", "/points", name)  # a plan's /points has the index's columns
    for p, s, n in doc:
        if (p, s) == (part, section) and "<" in n and re.fullmatch(re.sub(r"<[^>]+>", r"\\w+", n), name):
            return (p, s, n)
    return None


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("schema")
    (tmp / "deck.toml").write_text(DECK)
    strata = os.environ["STRATA_BIN"]
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def run(*args, ranks=1, expect=0):
        cmd = (["mpiexec", "-n", str(ranks)] if ranks > 1 else []) + [strata, *args]
        r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        assert r.returncode == expect, r.stdout + r.stderr

    run("run", "deck.toml", "--set", "parallel.pp=2", "--set", 'parallel.schedule="zb-h1"', "--output", "pp.h5",
        ranks=2)
    run("run", "deck.toml", "--set", 'model.kind="moe"', "--set", "model.moe_experts=2", "--set", "parallel.dp=2",
        "--set", "parallel.ep=2", "--output", "moe.h5", ranks=2)
    run("run", "deck.toml", "--set", 'parallel.offload="host"', "--set", "parallel.dp=2", "--set", "parallel.zero=2",
        "--output", "offload.h5", ranks=2)
    run("run", "deck.toml", "--set", "parallel.dp=2", "--dry-run", "--output", "estimate.h5")
    run("simulate", "deck.toml", "--machine", "a100-80gb", "--set", "parallel.pp=2", "--output", "sim.h5")
    run("plan", "deck.toml", "--machine", "a100-80gb", "--world", "2", "--output", "plan.h5")
    (tmp / "sweep.toml").write_text(DECK + '[sweep]\nname = "s"\n"parallel.zero" = [0, 1]\n')
    run("sweep", "sweep.toml", "--results", "sweeps", "--set", "parallel.dp=1")
    return [tmp / n for n in ("pp.h5", "moe.h5", "offload.h5", "estimate.h5", "sim.h5", "plan.h5")] + \
        [tmp / "sweeps" / "s" / "index.h5"]


def test_every_written_name_is_documented_with_its_unit(files):
    doc = documented()
    problems = []
    for path in files:
        for key, unit in written(path).items():
            entry = lookup(doc, key)
            where = f"{path.name}: {key[1]} {key[2]}".rstrip()
            if entry is None:
                problems.append(f"{where} is not in docs/report-schema.md")
            elif doc[entry] != unit:
                problems.append(f"{where}: the file says {unit!r}, the document {doc[entry]!r}")
    assert not problems, "\n".join(sorted(set(problems)))


def test_every_documented_name_is_written(files):
    made = {}
    for path in files:
        made.update(written(path))
    doc = documented()
    found = {lookup(doc, key) for key in made}
    missing = [k for k in doc if k not in found and k not in NOT_MADE]
    assert not missing, "documented but written by none of the files: " + ", ".join(
        f"{p} {s} {n}" for p, s, n in missing)
    # And the exceptions are still documented: a stale one fails here.
    assert all(k in doc for k in NOT_MADE), [k for k in NOT_MADE if k not in doc]


def test_the_parser_sees_every_section(files):
    # So that a heading or table the parser skips cannot pass silently.
    sections = {(p, s) for p, s, _ in documented()}
    for want in ("/", "/rank_classes", "/ranks", "/steps", "/memory", "/compute", "/experts", "/timeline", "/comm",
                 "/summary/comm", "/summary/pipeline", "/summary/host_memory", "/summary"):
        assert ("report", want) in sections, want
    assert {("index", "/"), ("index", "/points"), ("plan", "/"), ("plan", "/points")} <= sections

#!/usr/bin/python3
"""A structural fuzzer for the report reader (strata_report: the
strata-report command and its Report and Index classes).

It makes real reports (a run, a failed run, a simulation and a plan's
index) with STRATA, replays every file under tests/fuzz/regressions/report/,
then mutates copies for a bounded time the ways a damaged or foreign file
differs from a report: objects and attributes deleted, attributes of other
types and values, tables replaced by arrays, groups or tables of other
columns, columns of another type, cells set to NaN, infinities, negative
and huge numbers, scalars made arrays or strings, and bytes of the file
flipped or cut off (those read in a child process, in case HDF5 itself
fails on them).

The property: strata-report (summary, trace, plots on some, compare against
the original) exits 0 or 2, with its error on one line; never a traceback.
A mutant that breaks it is kept in WORK_DIR/finding-N.h5 with the
traceback, to be added to the regressions.

Between mutants it draws output paths that collide with the input
(collisions): for each writing option (--trace, --plots, --trace-per-rank)
the input's own path, a hard link to it, a symbolic link to it or its path
with ./ before it, given as the option's path or, for a directory option,
placed as a file the option writes in its directory; and two options
writing one file. Each must exit 2 with its one-line error, the input
byte for byte as it was and nothing written.

usage: fuzz_report.py STRATA SOURCE_DIR WORK_DIR SECONDS [SEED]
"""
import contextlib
import io
import os
import random
import resource
import shutil
import subprocess
import sys
import time
import traceback

import h5py
import numpy as np

strata, src, work, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
# Paths given relative to where it was started (build/strata .) still name
# the same files once it works in WORK_DIR; a bare command name stays one.
strata = os.path.abspath(strata) if os.sep in strata else strata
src = os.path.abspath(src)
sys.path.insert(0, os.path.join(src, "tests", "python"))
from snapshot import snapshot  # noqa: E402  (what a refusal must leave)
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 1
sys.path.insert(0, os.path.join(src, "analysis"))
from strata_report import cli, read  # noqa: E402

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chdir(work)
rng = random.Random(seed)

DECK = """[run]
name = "fz"
steps = 3
warmup_steps = 1
log_every = 0
[model]
layers = 2
d_model = 16
heads = 2
vocab = 256
seq_len = 16
[data]
global_batch = 4
micro_batch = 2
[backend]
threads = 1
peak_tflops = 0.05
"""


def make_seeds():
    with open("fz.toml", "w") as f:
        f.write(DECK)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(["mpiexec", "-n", "2", strata, "run", "fz.toml", "--set", "parallel.pp=2", "--output",
                    "run.h5"], check=True, env=env, **quiet)
    subprocess.run([strata, "run", "fz.toml", "--set", 'backend.memory_limit="64KiB"', "--output", "failed.h5"],
                   env=env, **quiet)
    subprocess.run([strata, "simulate", "fz.toml", "--machine", "a100-80gb", "--set", "parallel.dp=2",
                    "--set", "parallel.tp=2", "--output", "sim.h5"], check=True, env=env, **quiet)
    subprocess.run([strata, "plan", "fz.toml", "--machine", "a100-80gb", "--world", "4", "--output", "plan.h5"],
                   check=True, env=env, **quiet)
    seeds = ["run.h5", "failed.h5", "sim.h5", "plan.h5"]
    for s in seeds:
        if not os.path.isfile(s):
            sys.exit(f"fuzz_report: could not make the seed {s}")
    return seeds


# ---- mutations, each on an open h5py.File ----

def objects(f):
    out = []
    f.visit(out.append)
    return out


def datasets(f):
    return [n for n in objects(f) if isinstance(f[n], h5py.Dataset)]


def tables(f):
    return [n for n in datasets(f) if f[n].dtype.names is not None]


ODD_VALUES = [0, -1, 1, 2 ** 31, 2 ** 63 - 1, 1e300, -1e300, float("nan"), float("inf"), "", "garbage",
              "strata-report", b"\xff\xfe", np.array([1, 2, 3]), np.array([], dtype=float), True, 0.5]
ODD_NUMBERS = [float("nan"), float("inf"), -float("inf"), -1, 1e300, -1e300, 2 ** 62, 0]


def delete_object(f):
    names = objects(f)
    if names:
        n = rng.choice(names)
        if n in f:
            del f[n]


def delete_attr(f):
    keys = list(f.attrs.keys())
    if keys:
        del f.attrs[rng.choice(keys)]


def odd_attr(f):
    keys = list(f.attrs.keys()) + ["world_size", "schema_version", "status", "simulated"]
    f.attrs[rng.choice(keys)] = rng.choice(ODD_VALUES)


def replace_dataset(f):
    names = datasets(f)
    if not names:
        return
    n = rng.choice(names)
    d = f[n][...]
    del f[n]
    kind = rng.randrange(6)
    if kind == 0:
        f[n] = np.arange(3)
    elif kind == 1:
        f[n] = np.zeros((2, 2))
    elif kind == 2:
        f.create_group(n)
    elif kind == 3:
        f[n] = "a string"
    elif kind == 4 and d.dtype.names:
        # One column gone.
        keep = [c for c in d.dtype.names if c != rng.choice(d.dtype.names)]
        f[n] = d[keep] if keep else np.zeros(0)
    elif d.dtype.names:
        # One column of another type: strings for numbers, numbers for strings.
        c = rng.choice(d.dtype.names)
        fields = [(x, ("S8" if d.dtype[x].kind != "S" else "<f8") if x == c else d.dtype[x]) for x in d.dtype.names]
        out = np.zeros(len(d), dtype=fields)
        for x in d.dtype.names:
            if x != c:
                out[x] = d[x]
        f[n] = out
    else:
        f[n] = np.array([1.0, 2.0])


def odd_cells(f):
    names = [n for n in tables(f) if len(f[n]) > 0]
    if not names:
        return
    n = rng.choice(names)
    d = f[n][...]
    c = rng.choice(d.dtype.names)
    rows = rng.sample(range(len(d)), k=min(len(d), rng.randint(1, 3)))
    for r in rows:
        if d.dtype[c].kind == "f":
            d[c][r] = rng.choice(ODD_NUMBERS)
        elif d.dtype[c].kind in "iu":
            d[c][r] = rng.choice([-1, 2 ** 31, -(2 ** 62), 10 ** 9, 0])
        else:
            d[c][r] = rng.choice([b"", b"\xff", b"zzz", b"forward"])
    del f[n]
    f[n] = d


def odd_rows(f):
    # A table cut to nothing, or its rows repeated.
    names = tables(f)
    if not names:
        return
    n = rng.choice(names)
    d = f[n][...]
    del f[n]
    f[n] = d[:0] if rng.random() < 0.5 else np.concatenate([d, d])


def odd_scalar(f):
    names = [n for n in datasets(f) if f[n].shape == ()]
    if not names:
        return
    n = rng.choice(names)
    del f[n]
    f[n] = rng.choice([np.array([1.0, 2.0]), "text", float("nan"), np.zeros(0), np.array([(1, 2.0)],
                                                                                      dtype=[("a", "i8"), ("b", "f8")])])


STRUCTURAL = [delete_object, delete_attr, odd_attr, replace_dataset, odd_cells, odd_rows, odd_scalar]


def damage_bytes(path):
    data = bytearray(open(path, "rb").read())
    if rng.random() < 0.3:
        data = data[:rng.randrange(len(data))]
    else:
        for _ in range(rng.randint(1, 16)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    open(path, "wb").write(bytes(data))


# ---- the property ----

def run_tool(argv):
    """strata-report in this process: its exit status and what it wrote. The
    mutants are whole HDF5 files, so the reader need not shield itself from
    HDF5 in a child process (the damaged ones are read by the tool itself,
    check_in_child)."""
    read.ISOLATE = False
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
    return rc, err.getvalue()


def check(path, original, plots):
    calls = [[path], [path, "--trace", "trace.json"]]
    if plots:
        calls.append([path, "--plots", "plots"])
    if original.endswith((".h5",)) and "plan" not in original:
        calls.append(["compare", original, path])
    for argv in calls:
        rc, err = run_tool(argv)
        if rc not in (0, 2):
            raise AssertionError(f"strata-report {' '.join(argv)} exited {rc}: {err}")
        if rc == 2 and not err.startswith("strata-report: error: "):
            raise AssertionError(f"strata-report {' '.join(argv)} exited 2 without its one-line error: {err}")


# ---- output paths that collide with an input ----

WRITERS = [("--trace", False), ("--plots", True), ("--trace-per-rank", True)]
FORMS = ["the same path", "a hard link", "a symbolic link", "./ before the path"]
# The files --plots writes into its directory (docs/analysis.md): a report's
# pictures, or an index's.
PICTURES = ["timeline.png", "memory.png", "comm.png", "experts.png", "sweep.png"]


def written_name(option):
    """A file the directory option writes: a picture, or a rank's trace."""
    return rng.choice(PICTURES) if option == "--plots" else f"rank-{rng.randrange(4)}.json"


def collision(seed, option, form, inside):
    """Sets up collide/ for one case: the input (a copy of `seed`) and the
    output path of `option` naming it in `form`, as the option's own path
    or (inside) as a file the directory option writes. Returns (argv, the
    input)."""
    shutil.rmtree("collide", ignore_errors=True)
    os.makedirs("collide/out")
    inp = "collide/in.h5"
    if inside:
        # The option names the directory; the input is, or is linked from, a
        # file it would write there.
        placed = os.path.join("collide/out", written_name(option))
        if form in ("the same path", "./ before the path"):
            inp = placed
        shutil.copy(seed, inp)
        if form == "a hard link":
            os.link(inp, placed)
        elif form == "a symbolic link":
            os.symlink(os.path.abspath(inp), placed)
        out = "./collide/out" if form == "./ before the path" else "collide/out"
        return [inp, option, out], inp
    shutil.copy(seed, inp)
    if form == "a hard link":
        out = "collide/hard.h5"
        os.link(inp, out)
    elif form == "a symbolic link":
        out = "collide/sym.h5"
        os.symlink("in.h5", out)
    elif form == "./ before the path":
        out = "./" + inp
    else:
        out = inp
    return [inp, option, out], inp


def two_outputs(seed):
    """Sets up collide/ for two options that would write one file: --trace
    at a file --plots or --trace-per-rank writes, or at the path --plots
    takes as its directory. Returns (argv, the input)."""
    shutil.rmtree("collide", ignore_errors=True)
    os.makedirs("collide")
    inp = "collide/in.h5"
    shutil.copy(seed, inp)
    option = rng.choice(["--plots", "--trace-per-rank"])
    d = rng.choice(["collide/out", "./collide/out", "collide/../collide/out"])
    if rng.random() < 0.3 and option == "--plots":
        return [inp, "--trace", d, option, d], inp
    return [inp, "--trace", os.path.join(d, written_name(option)), option, d], inp


# The cases collisions() goes through before it draws: each option in each
# form, as its path and (a directory option) inside its directory, and two
# outputs on one path.
EVERY_CASE = sum(2 if is_dir else 1 for _, is_dir in WRITERS) * len(FORMS) + 1


def collisions(seeds):
    """Collision cases, each (argv, the input, its seed) with its files
    made: the EVERY_CASE ones, then drawn at random, two outputs on one path
    among them."""
    def case(make, *args):
        seed = rng.choice(seeds)
        return (*make(seed, *args), seed)

    for option, is_dir in WRITERS:
        for form in FORMS:
            for inside in ([False, True] if is_dir else [False]):
                yield case(collision, option, form, inside)
    yield case(two_outputs)
    while True:
        if rng.random() < 0.2:
            yield case(two_outputs)
            continue
        option, is_dir = rng.choice(WRITERS)
        yield case(collision, option, rng.choice(FORMS), is_dir and rng.random() < 0.5)


def check_collision(argv, inp, seed_bytes):
    before = snapshot("collide")
    rc, err = run_tool(argv)
    where = f"strata-report {' '.join(argv)}"
    if rc != 2:
        raise AssertionError(f"{where} exited {rc}, not 2, on an output that collides with an input: {err}")
    if not err.startswith("strata-report: error: ") or err.count("\n") != 1:
        raise AssertionError(f"{where} exited 2 without its one-line error: {err}")
    if snapshot("collide") != before or open(inp, "rb").read() != seed_bytes:
        raise AssertionError(f"{where} refused, but changed its input or wrote a file")


def check_in_child(path, original):
    """For a file with damaged bytes: the tool in a child process, so that a
    failure inside HDF5 is seen as what it is."""
    tool = os.path.join(src, "analysis", "strata-report")
    r = subprocess.run(["/usr/bin/python3", tool, path], capture_output=True, text=True, timeout=60)
    if r.returncode not in (0, 2) or "Traceback" in r.stderr:
        raise AssertionError(f"strata-report {path} exited {r.returncode}: {r.stderr[-2000:]}")


def main():
    seeds = make_seeds()
    # From here a reader that allocates without bound meets a MemoryError (a
    # finding), not the machine's OOM killer. Not before: the seeds' runs may
    # be sanitized builds, whose shadow memory is terabytes of address space.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    findings = 0

    def found(path, what):
        nonlocal findings
        findings += 1
        keep = f"finding-{findings}.h5"
        shutil.copy(path, keep)
        print(f"FINDING {keep}: {what}")

    regress = os.path.join(src, "tests", "fuzz", "regressions", "report")
    replayed = 0
    for name in sorted(os.listdir(regress)) if os.path.isdir(regress) else []:
        path = os.path.join(regress, name)
        try:
            check_in_child(path, path)
        except AssertionError as e:
            found(path, str(e))
        replayed += 1
    for s in seeds:
        try:
            check(s, s, plots=True)  # the seeds themselves read
        except AssertionError as e:
            found(s, str(e))

    start = time.monotonic()
    execs = 0
    cases = collisions(seeds)
    collided = 0
    seed_bytes = {s: open(s, "rb").read() for s in seeds}
    while time.monotonic() - start < seconds and findings < 5:
        if collided < EVERY_CASE or rng.random() < 0.2:
            argv, inp, seed = next(cases)
            try:
                check_collision(argv, inp, seed_bytes[seed])
            except AssertionError as e:
                found(inp, str(e))
            except Exception:  # the tool raised: a traceback
                found(inp, traceback.format_exc())
            collided += 1
            continue
        original = rng.choice(seeds)
        path = "mutant.h5"
        shutil.copy(original, path)
        byte_level = rng.random() < 0.1
        try:
            if byte_level:
                damage_bytes(path)
            else:
                with h5py.File(path, "a") as f:
                    for _ in range(rng.randint(1, 3)):
                        rng.choice(STRUCTURAL)(f)
        except Exception:  # a mutation h5py refuses: not the reader's concern
            continue
        try:
            if byte_level:
                check_in_child(path, original)
            else:
                check(path, original, plots=execs % 25 == 0)
        except AssertionError as e:
            found(path, str(e))
        except Exception:  # the tool raised: a traceback
            found(path, traceback.format_exc())
        execs += 1
    elapsed = time.monotonic() - start
    print(f"fuzz_report: {replayed} regression(s) replayed, {execs} mutant(s) and {collided} colliding output "
          f"path(s) in {elapsed:.1f} s ({execs / max(elapsed, 1e-9):.1f} mutants/s), {findings} finding(s)")
    return 1 if findings else 0


sys.exit(main())

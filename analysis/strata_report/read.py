"""Opening a report: the schema check and typed access to its tables.

The stable API (strata_report.Report):
  Report(path).table(name)  the table as a pandas DataFrame, strings as str,
                            the columns' units in df.attrs["units"]
  Report(path).array(name)  the same table as a numpy structured array
  Report(path).summary      {name: float or str} of /summary's scalars
  Report(path).config       the resolved configuration, as nested dicts
  Report(path).attrs        the root attributes (provenance), strings as str
  Report(path).row_ranks    the ranks whose rows the tables hold
  Report(path).members(r)   how many ranks the rows of rank r stand for
  Report(path).weights(c)   the same, for each rank of a rank column c
  Report(path).rank_label(r)  "rank 3", or "ranks 0-511" for a class

An estimate's or a simulation's report holds one row per class of identical
ranks (/rank_classes), under the class's first rank: a mean over ranks
weighs each row by its class's size (weights), a count of ranks sums them.
"""
import os
import pickle
import tomllib
import traceback

import h5py
import numpy as np

SCHEMA = "strata-report"
VERSION = 1
TABLES = ("ranks", "steps", "memory", "timeline", "comm", "experts", "summary/comm", "summary/pipeline",
          "rank_classes")
# The columns the tools read, by kind: "n" a number, "s" a string; "?" after
# the kind: absent from older reports. Any other column must be a number or
# a string too.
COLUMNS = {
    "ranks": {"rank": "n", "host": "s"},
    "steps": {"rank": "n", "step": "n", "warmup": "n", "loss": "n", "step_time": "n", "tokens_per_s": "n",
              "moe_aux_loss": "n?", "load_imbalance": "n?", "drop_rate": "n?", "nvme_bytes_read": "n?",
              "nvme_io_time": "n?", "nvme_wait_time": "n?"},
    "memory": {"rank": "n", "step": "n", "category": "s", "pool": "s?", "current_bytes": "n", "peak_bytes": "n"},
    "timeline": {"rank": "n", "step": "n", "micro_batch": "n", "chunk": "n", "layer": "n", "phase": "s",
                 "start": "n", "end": "n"},
    "comm": {"rank": "n", "step": "n", "op": "s", "axis": "s", "group_size": "n", "bytes": "n", "nonblocking": "n",
             "start": "n", "end": "n", "wait": "n", "transfer_start": "n?", "transfer_end": "n?", "peer": "n?",
             "tag": "n?"},
    "experts": {"rank": "n", "step": "n", "layer": "n", "expert": "n", "tokens_routed": "n", "tokens_dropped": "n"},
    "summary/comm": {"rank": "n", "axis": "s", "op": "s", "group_size": "n", "size_class": "n?", "count": "n",
                     "bytes": "n", "time": "n", "wait": "n", "peer_wait": "n", "hidden_fraction": "n", "busbw": "n"},
    "summary/pipeline": {"rank": "n", "stages": "n", "schedule": "s", "bubble": "n", "theory": "n"},
    "rank_classes": {"rank": "n", "first": "n", "last": "n"},
}
# The /summary scalars that are strings; every other one is a number.
SUMMARY_TEXT = ("layout", "peak_source", "precision", "strategy")
# Root attributes the tools read as whole numbers, and as (finite) numbers.
WHOLE_ATTRS = ("world_size", "schema_version", "simulated", "git_dirty", "threads", "diverged_at_step",
               "failed_rank", "resumed_at_step", "rows_from_step", "memory_capacity", "fits")
NUMBER_ATTRS = ("peak_flops", "duration")
# The most ranks a layout may have (strategies::kMaxWorld).
MAX_WORLD = 1 << 20


class ReportError(Exception):
    """A file that is not a report this tool can read; the message says why."""


def text(x):
    return x.decode(errors="replace") if isinstance(x, bytes) else str(x)


def texts(column):
    """A string column as an array of str (empty: still of str, so that a
    comparison with a string stays elementwise)."""
    return np.array([text(x) for x in column], dtype=str)


def checked_table(path, name, obj, columns):
    """The table `name` read from `obj` as a numpy structured array, after
    checking what the tools rely on: a 1-D dataset of a compound type whose
    columns are numbers or strings, with `columns` ({name: kind}, as COLUMNS)
    present and of their kind. A ReportError names what is wrong."""
    if not isinstance(obj, h5py.Dataset):
        raise ReportError(f"{path}: /{name} is not a table (a dataset), it is a {type(obj).__name__}")
    names = obj.dtype.names
    if names is None or len(obj.shape) != 1:
        raise ReportError(f"{path}: /{name} is not a table: a 1-D compound dataset was expected, it has shape "
                          f"{obj.shape} and type {obj.dtype}")
    for c in names:
        kind = obj.dtype[c].kind
        if kind not in "iufbS" or obj.dtype[c].shape != ():
            raise ReportError(f"{path}: /{name} column {c} is of type {obj.dtype[c]}: numbers and fixed-length "
                              f"strings only")
    for c, want in columns.items():
        if c not in names:
            if want.endswith("?"):
                continue
            raise ReportError(f"{path}: /{name} has no column {c} (its columns: {', '.join(names)})")
        is_text = obj.dtype[c].kind == "S"
        if is_text != want.startswith("s"):
            raise ReportError(f"{path}: /{name} column {c} is {'a string' if is_text else 'a number'}; "
                              f"{'a string' if want.startswith('s') else 'a number'} was expected")
    # Rows are stored whole (no compression), so a table cannot hold more
    # bytes than the file: a header that says so is damaged.
    claimed, size = obj.shape[0] * obj.dtype.itemsize, os.path.getsize(path)
    if claimed > size:
        raise ReportError(f"{path}: /{name} claims {obj.shape[0]} rows ({claimed} B), more than the whole file "
                          f"({size} B): the file is damaged")
    try:
        return obj[...]
    except (OSError, ValueError, TypeError) as e:
        raise ReportError(f"{path}: /{name} cannot be read: {e}") from None


def units_of(obj):
    """{column: unit} from a table's "unit:<column>" attributes ("" where
    it has none; "1" is a count or a ratio)."""
    return {c: text(obj.attrs.get(f"unit:{c}", "")) for c in obj.dtype.names or ()}


def read_attrs(path, f):
    """The root attributes, strings as str; those the tools take as numbers
    checked to be (whole) numbers."""
    attrs = {}
    for k in f.attrs.keys():
        try:
            v = f.attrs[k]
        except (OSError, TypeError, ValueError) as e:
            raise ReportError(f"{path}: root attribute {k} cannot be read: {e}") from None
        attrs[k] = text(v) if isinstance(v, (bytes, str)) else v
    for k in WHOLE_ATTRS + NUMBER_ATTRS:
        if k in attrs:
            v = attrs[k]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
                raise ReportError(f"{path}: root attribute {k} is {v!r}: a finite number was expected")
            if k in WHOLE_ATTRS and v != int(v):
                raise ReportError(f"{path}: root attribute {k} is {v!r}: a whole number was expected")
            if k == "world_size" and not 1 <= v <= MAX_WORLD:
                raise ReportError(f"{path}: root attribute world_size is {v!r}: Strata runs 1 to {MAX_WORLD} ranks")
    for k in ("schema", "status", "resolved_config"):
        if k in attrs and not isinstance(attrs[k], str):
            raise ReportError(f"{path}: root attribute {k} is {attrs[k]!r}: a string was expected")
    return attrs


def read_file(path, body):
    """body(the open file) for the HDF5 file at `path`, HDF5's failures
    raised as a ReportError: a file damaged past its header fails in HDF5
    as it is read."""
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ReportError(f"{path}: cannot open as HDF5: {e}") from None
    with f:
        try:
            return body(f)
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
            raise ReportError(f"{path}: cannot be read as HDF5: {e}") from None


def _read_report(path):
    """(root attributes, tables, /summary scalars) of the report at `path`,
    each checked."""
    return read_file(path, lambda f: read_open_report(path, f))


def read_open_report(path, f):
    attrs = read_attrs(path, f)
    schema, version = attrs.get("schema", ""), attrs.get("schema_version", 0)
    if schema != SCHEMA or version != VERSION:
        raise ReportError(f"{path}: schema is '{schema}' v{version}; this tool reads '{SCHEMA}' "
                          f"v{VERSION} (a Strata run report)")
    tables = {}
    summary = {}
    units = {}
    for name in TABLES:
        tables[name] = checked_table(path, name, f[name], COLUMNS[name]) if name in f else None
        if name in f:
            units[name] = units_of(f[name])
    if "summary" in f:
        if not isinstance(f["summary"], h5py.Group):
            raise ReportError(f"{path}: /summary is not a group")
        for k, d in f["summary"].items():
            if isinstance(d, h5py.Dataset) and d.shape == ():
                v = d[()]
                want_text = k in SUMMARY_TEXT
                if want_text and isinstance(v, (bytes, str)):
                    summary[k] = text(v)
                elif not want_text and isinstance(v, (int, float, np.integer, np.floating)):
                    summary[k] = float(v)
                else:
                    raise ReportError(f"{path}: /summary/{k} is of type {d.dtype}: "
                                      f"{'a string' if want_text else 'a number'} was expected")
    check_classes(path, tables["rank_classes"], int(attrs.get("world_size", 1)))
    return attrs, tables, summary, units


def check_classes(path, t, world):
    """That /rank_classes (when the report has it) puts every rank of the
    world in one class, its rows under the class's first rank."""
    if t is None:
        return
    if len(t) == 0:
        raise ReportError(f"{path}: /rank_classes is empty: every rank belongs to a class")
    rank, first, last = (np.asarray(t[c], dtype=np.float64) for c in ("rank", "first", "last"))
    if not (np.all(first >= 0) and np.all(last < world) and np.all(first <= last)):
        raise ReportError(f"{path}: /rank_classes has a row outside ranks 0-{world - 1} or with first > last")
    if not all(np.all(x == np.floor(x)) for x in (rank, first, last)):
        raise ReportError(f"{path}: /rank_classes holds a rank that is not a whole number")
    order = np.argsort(first, kind="stable")
    if np.any(first[order][1:] <= last[order][:-1]) or (last - first + 1).sum() != world:
        raise ReportError(f"{path}: /rank_classes does not put each of the {world} ranks in one class")
    lowest = {}
    for r, f_ in zip(rank, first):
        lowest[r] = min(lowest.get(r, f_), f_)
    if any(r != f_ for r, f_ in lowest.items()):
        raise ReportError(f"{path}: /rank_classes names a class by a rank other than its first")


def merge_ranges(ranges):
    """[(first, last)] sorted, with touching ranges joined."""
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def ranges_label(ranges, width):
    """"rank 3", "ranks 0-511", or "ranks 0-3,8,... (12)": the ranges cut to
    the whole ones that fit in `width` characters (at least the first), and
    how many ranks where there is more than one range."""
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in ranges]
    shown = parts[:1]
    for x in parts[1:]:
        if len(",".join(shown + [x])) > width:
            break
        shown.append(x)
    n = sum(b - a + 1 for a, b in ranges)
    return (f"{'rank' if n == 1 else 'ranks'} " + ",".join(shown) + (",..." if len(shown) < len(parts) else "")
            + (f" ({n})" if len(parts) > 1 else ""))


# Whether read_isolated reads in a child process: always, but for a caller
# that knows its files are whole HDF5 (the report fuzzer's structural
# mutants, which it reads by the thousand).
ISOLATE = True


def read_isolated(path, read):
    """read(path), run in a child process. HDF5 crashes on some damaged files
    (a corrupted global heap fails inside H5HG_read), which the tool must
    report, not die of. The child sends back what read returned, the
    ReportError it raised, or any other error's traceback (a bug, raised
    here as one)."""
    if not ISOLATE:
        return read(path)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            try:
                payload = ("ok", read(path))
            except ReportError as e:
                payload = ("error", str(e))
            except Exception:  # noqa: BLE001 - carried to the parent whole
                payload = ("bug", traceback.format_exc())
            with os.fdopen(w, "wb") as out:
                out.write(pickle.dumps(payload))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) or not data:
        why = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "no answer"
        raise ReportError(f"{path}: HDF5 failed while reading the file ({why}): the file is damaged")
    kind, value = pickle.loads(data)
    if kind == "error":
        raise ReportError(value)
    if kind == "bug":
        raise RuntimeError(f"reading {path} failed:\n{value}")
    return value


def data_frame(t, units, more=None):
    """A structured array as a pandas DataFrame, strings as str, the units
    ({column: unit}) in df.attrs["units"]; `more`: further columns
    ({name: (values, unit)}). Empty (no columns) for None."""
    import pandas as pd  # only where a DataFrame is asked for

    if t is None:
        return pd.DataFrame()
    cols = {}
    for c in t.dtype.names:
        cols[c] = [text(x) for x in t[c]] if t.dtype[c].kind in "SOU" else t[c]
    units = {c: units.get(c, "") for c in t.dtype.names}
    for c, (values, unit) in (more or {}).items():
        cols[c] = values
        units[c] = unit
    df = pd.DataFrame(cols)
    df.attrs["units"] = units
    return df


class Report:
    """A report's tables, its /summary scalars, its configuration and its
    root attributes, read once when opened."""

    def __init__(self, path, read=None):
        """`read`: what _read_report returned for the file, when the caller
        has read it already."""
        self.path = str(path)
        self.attrs, self.tables, self.summary, self.units = (read if read is not None
                                                             else read_isolated(self.path, _read_report))
        self._measured = None  # measured_steps(), once asked
        # {first rank: [(first, last)]} of /rank_classes; None in a run's report.
        self.classes = None
        if self.tables.get("rank_classes") is not None:
            t = self.tables["rank_classes"]
            self.classes = {}
            for r, a, b in zip(t["rank"], t["first"], t["last"]):
                self.classes.setdefault(int(r), []).append((int(a), int(b)))
        try:
            self.config = tomllib.loads(self.attrs.get("resolved_config", ""))
        except tomllib.TOMLDecodeError as e:
            raise ReportError(f"{path}: its resolved_config is not TOML: {e}") from None

    @property
    def status(self):
        return self.attrs.get("status", "?")

    @property
    def world(self):
        return int(self.attrs.get("world_size", 1))

    @property
    def simulated(self):
        return int(self.attrs.get("simulated", 0)) == 1

    @property
    def row_ranks(self):
        """The ranks whose rows the tables hold, ascending: every rank of a
        run, the first of each class in an estimate or a simulation."""
        return sorted(self.classes) if self.classes is not None else list(range(self.world))

    def ranges(self, rank):
        """[(first, last)]: the ranks the rows of `rank` stand for."""
        return [(int(rank), int(rank))] if self.classes is None else list(self.classes.get(int(rank), []))

    def members(self, rank):
        """How many ranks the rows of `rank` stand for (1 in a run)."""
        return sum(b - a + 1 for a, b in self.ranges(rank))

    def weights(self, ranks):
        """members() of each entry of a rank column, as floats."""
        ranks = np.asarray(ranks)
        if self.classes is None:
            return np.ones(len(ranks))
        size = {r: float(self.members(r)) for r in self.classes}
        return np.array([size.get(int(r), 0.0) for r in ranks])

    def rank_label(self, rank, width=40):
        """"rank 3", or for a class "ranks 0-511" (its ranges, cut to
        `width` characters, and how many)."""
        return ranges_label(self.ranges(rank) or [(int(rank), int(rank))], width)

    def array(self, name):
        """The table as a numpy structured array (strings as bytes), or an
        empty array when the report has none (a run that failed before
        writing it)."""
        t = self.tables.get(name)
        return t if t is not None else np.zeros(0)

    def table(self, name):
        """The table as a pandas DataFrame, one column per table column,
        strings decoded to str, and each column's unit in
        df.attrs["units"]; empty (no columns) when the report has none."""
        if name not in TABLES:
            raise ReportError(f"{self.path}: no table '{name}'; the tables are {', '.join(TABLES)}")
        return data_frame(self.tables.get(name), self.units.get(name, {}))

    def column(self, name, col):
        t = self.array(name)
        if len(t) == 0:
            return np.zeros(0)
        c = t[col]
        return texts(c) if c.dtype.kind == "S" else c

    def measured_steps(self):
        """Rows of /steps outside the warm-up: selected once (the summary
        asks several times, and a long run's /steps is large), so not to be
        modified."""
        if self._measured is None:
            s = self.array("steps")
            self._measured = s[s["warmup"] == 0] if len(s) else s
        return self._measured

"""Opening a report: the schema check and typed access to its tables.

The stable API (strata_report.Report):
  Report(path).table(name)  the table as a pandas DataFrame, strings as str
  Report(path).array(name)  the same table as a numpy structured array
  Report(path).summary      {name: float or str} of /summary's scalars
  Report(path).config       the resolved configuration, as nested dicts
  Report(path).attrs        the root attributes (provenance), strings as str
"""
import tomllib

import h5py
import numpy as np

SCHEMA = "strata-report"
VERSION = 1
TABLES = ("ranks", "steps", "memory", "timeline", "comm", "experts", "summary/comm", "summary/pipeline")


class ReportError(Exception):
    """A file that is not a report this tool can read; the message says why."""


def text(x):
    return x.decode() if isinstance(x, bytes) else str(x)


class Report:
    """A report's tables, its /summary scalars, its configuration and its
    root attributes, read once when opened."""

    def __init__(self, path):
        self.path = str(path)
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise ReportError(f"{path}: cannot open as HDF5: {e}") from None
        with f:
            schema = text(f.attrs.get("schema", ""))
            version = int(f.attrs.get("schema_version", 0))
            if schema != SCHEMA or version != VERSION:
                raise ReportError(f"{path}: schema is '{schema}' v{version}; this tool reads '{SCHEMA}' "
                                  f"v{VERSION} (a Strata run report)")
            self.attrs = {k: (text(v) if isinstance(v, (bytes, str)) else v) for k, v in f.attrs.items()}
            self.tables = {}
            self.summary = {}
            for name in TABLES:
                self.tables[name] = f[name][...] if name in f else None
            if "summary" in f:
                for k, d in f["summary"].items():
                    if isinstance(d, h5py.Dataset) and d.shape == ():
                        v = d[()]
                        self.summary[k] = text(v) if isinstance(v, (bytes, str)) else float(v)
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

    def array(self, name):
        """The table as a numpy structured array (strings as bytes), or an
        empty array when the report has none (a run that failed before
        writing it)."""
        t = self.tables.get(name)
        return t if t is not None else np.zeros(0)

    def table(self, name):
        """The table as a pandas DataFrame, one column per table column,
        strings decoded to str; empty (no columns) when the report has none."""
        import pandas as pd  # only where a DataFrame is asked for

        if name not in TABLES:
            raise ReportError(f"{self.path}: no table '{name}'; the tables are {', '.join(TABLES)}")
        t = self.tables.get(name)
        if t is None:
            return pd.DataFrame()
        cols = {}
        for c in t.dtype.names:
            cols[c] = [text(x) for x in t[c]] if t.dtype[c].kind in "SOU" else t[c]
        return pd.DataFrame(cols)

    def column(self, name, col):
        t = self.array(name)
        if len(t) == 0:
            return np.zeros(0)
        c = t[col]
        return np.array([text(x) for x in c]) if c.dtype.kind == "S" else c

    def measured_steps(self):
        """Rows of /steps outside the warm-up."""
        s = self.array("steps")
        return s[s["warmup"] == 0] if len(s) else s

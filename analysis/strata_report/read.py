"""Opening a report: the schema check and typed access to its tables."""
import h5py
import numpy as np

SCHEMA = "strata-report"
VERSION = 1


class ReportError(Exception):
    """A file that is not a report this tool can read; the message says why."""


def text(x):
    return x.decode() if isinstance(x, bytes) else str(x)


class Report:
    """A report's tables (numpy structured arrays, byte strings decoded on
    demand), its /summary scalars and its root attributes."""

    def __init__(self, path):
        self.path = path
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
            for name in ("steps", "memory", "timeline", "comm", "experts", "summary/comm", "summary/pipeline"):
                self.tables[name] = f[name][...] if name in f else None
            if "summary" in f:
                for k, d in f["summary"].items():
                    if isinstance(d, h5py.Dataset) and d.shape == ():
                        v = d[()]
                        self.summary[k] = text(v) if isinstance(v, bytes) else float(v)

    @property
    def status(self):
        return self.attrs.get("status", "?")

    @property
    def world(self):
        return int(self.attrs.get("world_size", 1))

    def table(self, name):
        """The table, or an empty array when the report has none (a run that
        failed before writing it)."""
        t = self.tables.get(name)
        return t if t is not None else np.zeros(0)

    def column(self, name, col):
        t = self.table(name)
        if len(t) == 0:
            return np.zeros(0)
        c = t[col]
        return np.array([text(x) for x in c]) if c.dtype.kind == "S" else c

    def measured_steps(self):
        """Rows of /steps outside the warm-up."""
        s = self.table("steps")
        return s[s["warmup"] == 0] if len(s) else s

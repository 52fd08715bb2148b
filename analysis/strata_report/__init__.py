"""Reading and presenting Strata's HDF5 reports (schema strata-report v1).

The stable API:

    import strata_report                  # pip install ./analysis, or analysis/ on PYTHONPATH
    r = strata_report.Report("results/run.h5")
    r.table("steps")                      # a pandas DataFrame, strings as str
    r.table("steps").attrs["units"]       # {column: unit}
    r.summary["mfu"], r.config["parallel"]["dp"], r.attrs["hosts"]
    ix = strata_report.Index("results/<sweep>/index.h5")   # a sweep's index or a plan
    ix.table()                            # its points, a column per deck key they set
    strata_report.open_file(path)         # a Report or an Index, as the file is

Modules: read (Report), summary (the text tables), plots (timeline, memory,
communication and expert-load pictures), trace (Chrome/Perfetto JSON),
compare (runs side by side), sweep (a sweep's index), outputs (the check
that no output is an input or another output).
"""
from .read import Report, ReportError, text  # noqa: F401
from .sweep import Index, open_file  # noqa: F401

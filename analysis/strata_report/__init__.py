"""Reading and presenting Strata's HDF5 reports (schema strata-report v1).

The stable API:

    import strata_report                  # with analysis/ on sys.path or PYTHONPATH
    r = strata_report.Report("results/run.h5")
    r.table("steps")                      # a pandas DataFrame, strings as str
    r.summary["mfu"], r.config["parallel"]["dp"], r.attrs["hosts"]

Modules: read (Report), summary (the text tables), plots (timeline, memory,
communication and expert-load pictures), trace (Chrome/Perfetto JSON),
compare (runs side by side), sweep (a sweep's index).
"""
from .read import Report, ReportError, text  # noqa: F401

"""The strata-report command."""
import argparse
import os
import sys

from . import compare, plots, summary, sweep, trace
from .read import Report, ReportError

USAGE = """strata-report RUN.h5 [--plots DIR] [--trace OUT.json] [--trace-per-rank DIR]
       strata-report SWEEP/index.h5 [--plots DIR]
       strata-report compare A.h5 B.h5 [C.h5 ...] [--format text|json|csv]"""


def _writable_dir(path, what):
    """Raises ReportError unless `path` is a writable directory or can be made."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ReportError(f"{what} {path}: exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ReportError(f"{what} {path}: the directory is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ReportError(f"{what} {path}: cannot be made: {parent} is not a writable directory")


def _writable_file(path, what):
    """Raises ReportError unless `path` can take a file: not a directory or a
    device/FIFO, in a directory that exists and is writable."""
    if os.path.isdir(path):
        raise ReportError(f"{what} {path}: is a directory; give a file's name")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ReportError(f"{what} {path}: exists and is not a regular file (a device, FIFO or socket)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ReportError(f"{what} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ReportError(f"{what} {path}: the directory {parent} is not writable")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "compare":
            ap = argparse.ArgumentParser(prog="strata-report compare",
                                         description="runs side by side: configuration differences and headline figures")
            ap.add_argument("reports", nargs="+", metavar="REPORT.h5")
            ap.add_argument("--format", choices=("text", "json", "csv"), default="text",
                            help="text (a table, ratios to the first), json or csv (for CI)")
            args = ap.parse_args(argv[1:])
            if len(args.reports) < 2:
                ap.error("compare needs at least two reports")
            print(compare.render([Report(p) for p in args.reports], args.format))
            return 0
        ap = argparse.ArgumentParser(prog="strata-report", usage=USAGE,
                                     description="summary, plots and trace of a Strata report")
        ap.add_argument("report")
        ap.add_argument("--plots", metavar="DIR", help="write timeline.png, memory.png and comm.png into DIR")
        ap.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace of the timeline and comm")
        ap.add_argument("--trace-per-rank", metavar="DIR",
                        help="write one trace per rank (rank-R.json, with distributedInfo) for Holistic Trace Analysis")
        args = ap.parse_args(argv)
        # Outputs checked before any work: a bad path is an input error, not a traceback.
        if args.plots:
            _writable_dir(args.plots, "--plots")
        if args.trace:
            _writable_file(args.trace, "--trace")
        if args.trace_per_rank:
            _writable_dir(args.trace_per_rank, "--trace-per-rank")
        opened = sweep.open_file(args.report)
        if isinstance(opened, sweep.Index):
            ix = opened
            print(sweep.render(ix))
            if args.plots:
                for p in sweep.plot(ix, args.plots):
                    print(f"wrote {p}")
            if args.trace or args.trace_per_rank:
                raise ReportError(f"{args.report}: a sweep index has no timeline; trace a point's report instead")
            return 0
        rep = opened
        print(summary.render(rep))
        if args.plots:
            for p in plots.write_all(rep, args.plots):
                print(f"wrote {p}")
        if args.trace:
            trace.write(rep, args.trace)
            print(f"wrote {args.trace} (open in https://ui.perfetto.dev)")
        if args.trace_per_rank:
            paths = trace.write_per_rank(rep, args.trace_per_rank)
            print(f"wrote {len(paths)} trace(s) into {args.trace_per_rank} (one per rank, or class of ranks, with "
                  f"distributedInfo)")
        return 0
    except ReportError as e:
        print(f"strata-report: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (| head): nothing more to say, and no traceback
        # when the interpreter flushes stdout on exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1

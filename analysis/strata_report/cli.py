"""The strata-report command."""
import argparse
import os
import sys

from . import compare, outputs, plots, summary, sweep, trace
from .read import Report, ReportError

USAGE = """strata-report RUN.h5 [--plots DIR] [--trace OUT.json] [--trace-per-rank DIR]
       strata-report SWEEP/index.h5 [--plots DIR]
       strata-report compare A.h5 B.h5 [C.h5 ...] [--format text|json|csv]"""


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
            # compare writes nothing but its table (standard output): no output to check.
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
        # Outputs checked before any work: a bad path, or one that is the
        # input or another output, is an input error with nothing written,
        # not a traceback or an overwritten report. Whether the input is a
        # report or an index is not known yet: --plots is checked for the
        # pictures of either.
        outputs.check([("the input", args.report)],
                      files=[("--trace", args.trace)] if args.trace else [],
                      dirs=([("--plots", args.plots, plots.FILES + (sweep.PLOT_FILE,))] if args.plots else [])
                      + ([("--trace-per-rank", args.trace_per_rank, (trace.PER_RANK_FILE,))]
                         if args.trace_per_rank else []))
        opened = sweep.open_file(args.report)
        if isinstance(opened, sweep.Index):
            ix = opened
            if args.trace or args.trace_per_rank:
                raise ReportError(f"{args.report}: a sweep index has no timeline; trace a point's report instead")
            print(sweep.render(ix))
            if args.plots:
                for p in sweep.plot(ix, args.plots):
                    print(f"wrote {p}")
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

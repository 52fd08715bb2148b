// Strategy sweeps from a deck's [sweep] table: the cartesian product of
// axes (lists of values for any deck key), filtered by `where` clauses and
// an optional `world` list, each point checked by the deck's own validation.
// The driver runs every valid point as its own job step (mpiexec, or srun
// inside a SLURM allocation), so a failing point cannot take the sweep down,
// and keeps an index of the points and their headline figures.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace strata::sweep {

// The most runs (points x run.repeats) one sweep may ask for: each is a job
// and a report, and every point is resolved before the first runs. Larger
// products are refused before any is expanded.
inline constexpr long kMaxRuns = 100000;

struct Point {
  int index = 0;
  std::vector<std::string> overrides;  // the axes' "section.key=value", after the deck's --set
  std::string label;                   // the overrides, space-separated
  int world = 0;                       // the ranks of the resolved point's mesh (0 if it does not resolve)
  bool valid = false;
  bool filtered = false;               // not valid because the deck's where or world leaves it out
  bool selected = true;                // valid and chosen by --where, --points and --limit (all, without them)
  std::string reason;                  // why it is skipped, when not valid
  std::string report;                  // where its (first) report goes
  std::vector<std::string> reports;    // one per repeat: report, then point-NNN.r1.h5, ...
};

struct Sweep {
  std::string name;                    // sweep.name, else run.name
  std::string deck_path;
  std::vector<std::string> base_overrides;  // --set on the sweep command line
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;  // key, values as TOML literals
  std::vector<std::string> where;
  std::vector<int> worlds;
  int repeats = 1;                     // run.repeats of the base deck
  std::string dir;                     // results/<name>
  std::vector<Point> points;
};

// The valid points one command runs or lists: those meeting every `where`
// clause (the [sweep] table's grammar, over the point's resolved keys), of
// `points` ("0-5,9": indices and ranges; empty: all) and, of those, the
// first `limit` (0: no limit). The others stay valid and are not run: the
// index has them as not_run.
struct Selection {
  std::vector<std::string> where;
  std::string points;
  int limit = 0;
  bool any() const { return !where.empty() || !points.empty() || limit > 0; }
};

// Reads the deck's [sweep] table and resolves every point. Input errors
// (exit 2): no [sweep] table, an unknown axis key (with a suggestion), an
// axis that is not a non-empty list, a malformed `where` clause or `world`
// list, no valid point at all; a malformed selection.
Sweep load_sweep(const std::string& deck_path, const std::vector<std::string>& overrides,
                 const std::string& results_dir = "results", const Selection& selection = {});

// One line per point: index, world, status, overrides (and why a point is skipped).
// The valid points, one line each; `all`: the skipped ones too, with why.
std::string describe(const Sweep& s, bool all);

struct RunOptions {
  int world = 0;              // ranks available; 0: SLURM_NTASKS, else no limit
  std::string launcher;       // "{n}" is replaced by the point's ranks; default: srun under SLURM, else mpiexec
  bool retry_failed = false;  // run points whose report says failed (or was left unfinished) again
  // The stop signal received (SIGINT, SIGTERM, SIGUSR1), 0 while none: the
  // running point's job is sent it and waited for, and no further point is
  // started.
  std::function<int()> stopped = nullptr;
};

// Runs every valid point that fits, one child job per point (its output in
// <dir>/point-NNN.log), skipping those whose report is complete (resume)
// and, unless retry_failed, those that failed before. Returns the number of
// points that failed (in this or an earlier invocation). Each job runs in a
// process group of its own, to which a stop is forwarded (opts.stopped).
int run_sweep(const Sweep& s, const RunOptions& opts);

// Rewrites <dir>/index.h5 from the reports on disk (what a SLURM array's
// last job does). Needs MPI initialised.
void write_index(const Sweep& s);

}  // namespace strata::sweep

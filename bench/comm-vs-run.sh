#!/usr/bin/env bash
# Side by side, in one run of this script: the bus bandwidth of a dp = 2
# training run's gradient all-reduce (4 MiB buckets, /summary/comm, from the
# calls' transfer times) against raw MPI_Allreduce of the same size on the
# same two ranks (bench_comm). The goal: the run's within 20 % of the raw
# figure on a quiet machine; the ratio is printed, and the exit status is 1
# when it is outside.
#
# usage: bench/comm-vs-run.sh [BUILD_DIR]   (default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

raw=$(mpiexec -n 2 "$build/bench/bench_comm" | awk '$1 == 4194304 {print $6}')

cat > "$work/deck.toml" <<'DECK'
[run]
steps = 12
warmup_steps = 4
seed = 1
[model]
layers = 4
d_model = 256
heads = 4
vocab = 256
seq_len = 32
[data]
global_batch = 4
micro_batch = 2
[parallel]
dp = 2
zero = 0
bucket_mb = 4
[backend]
threads = 1
peak_tflops = 0.05
DECK
mpiexec -n 2 "$build/strata" run "$work/deck.toml" --output "$work/run.h5" > "$work/run.log"

"$py" - "$work/run.h5" "$raw" <<'PY'
import sys
import h5py
import numpy as np

c = h5py.File(sys.argv[1])["summary/comm"][...]
raw = float(sys.argv[2])
rows = c[(c["axis"] == b"dp") & (c["op"] == b"all_reduce") & (c["size_class"] == 4 << 20)]
if len(rows) == 0:
    sys.exit("no 4 MiB dp all_reduce rows in the run's /summary/comm")
print("dp = 2 gradient all-reduce, 4 MiB buckets, f32 sum, this machine")
print(f"{'':<40}{'busbw GB/s':>12}")
print(f"{'raw MPI_Allreduce (bench_comm)':<40}{raw:>12.3f}")
for r in rows:
    print(f"{'run, rank %d: %d calls, %.0f%% hidden' % (r['rank'], r['count'], 100 * r['hidden_fraction']):<40}"
          f"{r['busbw'] / 1e9:>12.3f}")
    span_bw = r["bytes"] / r["span"] / 1e9 if r["span"] > 0 else 0.0
    print(f"{'  (bytes over the span instead)':<40}{span_bw:>12.3f}")
run = float(np.mean(rows["busbw"])) / 1e9
ratio = run / raw
print(f"run / raw = {ratio:.3f} (goal: within 0.8 .. 1.2)")
sys.exit(0 if 0.8 <= ratio <= 1.2 else 1)
PY

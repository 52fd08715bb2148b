#!/usr/bin/env bash
# The pipeline schedules side by side, in one run of this script: ZB-V
# against its siblings ZB-H1 and 1F1B.
#   1. here: inputs/pp-zb-v.toml on 2 ranks (pp 2, one core each; 8
#      micro-batches of a small GPT) under each schedule: the measured bubble (median over ranks of
#      /summary/pipeline), the row's unit-cost figure, step time and the
#      largest rank's activation peak;
#   2. at scale: inputs/gpt-7b-4096.toml (7B, pp 8 x tp 8 x dp 64, 8
#      micro-batches per pipeline, no recomputation: the zero-bubble
#      schedules keep every block's activations) simulated on an H100 machine
#      description: predicted bubble, step time, tokens/s and activation peak.
# Two ranks on a shared 2-core machine still contend with everything else
# running there; the simulation is the at-scale comparison.
#
# usage: bench/pp-schedules.sh [BUILD_DIR]   (default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

schedules=("1f1b 1" "zb-h1 1" "zb-v 2")
for s in "${schedules[@]}"; do
  read -r name v <<< "$s"
  mpiexec -n 2 "$build/strata" run inputs/pp-zb-v.toml --set parallel.pp=2 --set "parallel.schedule=\"$name\"" \
    --set "parallel.virtual_stages=$v" --output "$work/run-$name.h5" > "$work/run-$name.log"
  "$build/strata" simulate inputs/gpt-7b-4096.toml --machine h100-80gb --set 'model.recompute="none"' \
    --set "parallel.schedule=\"$name\"" --set "parallel.virtual_stages=$v" --output "$work/sim-$name.h5" \
    > "$work/sim-$name.log" || (( $? == 3 ))  # 3: does not fit; the report is written
done

"$py" - "$work" <<'PY'
import sys
import h5py
import numpy as np

work = sys.argv[1]
names = ["1f1b", "zb-h1", "zb-v"]

def figures(path):
    f = h5py.File(path)
    s = f["summary"]
    pipe = s["pipeline"][...]
    scalar = lambda k: float(s[k][()]) if k in s else float("nan")
    return (float(np.median(pipe["bubble"])), float(np.median(pipe["theory"])), scalar("step_time"),
            scalar("tokens_per_s"), scalar("peak_bytes_activations"))

for title, prefix in (("measured here: inputs/pp-zb-v.toml, pp 2 on 2 ranks, m = 8", "run"),
                      ("simulated: gpt-7b-4096 (pp 8, tp 8, dp 64, m = 8) on h100-80gb", "sim")):
    print(title)
    print(f"{'schedule':<10}{'bubble':>10}{'theory':>10}{'step s':>12}{'tokens/s':>14}{'act. peak GiB':>15}")
    for n in names:
        b, t, st, tps, act = figures(f"{work}/{prefix}-{n}.h5")
        print(f"{n:<10}{b:>10.4f}{t:>10.4f}{st:>12.4f}{tps:>14.0f}{act / 2**30:>15.3f}")
    print()
PY

#!/usr/bin/env bash
# The Kokkos backend against the CPU backend, side by side in one run of this
# script: inputs/bench-gpt.toml (one thread) on backend.device = "cpu" and
# "kokkos", alternating, ROUNDS times each, so both see the same machine. Per
# run: the median step time of its measured steps (the report's
# /summary/step_time); then the median over the rounds of each backend, the
# ratio kokkos / cpu, and the largest difference between the two loss
# trajectories.
#
# usage: bench/kokkos-vs-cpu.sh [BUILD_DIR] [ROUNDS]   (default build/, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

for r in $(seq 1 "$rounds"); do
  for d in cpu kokkos; do
    "$build/strata" run inputs/bench-gpt.toml --set "backend.device=\"$d\"" --output "$work/$d-$r.h5" \
      > "$work/$d-$r.log"
  done
done

"$py" - "$work" "$rounds" <<'PY'
import sys
import h5py
import numpy as np

work, rounds = sys.argv[1], int(sys.argv[2])

def run(path):
    f = h5py.File(path)
    steps = f["steps"][...]
    return float(f["summary"]["step_time"][()]), steps["loss"], f.attrs["backend"]

times = {"cpu": [], "kokkos": []}
worst = 0.0
for r in range(1, rounds + 1):
    c = run(f"{work}/cpu-{r}.h5")
    k = run(f"{work}/kokkos-{r}.h5")
    times["cpu"].append(c[0])
    times["kokkos"].append(k[0])
    worst = max(worst, float(np.max(np.abs(c[1] - k[1]))))
    names = (c[2], k[2])
print(f"inputs/bench-gpt.toml, one thread, {rounds} round(s); step time (s), median of each run's measured steps")
print(f"{'backend':<22}{'per round':<36}{'median':>10}")
for d, name in zip(("cpu", "kokkos"), names):
    per = " ".join(f"{t:.4f}" for t in times[d])
    print(f"{name:<22}{per:<36}{np.median(times[d]):>10.4f}")
ratio = np.median(times["kokkos"]) / np.median(times["cpu"])
print(f"kokkos / cpu step time: {ratio:.3f}x")
print(f"largest |loss difference| over the steps: {worst:.3g}")
PY

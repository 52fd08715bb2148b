#!/usr/bin/env bash
# A bf16 step against an fp32 one, side by side in one run of this script:
# inputs/bench-gpt.toml (one thread) at backend.precision = "fp32" and
# "bf16", alternating, ROUNDS times each, so both see the same machine. Per
# run: the median tokens/s of its measured steps (the report's
# /summary/tokens_per_s); then the median over the rounds of each, the ratio
# bf16 / fp32, the GEMM each ran on (the provenance's libraries) and the
# largest difference between the two loss trajectories, relative to fp32's.
# With a second build directory the fp32 step of that build runs too, so a
# change's fp32 speed stands beside the build before it.
#
# usage: bench/bf16-vs-fp32.sh [BUILD_DIR] [ROUNDS] [OLD_BUILD_DIR]   (default build/, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
old=${3:-}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

for r in $(seq 1 "$rounds"); do
  for p in fp32 bf16; do
    "$build/strata" run inputs/bench-gpt.toml --set "backend.precision=\"$p\"" --set backend.peak_tflops=1 \
      --output "$work/$p-$r.h5" > "$work/$p-$r.log"
  done
  if [[ -n $old ]]; then
    "$old/strata" run inputs/bench-gpt.toml --set backend.peak_tflops=1 --output "$work/old-$r.h5" > "$work/old-$r.log"
  fi
done

"$py" - "$work" "$rounds" "${old:+old}" <<'PY'
import sys
import h5py
import numpy as np

work, rounds, with_old = sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "old"
kinds = ["fp32", "bf16"] + (["old"] if with_old else [])

def run(path):
    f = h5py.File(path)
    libs = f.attrs.get("kernel_libraries", b"")
    libs = libs.decode() if isinstance(libs, bytes) else str(libs)
    return float(f["summary"]["tokens_per_s"][()]), f["steps"][...]["loss"], libs

rate = {k: [] for k in kinds}
worst = 0.0
for r in range(1, rounds + 1):
    runs = {k: run(f"{work}/{k}-{r}.h5") for k in kinds}
    for k in kinds:
        rate[k].append(runs[k][0])
    worst = max(worst, float(np.max(np.abs(runs["bf16"][1] - runs["fp32"][1]) / np.abs(runs["fp32"][1]))))
    libs = runs["fp32"][2]
print(f"inputs/bench-gpt.toml, one thread, {rounds} round(s); tokens/s, median of each run's measured steps")
print(f"{'precision':<24}{'per round':<36}{'median':>10}")
label = {"fp32": "fp32", "bf16": "bf16", "old": "fp32 (the other build)"}
for k in kinds:
    per = " ".join(f"{t:.0f}" for t in rate[k])
    print(f"{label[k]:<24}{per:<36}{np.median(rate[k]):>10.0f}")
print(f"bf16 / fp32 tokens/s: {np.median(rate['bf16']) / np.median(rate['fp32']):.2f}x")
if with_old:
    print(f"fp32 / fp32 of the other build: {np.median(rate['fp32']) / np.median(rate['old']):.3f}x")
print(f"libraries: {libs}")
print(f"largest |loss difference| relative to fp32's over the steps: {worst:.3g}")
PY

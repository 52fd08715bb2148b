#!/usr/bin/env bash
# Context parallelism against whole sequences, side by side, in one run of
# this script: the memory per rank at a long sequence, and what the ring
# costs.
#   1. here: inputs/dp-zero.toml's model at seq_len 2048 on 2 ranks, cp 2
#      (each rank half of every sequence) against dp 2 (each rank whole
#      sequences, the same global batch): the largest rank's peak bytes per
#      category, step time, and the bytes one step sends around the ring;
#   2. at scale: gpt-7b-4096's model (7B, bf16, tp 8, pp 1, selective
#      recomputation) at seq_len 32768 on 64 H100s, cp 1 x dp 8, cp 2 x dp 4
#      and cp 4 x dp 2, simulated: the same figures predicted.
# On this CPU backend the whole-sequence kernel keeps the T x T
# probabilities, so cp 1's activations grow with T^2; the simulation uses
# the CUDA backend's (fused) sizes, where they grow with T.
#
# usage: bench/cp-memory.sh [BUILD_DIR]   (default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

here=(--set model.seq_len=2048 --set data.global_batch=4 --set data.micro_batch=1 --set run.steps=4
      --set run.warmup_steps=1 --set parallel.zero=0)
mpiexec -n 2 "$build/strata" run inputs/dp-zero.toml "${here[@]}" --set parallel.dp=2 --output "$work/run-1.h5" \
  > "$work/run-1.log"
mpiexec -n 2 "$build/strata" run inputs/dp-zero.toml "${here[@]}" --set parallel.dp=1 --set parallel.cp=2 \
  --output "$work/run-2.h5" > "$work/run-2.log"
scale=(--machine h100-80gb --set model.seq_len=32768 --set parallel.pp=1 --set parallel.tp=8
       --set data.global_batch=16 --set data.micro_batch=1)
for c in "1 8" "2 4" "4 2"; do
  read -r cp dp <<< "$c"
  "$build/strata" simulate inputs/gpt-7b-4096.toml "${scale[@]}" --set "parallel.cp=$cp" --set "parallel.dp=$dp" \
    --output "$work/sim-$cp.h5" > "$work/sim-$cp.log" || (( $? == 3 ))  # 3: does not fit; the report is written
done

"$py" - "$work" <<'PY'
import sys
import h5py

work = sys.argv[1]
cats = ["params", "grads", "optimizer", "activations", "workspace", "comm"]

def figures(path):
    f = h5py.File(path)
    s = f["summary"]
    peaks = {c: float(s[f"peak_bytes_{c}"][()]) for c in cats}
    comm = f["comm"][...]
    last = comm["step"].max()
    r0 = comm[(comm["rank"] == 0) & (comm["step"] == last) & (comm["axis"] == b"cp") & (comm["op"] == b"send")]
    return peaks, float(s["peak_bytes_total"][()]), float(s["step_time"][()]), float(s["tokens_per_s"][()]), \
        int(r0["bytes"].sum())

def table(title, rows):
    print(title)
    print(f"{'layout':<14}" + "".join(f"{c:>13}" for c in cats) + f"{'peak':>13}{'step s':>10}{'tokens/s':>12}"
          f"{'ring sends':>13}")
    for name, path in rows:
        peaks, total, st, tps, ring = figures(path)
        print(f"{name:<14}" + "".join(f"{peaks[c] / 2**20:>11.2f}Mi" for c in cats) +
              f"{total / 2**20:>11.2f}Mi{st:>10.4f}{tps:>12.0f}{ring / 2**20:>11.2f}Mi")
    print()

table("measured here: dp-zero's model, seq_len 2048, 2 ranks (largest rank's peaks)",
      [("cp 1 (dp 2)", f"{work}/run-1.h5"), ("cp 2", f"{work}/run-2.h5")])
table("simulated: 7B bf16, seq_len 32768, tp 8 on 64 h100-80gb (largest rank's peaks)",
      [("cp 1 x dp 8", f"{work}/sim-1.h5"), ("cp 2 x dp 4", f"{work}/sim-2.h5"), ("cp 4 x dp 2", f"{work}/sim-4.h5")])
PY

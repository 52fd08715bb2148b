#!/usr/bin/env bash
# Hybrid sharding against full ZeRO-3, side by side, in one run of this
# script: what each rank holds and what each step moves, per axis.
#   1. here: inputs/dp-zero.toml on 4 ranks (dp 4, ZeRO-3): the state
#      sharded over all four ranks, over two groups of two (dp_shard 2), and
#      not sharded at all but replicated over four groups of one (dp_shard
#      1): rank 0's params + grads + optimizer bytes held at the end of a step
#      and its peak, the bytes one step moves on each axis, and the step time;
#   2. at scale: gpt-7b-4096's model (7B, bf16, full recomputation, tp 1,
#      pp 1) on nodes of 8 H100s, ZeRO-3 over every dp rank against ZeRO-3
#      over each node's 8 (dp_shard 8), simulated: the same figures
#      predicted, with the step time and tokens/s, on dp 64 (8 nodes) with 4
#      micro-batches per rank and with one, and on dp 512 (64 nodes) with
#      one, where each ring over all ranks pays 511 latencies per collective.
# The shared 2-core machine makes the measured step times noisy; the bytes
# are exact.
#
# usage: bench/hybrid-shard.sh [BUILD_DIR]   (default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

for s in 0 2 1; do
  mpiexec -n 4 "$build/strata" run inputs/dp-zero.toml --set parallel.zero=3 --set "parallel.dp_shard=$s" \
    --output "$work/run-$s.h5" > "$work/run-$s.log"
done
at_scale=(--machine h100-80gb --set parallel.tp=1 --set parallel.pp=1 --set parallel.zero=3
          --set parallel.sequence_parallel=false --set 'model.recompute="full"')
cases=("64 256" "64 64" "512 512")  # dp, global batch
for c in "${cases[@]}"; do
  read -r dp g <<< "$c"
  for s in 0 8; do
    "$build/strata" simulate inputs/gpt-7b-4096.toml "${at_scale[@]}" --set "parallel.dp=$dp" \
      --set "data.global_batch=$g" --set "parallel.dp_shard=$s" --output "$work/sim-$dp-$g-$s.h5" \
      > "$work/sim-$dp-$g-$s.log" || (( $? == 3 ))  # 3: does not fit; the report is written
  done
done

"$py" - "$work" <<'PY'
import sys
import h5py
import numpy as np

work = sys.argv[1]

def figures(path):
    f = h5py.File(path)
    mem = f["memory"][...]
    last = mem["step"].max()
    r0 = mem[(mem["rank"] == 0) & (mem["step"] == last) & (mem["pool"] == b"device")]
    state = sum(int(r["current_bytes"]) for r in r0 if r["category"] in (b"params", b"grads", b"optimizer"))
    s = f["summary"]
    peak = float(s["peak_bytes_total"][()])
    comm = f["comm"][...]
    c0 = comm[(comm["rank"] == 0) & (comm["step"] == last)]
    moved = {}
    for r in c0:
        key = r["axis"].decode()
        moved[key] = moved.get(key, 0) + int(r["bytes"])
    return state, peak, moved, float(s["step_time"][()]), float(s["tokens_per_s"][()])

def table(title, rows):
    print(title)
    print(f"{'layout':<26}{'state/rank':>13}{'peak/rank':>13}{'step s':>10}{'tokens/s':>12}  bytes one step moves (rank 0)")
    for name, path in rows:
        state, peak, moved, st, tps = figures(path)
        axes = ", ".join(f"{a} {b / 2**20:.3f} MiB" if b >= 2**10 else f"{a} {b} B" for a, b in sorted(moved.items()) if b > 0)
        print(f"{name:<26}{state / 2**20:>11.3f}Mi{peak / 2**20:>11.3f}Mi{st:>10.4f}{tps:>12.0f}  {axes}")
    print()

table("measured here: inputs/dp-zero.toml, dp 4, ZeRO-3 (MiB)",
      [("zero3 over dp 4", f"{work}/run-0.h5"), ("zero3 dp_shard 2", f"{work}/run-2.h5"),
       ("zero3 dp_shard 1", f"{work}/run-1.h5")])
for dp, g in ((64, 256), (64, 64), (512, 512)):
    table(f"simulated: 7B, dp {dp} ({dp // 8} nodes x 8 h100-80gb), ZeRO-3, bf16, {g // dp} micro-batch(es) per rank (MiB)",
          [(f"zero3 over dp {dp}", f"{work}/sim-{dp}-{g}-0.h5"), ("zero3 dp_shard 8", f"{work}/sim-{dp}-{g}-8.h5")])
PY

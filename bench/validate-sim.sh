#!/bin/bash
# The simulator against measurement on this machine: calibrate it (unless a
# machine description is given), then run and simulate every layout that
# fits on at most two ranks with one thread each, of the GPT of
# inputs/validate-sim.toml and of the Llama of inputs/llama/validate-sim.toml,
# and print the measured and predicted step times side by side with the
# error, and whether the simulated peak memory equals the measured one.
#   bench/validate-sim.sh [MACHINE.toml]        (STRATA=build/strata OUT=results/validate-sim)
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/strata}
OUT=${OUT:-results/validate-sim}
mkdir -p "$OUT"
MACHINE=${1:-$OUT/machine.toml}
if [ -z "${1:-}" ]; then
  mpiexec -n 2 "$STRATA" calibrate --quick -o "$MACHINE" > "$OUT/calibrate.log"
fi
# model | deck | how its Mixture-of-Experts form is chosen
MODELS=(
  "gpt|inputs/validate-sim.toml|model.kind=\"moe\""
  "llama|inputs/llama/validate-sim.toml|"
)
# name | ranks | overrides (MOE: the model's MoE form)
LAYOUTS=(
  "one-rank|1|"
  "dp2|2|parallel.dp=2"
  "zero1|2|parallel.dp=2 parallel.zero=1"
  "zero2|2|parallel.dp=2 parallel.zero=2"
  "zero3|2|parallel.dp=2 parallel.zero=3"
  "tp2|2|parallel.tp=2"
  "tp2-sp|2|parallel.tp=2 parallel.sequence_parallel=true"
  "pp2-1f1b|2|parallel.pp=2"
  "pp2-gpipe|2|parallel.pp=2 parallel.schedule=\"gpipe\""
  "pp2-interleaved|2|parallel.pp=2 parallel.schedule=\"interleaved\" parallel.virtual_stages=2"
  "pp2-zb-h1|2|parallel.pp=2 parallel.schedule=\"zb-h1\""
  "recompute-full|1|model.recompute=\"full\""
  "recompute-selective|1|model.recompute=\"selective\""
  "offload-host|1|parallel.offload=\"host\""
  "moe-ep2|2|MOE model.moe_experts=4 model.moe_every=2 parallel.dp=2 parallel.ep=2"
)
names=()
for model in "${MODELS[@]}"; do
  IFS='|' read -r mname deck moe <<< "$model"
  for row in "${LAYOUTS[@]}"; do
    IFS='|' read -r name ranks sets <<< "$row"
    args=()
    for s in ${sets/MOE/$moe}; do args+=(--set "$s"); done
    name="$mname-$name"
    mpiexec -n "$ranks" "$STRATA" run "$deck" "${args[@]}" -o "$OUT/$name.h5" > "$OUT/$name.log"
    "$STRATA" simulate "$deck" --machine "$MACHINE" "${args[@]}" -o "$OUT/$name-sim.h5" > "$OUT/$name-sim.log"
    names+=("$name")
  done
done
/usr/bin/python3 - "$OUT" "${names[@]}" <<'PY'
import sys, h5py, numpy as np
out, rows = sys.argv[1], sys.argv[2:]
def figures(path):
    with h5py.File(path, "r") as f:
        mem = f["memory"][:]
        dev = mem[mem["pool"] == b"device"]
        peak = {}
        for r in dev:
            key = int(r["rank"])
            peak[key] = max(peak.get(key, 0), int(r["pool_peak_bytes"]))
        return float(f["summary/step_time"][()]), peak
print(f"{'layout':<26}{'measured_ms':>12}{'simulated_ms':>13}{'error':>9}  memory")
errs = {}
for name in rows:
    t_run, m_run = figures(f"{out}/{name}.h5")
    t_sim, m_sim = figures(f"{out}/{name}-sim.h5")
    err = (t_sim - t_run) / t_run
    errs.setdefault(name.split("-")[0], []).append(abs(err))
    same = "equal" if m_run == m_sim else f"DIFFERS {m_run} vs {m_sim}"
    print(f"{name:<26}{t_run*1e3:>12.2f}{t_sim*1e3:>13.2f}{100*err:>8.1f}%  {same}")
for model, e in errs.items():
    print(f"{model}: mean |error| {100*np.mean(e):.1f}%, max {100*np.max(e):.1f}% over {len(e)} layouts")
PY

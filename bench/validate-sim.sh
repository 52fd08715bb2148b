#!/bin/bash
# The simulator against measurement on this machine: calibrate it (unless a
# machine description is given), then run and simulate every layout that
# fits on at most two ranks with one thread each, of the GPT of
# inputs/validate-sim.toml and of the Llama of inputs/llama/validate-sim.toml,
# and print the measured and predicted step times side by side with the
# error, and whether the simulated peak memory equals the measured one.
#
# A shared machine's speed drifts by several per cent from one minute to the
# next, and a calibration with it. So the whole is done in ROUNDS rounds, each
# calibrating afresh and then running and simulating every layout; a layout's
# figures are the medians over the rounds of its measured and of its
# predicted step, and memory must be equal in every round.
#   bench/validate-sim.sh [MACHINE.toml]   (STRATA=build/strata OUT=results/validate-sim ROUNDS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/strata}
OUT=${OUT:-results/validate-sim}  # a rerun replaces the reports it wrote there (--force)
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
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
for round in $(seq 1 "$ROUNDS"); do
  MACHINE=${1:-$OUT/machine-$round.toml}
  if [ -z "${1:-}" ]; then
    mpiexec -n 2 "$STRATA" calibrate --quick -o "$MACHINE" > "$OUT/calibrate-$round.log"
  fi
  for model in "${MODELS[@]}"; do
    IFS='|' read -r mname deck moe <<< "$model"
    for row in "${LAYOUTS[@]}"; do
      IFS='|' read -r name ranks sets <<< "$row"
      args=()
      for s in ${sets/MOE/$moe}; do args+=(--set "$s"); done
      name="$mname-$name"
      echo "validate-sim: round $round/$ROUNDS: $name, run and simulated" >&2
      mpiexec -n "$ranks" "$STRATA" run "$deck" "${args[@]}" -o "$OUT/$name-$round.h5" --force > "$OUT/$name-$round.log"
      "$STRATA" simulate "$deck" --machine "$MACHINE" "${args[@]}" -o "$OUT/$name-sim-$round.h5" --force \
        > "$OUT/$name-sim-$round.log" || (( $? == 3 ))  # 3: does not fit; the report is written
      [ "$round" = 1 ] && names+=("$name")
    done
  done
done
/usr/bin/python3 - "$OUT" "$ROUNDS" "${names[@]}" <<'PY'
import sys, h5py, numpy as np
out, rounds, rows = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def figures(path):
    with h5py.File(path, "r") as f:
        mem = f["memory"][:]
        dev = mem[mem["pool"] == b"device"]
        peak = {}
        for r in dev:
            key = int(r["rank"])
            peak[key] = max(peak.get(key, 0), int(r["pool_peak_bytes"]))
        # A simulation's rows stand for classes of ranks: each rank's peak is its class's.
        if "rank_classes" in f:
            peak = {m: peak[int(c["rank"])] for c in f["rank_classes"][:]
                    for m in range(int(c["first"]), int(c["last"]) + 1)}
        return float(f["summary/step_time"][()]), peak
print(f"median of {rounds} round(s), each calibrated afresh")
print(f"{'layout':<26}{'measured_ms':>12}{'simulated_ms':>13}{'error':>9}  {'measured spread':>16}  memory")
errs = {}
for name in rows:
    t_run, t_sim, differs = [], [], []
    for r in range(1, rounds + 1):
        a, m_run = figures(f"{out}/{name}-{r}.h5")
        b, m_sim = figures(f"{out}/{name}-sim-{r}.h5")
        t_run.append(a), t_sim.append(b)
        if m_run != m_sim:
            differs.append(f"round {r}: {m_run} vs {m_sim}")
    run, sim = float(np.median(t_run)), float(np.median(t_sim))
    err = (sim - run) / run
    spread = (max(t_run) - min(t_run)) / run if rounds > 1 else None
    errs.setdefault(name.split("-")[0], []).append(abs(err))
    same = "equal" if not differs else "DIFFERS " + "; ".join(differs)
    shown = f"{100*spread:>15.1f}%" if spread is not None else f"{'- (one round)':>16}"
    print(f"{name:<26}{run*1e3:>12.2f}{sim*1e3:>13.2f}{100*err:>8.1f}%  {shown}  {same}")
for model, e in errs.items():
    print(f"{model}: mean |error| {100*np.mean(e):.1f}%, max {100*np.max(e):.1f}% over {len(e)} layouts")
PY

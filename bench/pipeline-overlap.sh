#!/bin/bash
# The pipeline schedules beside each other on one large layout
# (inputs/gpt-175b-pipeline.toml, simulated on a machine description):
# 1F1B and the interleaved schedule with 2, 3 and 6 chunks per rank, each
# with the data-parallel reduction after the backward pass and overlapped
# with it. Prints the step, stage 0's bubble and the schedule's theory.
# Interleaving should lower the bubble as the chunks grow, and overlapping
# should not make a step slower.
#   bench/pipeline-overlap.sh [MACHINE]     (STRATA=build/strata OUT=results/pipeline-overlap)
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/strata}
OUT=${OUT:-results/pipeline-overlap}  # a rerun replaces the reports it wrote there (--force)
MACHINE=${1:-a100-80gb}
DECK=inputs/gpt-175b-pipeline.toml
mkdir -p "$OUT"
printf '%-12s %-8s %10s %10s %10s\n' schedule overlap step_s bubble theory
for v in 1 2 3 6; do
  sched=()
  name=1f1b
  if (( v > 1 )); then sched=(--set 'parallel.schedule="interleaved"' --set "parallel.virtual_stages=$v"); name="interleaved-$v"; fi
  for overlap in false true; do
    log="$OUT/$name-$overlap.log"
    "$STRATA" simulate "$DECK" --machine "$MACHINE" "${sched[@]}" --set "parallel.overlap_grad_reduce=$overlap" \
      -o "$OUT/$name-$overlap.h5" --force > "$log" || (( $? == 3 ))  # 3: does not fit; the report is written
    step=$(sed -n 's/^predicted step \([0-9.]*\) s.*/\1/p' "$log")
    bubble=$(sed -n 's/^  stage 0: bubble *\([0-9.]*\)% = theory \([0-9.]*\)%.*/\1 \2/p' "$log")
    printf '%-12s %-8s %10s %9s%% %9s%%\n' "$name" "$overlap" "$step" $bubble
  done
done

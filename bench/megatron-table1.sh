#!/bin/bash
# The simulator against a published measurement: Megatron-LM's weak-scaling
# table (Narayanan et al. 2021, Table 1: GPT models of 1.7 B to 1 T parameters
# on up to 3072 A100-80GB GPUs of Selene), each row's deck under
# inputs/megatron/ simulated on inputs/machines/a100-80gb.toml. Prints the
# measured and predicted TFLOP/s per GPU (hardware FLOPs, recomputation
# counted, as the paper counts them) and the mean absolute error.
#   bench/megatron-table1.sh [MACHINE]     (STRATA=build/strata OUT=results/megatron)
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/strata}
OUT=${OUT:-results/megatron}
MACHINE=${1:-a100-80gb}
mkdir -p "$OUT"
decks=()
for d in 1.7b 3.6b 7.5b 18.4b 39.1b 76.1b 145.6b 310.1b 529.6b 1008b; do
  deck=inputs/megatron/gpt-$d.toml
  "$STRATA" simulate "$deck" --machine "$MACHINE" --output "$OUT/gpt-$d.h5" > "$OUT/gpt-$d.log"
  decks+=("$deck")
done
/usr/bin/python3 - "$OUT" "${decks[@]}" <<'PY'
import re, sys, h5py
out, decks = sys.argv[1], sys.argv[2:]
print(f"{'model':<10}{'GPUs':>6}{'layout':>24}{'measured':>10}{'simulated':>11}{'error':>9}{'bubble':>8}")
errs = []
for deck in decks:
    measured = float(re.search(r"megatron_tflops_per_gpu = ([0-9.]+)", open(deck).read()).group(1))
    name = deck.split("gpt-")[1][:-5]
    with h5py.File(f"{out}/gpt-{name}.h5", "r") as f:
        t = float(f["summary/step_time"][()])
        hw = float(f["summary/hardware_flops_per_step"][()])
        world = int(f.attrs["world_size"])
        layout = f["summary/layout"][()].decode()
        bubble = max(float(b) for b in f["summary/pipeline"]["bubble"])
    sim = hw / t / world / 1e12
    err = (sim - measured) / measured
    errs.append(abs(err))
    print(f"{name:<10}{world:>6}{layout:>24}{measured:>10.0f}{sim:>11.1f}{100*err:>8.1f}%{bubble:>8.3f}")
print(f"mean absolute error {100*sum(errs)/len(errs):.1f}% over {len(errs)} models")
PY

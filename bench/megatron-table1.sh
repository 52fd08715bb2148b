#!/bin/bash
# The simulator against a published measurement: Megatron-LM's weak-scaling
# table (Narayanan et al. 2021, Table 1: GPT models of 1.7 B to 1 T parameters
# on up to 3072 A100-80GB GPUs of Selene), each row's deck under
# inputs/megatron/ simulated on inputs/machines/a100-80gb.toml, each with the
# attention of the 2021 code (model.attention = "unfused"). Prints the
# published and predicted TFLOP/s per GPU (hardware FLOPs, recomputation
# counted, as the paper counts them) and the mean absolute error, and each
# run's largest device peak (GiB) against the machine's memory. The table
# does not say which pipelines ran the interleaved schedule, so each
# pipelined row is simulated twice: 1F1B (the decks') and interleaved with
# the fewest chunks per rank that divide its layers.
#   bench/megatron-table1.sh [MACHINE]     (STRATA=build/strata OUT=results/megatron)
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/strata}
OUT=${OUT:-results/megatron}  # a rerun replaces the reports it wrote there (--force)
MACHINE=${1:-a100-80gb}
mkdir -p "$OUT"
names=()
for d in 1.7b 3.6b 7.5b 18.4b 39.1b 76.1b 145.6b 310.1b 529.6b 1008b; do
  deck=inputs/megatron/gpt-$d.toml
  "$STRATA" simulate "$deck" --machine "$MACHINE" --output "$OUT/gpt-$d.h5" --force > "$OUT/gpt-$d.log" || (( $? == 3 ))  # 3: does not fit; the report is written
  layers=$(sed -n 's/^layers = \([0-9]*\).*/\1/p' "$deck")
  pp=$(sed -n 's/^pp = \([0-9]*\).*/\1/p' "$deck")
  if (( pp > 1 && layers / pp > 1 )); then
    per=$((layers / pp)) v=2
    while (( v <= per && per % v != 0 )); do v=$((v + 1)); done
    "$STRATA" simulate "$deck" --machine "$MACHINE" --set 'parallel.schedule="interleaved"' \
      --set parallel.virtual_stages=$v --output "$OUT/gpt-$d-interleaved.h5" --force > "$OUT/gpt-$d-interleaved.log" || (( $? == 3 ))  # 3: does not fit; the report is written
  fi
  names+=("$d")
done
/usr/bin/python3 - "$OUT" "inputs/machines/$MACHINE.toml" "${names[@]}" <<'PY'
import os, re, sys, tomllib, h5py
out, machine, names = sys.argv[1], sys.argv[2], sys.argv[3:]
memory = tomllib.load(open(machine, "rb"))["device"]["memory_gib"]
peaks = []
def tflops(path):
    with h5py.File(path, "r") as f:
        t = float(f["summary/step_time"][()])
        hw = float(f["summary/hardware_flops_per_step"][()])
        world = int(f.attrs["world_size"])
        bubble = max(float(b) for b in f["summary/pipeline"]["bubble"])
        peaks.append(float(f["summary/peak_bytes_total"][()]) / 2**30)
        return hw / t / world / 1e12, f["summary/layout"][()].decode(), world, bubble, peaks[-1]
print(f"{'model':<9}{'GPUs':>6}{'layout':>22}{'published':>10}{'1F1B':>8}{'error':>8}{'bubble':>8}{'GiB':>7}"
      f"{'interleaved':>12}{'error':>8}{'bubble':>8}{'GiB':>7}")
e1, e2 = [], []
for name in names:
    published = float(re.search(r"megatron_tflops_per_gpu = ([0-9.]+)",
                                open(f"inputs/megatron/gpt-{name}.toml").read()).group(1))
    a, layout, world, ba, pa = tflops(f"{out}/gpt-{name}.h5")
    err = (a - published) / published
    e1.append(abs(err))
    line = f"{name:<9}{world:>6}{layout:>22}{published:>10.0f}{a:>8.1f}{100*err:>7.1f}%{ba:>8.3f}{pa:>7.1f}"
    inter = f"{out}/gpt-{name}-interleaved.h5"
    if os.path.exists(inter):
        b, _, _, bb, pb = tflops(inter)
        e = (b - published) / published
        e2.append(abs(e))
        line += f"{b:>12.1f}{100*e:>7.1f}%{bb:>8.3f}{pb:>7.1f}"
    else:
        e2.append(abs(err))
        line += f"{'-':>12}{'':>8}{'':>8}{'':>7}"
    print(line)
print(f"mean absolute error: 1F1B everywhere {100*sum(e1)/len(e1):.1f}%; "
      f"interleaved on every pipeline {100*sum(e2)/len(e2):.1f}% ({len(e1)} models)")
print(f"fit in {memory} GiB: {sum(p <= memory for p in peaks)} of {len(peaks)} simulated runs")
PY

#!/bin/bash
# The tiny Llama of inputs/llama/tiny.toml beside a GPT of about its
# parameter count (the quickstart GPT with an MLP of 5 d_model: 137 k
# parameters against the Llama's 131 k), one rank and one thread each,
# three runs each taken in turn: their parameters, median tokens/s, and
# the ratio. What differs is the block: GQA with RoPE and a SwiGLU MLP
# without biases against multi-head attention and a GELU MLP.
#   bench/llama-vs-gpt.sh      (STRATA=build/strata OUT=results/llama-vs-gpt)
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/strata}
OUT=${OUT:-results/llama-vs-gpt}  # a rerun replaces the reports it wrote there (--force)
mkdir -p "$OUT"
common=(--set run.steps=60 --set run.warmup_steps=10 --set backend.threads=1)
gpt=(inputs/quickstart.toml --set parallel.dp=1 --set parallel.zero=0 --set model.ffn_mult=5)
llama=(inputs/llama/tiny.toml)
for i in 1 2 3; do
  "$STRATA" run "${llama[@]}" "${common[@]}" -o "$OUT/llama-$i.h5" --force > "$OUT/llama-$i.log"
  "$STRATA" run "${gpt[@]}" "${common[@]}" -o "$OUT/gpt-$i.h5" --force > "$OUT/gpt-$i.log"
done
/usr/bin/python3 - "$OUT" <<'PY'
import sys, statistics, h5py
out = sys.argv[1]
def figures(name):
    tps = []
    for i in (1, 2, 3):
        with h5py.File(f"{out}/{name}-{i}.h5", "r") as f:
            tps.append(float(f["summary/tokens_per_s"][()]))
            params = int(f["summary/parameters"][()])
    return params, statistics.median(tps), tps
rows = {n: figures(n) for n in ("llama", "gpt")}
print(f"{'model':<8}{'parameters':>12}{'tokens/s (median of 3)':>24}  runs")
for n, (p, t, all_) in rows.items():
    print(f"{n:<8}{p:>12}{t:>24.0f}  {', '.join(f'{x:.0f}' for x in all_)}")
print(f"llama / gpt tokens/s: {rows['llama'][1] / rows['gpt'][1]:.3f}")
PY

#!/usr/bin/env bash
# How long `strata plan` takes and how much memory it holds, pruned by the
# layouts' bounds, for inputs/gpt-7b-4096.toml on h100-80gb at 512 and 4096
# devices (WORLDS to change them); with EXHAUSTIVE=1 also every layout judged
# at a small world (default 32), and whether both give the same best rows.
#   bash bench/plan-speed.sh [build/strata]
set -euo pipefail
strata=${1:-build/strata}
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
deck="$src/inputs/gpt-7b-4096.toml"
printf "%8s %12s %10s %10s %10s %12s\n" world mode layouts pruned seconds "max RSS MB"
run() {  # world mode extra-args...
  local world=$1 mode=$2
  shift 2
  /usr/bin/time -f "%e %M" -o "$out/time" "$strata" plan "$deck" --machine h100-80gb --world "$world" --top 10 \
    --output "$out/plan-$world-$mode.h5" "$@" > "$out/log" 2>&1
  read -r secs rss < "$out/time"
  local line
  line=$(grep "pruned by their bound" "$out/log")
  local layouts pruned
  layouts=$(sed -E 's/.* ([0-9]+) layout\(s\).*/\1/' <<< "$line")
  pruned=$(sed -E 's/.* ([0-9]+) pruned by.*/\1/' <<< "$line")
  printf "%8s %12s %10s %10s %10s %12d\n" "$world" "$mode" "$layouts" "$pruned" "$secs" "$((rss / 1024))"
}
for w in ${WORLDS:-512 4096}; do run "$w" pruned; done
if [[ "${EXHAUSTIVE:-0}" == 1 ]]; then
  small=${SMALL:-32}
  run "$small" pruned
  run "$small" exhaustive --exhaustive
  /usr/bin/python3 - "$out/plan-$small-pruned.h5" "$out/plan-$small-exhaustive.h5" <<'PY'
import sys, h5py, numpy as np
def best(path):
    p = h5py.File(path)["points"][:]
    st = np.array([s.decode() for s in p["status"]])
    c = np.where(st == "complete")[0]
    c = c[np.argsort(-p["tokens_per_s"][c], kind="stable")][:10]
    return [(p["overrides"][i], p["tokens_per_s"][i]) for i in c], p
a, _ = best(sys.argv[1])
b, p = best(sys.argv[2])
done = p["step_time"] > 0
r = p["bound"][done] / p["step_time"][done]
print(f"best 10 rows equal: {a == b}; bound / prediction over {done.sum()} predictions: "
      f"min {r.min():.3f} mean {r.mean():.3f} max {r.max():.4f}")
PY
fi

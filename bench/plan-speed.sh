#!/usr/bin/env bash
# How long `strata plan` takes and how much memory it holds, pruned by the
# layouts' bounds, for every shipped deck a planner is asked about (GPT 7B,
# Llama 3 70B and 405B, Mixtral 8x7B) on h100-80gb at 512, 1024 and 4096
# devices (DECKS and WORLDS to change them); with EXHAUSTIVE=1 also every
# layout judged at a small world (default 32) of the first deck, and whether
# both give the same best rows and the bound stays under every prediction.
# A plan still running after LIMIT seconds (default 600) is stopped by
# SIGTERM and its row says so.
#   bash bench/plan-speed.sh [build/strata]
set -euo pipefail
strata=${1:-build/strata}
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
decks=${DECKS:-"gpt-7b-4096.toml llama/llama3-70b.toml llama/llama3-405b.toml llama/mixtral-8x7b.toml"}
printf "%-24s %6s %12s %8s %8s %8s %6s %9s %11s\n" deck world mode layouts judged pruned fit seconds "max RSS MB"
run() {  # deck world mode extra-args...
  local deck=$1 world=$2 mode=$3
  shift 3
  local name
  name=$(basename "$deck" .toml)
  /usr/bin/time -f "%e %M" -o "$out/time" timeout "${LIMIT:-600}" "$strata" plan "$src/inputs/$deck" --machine h100-80gb --world "$world" \
    --top 10 --output "$out/plan-$name-$world-$mode.h5" --force "$@" > "$out/log" 2>&1 || true
  read -r secs rss < <(tail -n 1 "$out/time")
  # The header: "N layout(s): J judged (...), P pruned by their bound | F fit".
  local head
  head=$(grep "^strata plan |" "$out/log" || echo "")
  local layouts judged pruned fit
  layouts=$(sed -E 's/.* ([0-9]+) layout\(s\): .*/\1/' <<< "$head")
  judged=$(sed -E 's/.*: ([0-9]+) judged.*/\1/' <<< "$head")
  pruned=$(sed -E 's/.* ([0-9]+) pruned by their bound.*/\1/' <<< "$head")
  fit=$(sed -E 's/.*\| ([0-9]+) fit$/\1/' <<< "$head")
  grep -q "judged before SIGTERM" <<< "$head" && mode="$mode, stopped"
  printf "%-24s %6s %12s %8s %8s %8s %6s %9s %11d\n" "$name" "$world" "$mode" "$layouts" "$judged" "$pruned" "$fit" \
    "$secs" "$((rss / 1024))"
}
for d in $decks; do
  for w in ${WORLDS:-512 1024 4096}; do run "$d" "$w" pruned; done
done
if [[ "${EXHAUSTIVE:-0}" == 1 ]]; then
  small=${SMALL:-32}
  first=${decks%% *}
  name=$(basename "$first" .toml)
  run "$first" "$small" pruned
  run "$first" "$small" exhaustive --exhaustive
  /usr/bin/python3 - "$out/plan-$name-$small-pruned.h5" "$out/plan-$name-$small-exhaustive.h5" <<'PY'
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

#!/usr/bin/env bash
# Bytes per step of a tp 2 x pp 2 bf16 run of inputs/gpt-3d.toml (sequence
# parallel, 1F1B, dp 1: four ranks), by axis and operation, measured
# (/summary/comm of a real run, divided by its measured steps) beside the
# dry run's estimate (the same step on the meta device), for rank 0 (first
# stage) and rank 2 (last stage). Run it with two builds to set a change
# beside what came before:
#   STRATA=build/strata bench/wire-bytes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/strata}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
set_args=(--set parallel.dp=1 --set 'backend.precision="bf16"')
mpiexec -n 4 "$STRATA" run inputs/gpt-3d.toml "${set_args[@]}" --output "$work/run.h5" > "$work/run.log"
"$STRATA" run inputs/gpt-3d.toml "${set_args[@]}" --dry-run > "$work/estimate.log"
/usr/bin/python3 - "$work" <<'PY'
import re, sys
import h5py
work = sys.argv[1]
est, cls = {}, None
for line in open(f"{work}/estimate.log"):
    m = re.match(r"\s+ranks (\d+)(?:-(\d+))?:$", line)
    if m:
        cls = range(int(m[1]), int(m[2] or m[1]) + 1)
        continue
    m = re.match(r"\s+(\w+)\s+(\w+)\s+\w\s+\d+\s+(\d+) call\(s\)\s+([0-9.]+) (B|KiB|MiB|GiB)$", line)
    if m and cls is not None:
        scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m[5]]
        for r in cls:
            est[(r, m[1], m[2])] = float(m[4]) * scale
    elif not line.startswith(" "):
        cls = None
with h5py.File(f"{work}/run.h5", "r") as f:
    steps = int(f["summary/measured_steps"][()])
    comm = f["summary/comm"][...]
run = {}
for row in comm:
    key = (int(row["rank"]), row["axis"].decode(), row["op"].decode())
    run[key] = run.get(key, 0.0) + float(row["bytes"]) / steps
print(f"{'rank':>4} {'axis':<5}{'op':<16}{'measured B/step':>16}{'estimated B/step':>18}")
total = {}
for key in sorted(set(run) | set(est)):
    if key[0] not in (0, 2):
        continue
    m, e = run.get(key, 0.0), est.get(key, 0.0)
    total[key[0]] = [a + b for a, b in zip(total.get(key[0], [0, 0]), [m, e])]
    print(f"{key[0]:>4} {key[1]:<5}{key[2]:<16}{m:>16.0f}{e:>18.0f}")
for r, (m, e) in total.items():
    print(f"{r:>4} {'all':<21}{m:>16.0f}{e:>18.0f}")
PY

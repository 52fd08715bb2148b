#!/usr/bin/env bash
# End-to-end tests of the `strata` command: a run writes a complete,
# self-describing report; --dry-run, --help and --version; every kind of bad
# input exits with status 2, names what is wrong, and writes nothing.
#
# usage: test_cli.sh STRATA SOURCE_DIR WORK_DIR PYTHON
source "$(dirname "$0")/harness.sh"
tiny_deck tiny.toml

# --- a good run ---
if mpiexec -n 1 "$strata" run tiny.toml --output out/tiny.h5 > run.log 2>&1; then ok "run exits 0"; else bad "run exits 0"; cat run.log; fi
[[ -f out/tiny.h5 && ! -e out/tiny.h5.partial ]] && ok "report published, no partial file" || bad "report published"
grep -q "summary:" run.log && ok "summary printed" || bad "summary printed"
if "$py" "$src/tests/python/check_report.py" out/tiny.h5 --steps 4 --layers 2 > check.log 2>&1; then ok "report schema"; else bad "report schema"; cat check.log; fi
# The console as training logs have it: a line per run.log_every steps,
# counted 1..N, with the means over the steps since the last line, the
# step's memory against the device's, and the wall time at the end.
if "$strata" run tiny.toml --set run.steps=7 --set run.log_every=3 --set 'backend.memory_limit="1MiB"' \
     --output out/console.h5 > console.log 2>&1 \
   && [[ $(grep -cE '^ +[0-9]+/7 ' console.log) == 3 ]] && grep -qE '^ +7/7 ' console.log \
   && grep -q "mem_GiB  mem%" console.log && grep -qE "^wall time .* for 7 step\(s\)$" console.log \
   && "$py" -c "
import h5py, re, sys
s = h5py.File('out/console.h5')['steps']
lines = {int(m.group(1)): m.group(0).split() for m in re.finditer(r'^ +(\d+)/7 .*$', open('console.log').read(), re.M)}
loss, t, warm, mem = s['loss'], s['step_time'], s['warmup'], h5py.File('out/console.h5')['memory']
peak = max(mem['pool_peak_bytes'][(mem['pool'] == b'device') & (mem['step'] < 3)])
want = {3: (loss[0:3].mean(), t[1:3][warm[1:3] == 0].mean()), 6: (loss[3:6].mean(), t[3:6].mean()), 7: (loss[6], t[6])}
for k, (l, ms) in want.items():
    f = lines[k]
    if f[1] != f'{l:.5f}' or f[4] != f'{1e3 * ms:.2f}':
        sys.exit(f'line {k}: {f} against loss {l:.5f}, time {1e3 * ms:.2f} ms')
if lines[3][9] != f'{100 * peak / 2**20:.1f}':
    sys.exit(f'mem% {lines[3][9]} against {100 * peak / 2**20:.1f}')" > console.check 2>&1; then
  ok "console: a line per log_every steps (3/7, 6/7, 7/7) with interval means, memory % of the device, wall time"
else bad "console lines"; cat console.log console.check; fi
# Also without mpiexec (a singleton MPI program) and with --set.
if "$strata" run tiny.toml --set run.steps=2 --set run.name=single > single.log 2>&1 && [[ -f results/single.h5 ]]; then
  ok "singleton run with --set and default output"; else bad "singleton run"; cat single.log; fi

# --- one peak per machine: measured once into the cache, then read back; or a machine description's ---
peak_of() { "$py" -c "import sys,h5py; s=h5py.File(sys.argv[1])['summary']; print(repr(s['peak_flops_per_device'][()]), s['peak_source'][()].decode())" "$1"; }
nopeak=(--set backend.peak_tflops=0 --set run.steps=2)
if STRATA_PEAK_CACHE=$work/peaks mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 "${nopeak[@]}" --output out/peak1.h5 > peak1.log 2>&1 \
   && STRATA_PEAK_CACHE=$work/peaks mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 "${nopeak[@]}" --output out/peak2.h5 > peak2.log 2>&1 \
   && [[ $(ls peaks | wc -l) == 1 ]] \
   && peak_of out/peak1.h5 | grep -q "measured: sgemm 1024^3, best of 5, 1 thread(s), measured .* (cached to $work/peaks/" \
   && peak_of out/peak2.h5 | grep -q "cached: $work/peaks/" \
   && [[ $(peak_of out/peak1.h5 | cut -d' ' -f1) == $(peak_of out/peak2.h5 | cut -d' ' -f1) ]]
then ok "peak measured once per host, cached, the same figure on the next run"
else bad "peak cache"; cat peak1.log peak2.log; ls -l peaks; peak_of out/peak1.h5; peak_of out/peak2.h5; fi
# A 16-bit run on the CPU with oneDNN's bf16 matmul (AVX512-BF16) has that
# GEMM's peak, cached apart from fp32's; where its products are widened to
# sgemm, the peak is fp32's, the same figure, and says why (one figure per
# precision the hardware has: MFU does not move with the conversion).
if STRATA_PEAK_CACHE=$work/peaks "$strata" run tiny.toml "${nopeak[@]}" --set 'backend.precision="bf16"' --output out/peakbf16.h5 > peakbf16.log 2>&1 \
   && { { [[ $(ls peaks | wc -l) == 2 ]] && peak_of out/peakbf16.h5 | grep -qE "measured: oneDNN bf16 matmul 1024\^3, best of 5"; } \
        || { [[ $(ls peaks | wc -l) == 1 ]] && peak_of out/peakbf16.h5 | grep -q "cached: .*: its peak is fp32's$" \
             && [[ $(peak_of out/peakbf16.h5 | cut -d' ' -f1) == $(peak_of out/peak1.h5 | cut -d' ' -f1) ]]; }; }
then ok "a bf16 peak on the CPU is its GEMM's, or fp32's where widened"; else bad "bf16 peak"; cat peakbf16.log; peak_of out/peakbf16.h5; fi
if "$strata" run tiny.toml "${nopeak[@]}" --set backend.machine=\"a100-80gb\" --output out/peak3.h5 > peak3.log 2>&1 \
   && peak_of out/peak3.h5 | grep -q "^19500000000000.0 machine a100-80gb (.*a100-80gb.toml): device.peak_tflops_fp32$"
then ok "backend.machine gives MFU's peak"; else bad "backend.machine peak"; cat peak3.log; peak_of out/peak3.h5; fi

# --- two ranks, data parallel with ZeRO stage 2: every rank writes its own rows ---
if mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --set parallel.zero=2 --output out/dp2.h5 > dp2.log 2>&1 \
   && grep -q "reduce_scatter" dp2.log && grep -q "memory per rank" dp2.log; then ok "2-rank ZeRO-2 run prints memory per rank and comm"
else bad "2-rank ZeRO-2 run"; cat dp2.log; fi
if "$py" "$src/tests/python/check_report.py" out/dp2.h5 --steps 4 --layers 2 --world 2 > check2.log 2>&1; then ok "2-rank report"; else bad "2-rank report"; cat check2.log; fi
if mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --dry-run > dry2.log 2>&1 && grep -q "dp{0,1}" dry2.log; then
  ok "dry run prints the process mesh"; else bad "dry run mesh"; cat dry2.log; fi

# --- two pipeline stages (1F1B): the report has every rank's rows and its bubble ---
if mpiexec -n 2 "$strata" run tiny.toml --set parallel.pp=2 --set data.micro_batch=1 --output out/pp2.h5 > pp2.log 2>&1 \
   && grep -q "pipeline bubble" pp2.log \
   && "$py" "$src/tests/python/check_report.py" out/pp2.h5 --steps 4 --layers 2 --world 2 > checkpp.log 2>&1; then
  ok "2-stage pipeline run and report"; else bad "2-stage pipeline"; cat pp2.log checkpp.log; fi
# --- the interleaved and ZB-V (two chunks per rank) and zero-bubble schedules, with ZeRO-1 ---
for sched in interleaved zb-h1 zb-v; do
  v=1; [[ $sched == interleaved || $sched == zb-v ]] && v=2
  if mpiexec -n 2 "$strata" run tiny.toml --set parallel.pp=2 --set parallel.schedule=\"$sched\" \
       --set parallel.virtual_stages=$v --set parallel.zero=1 --set model.layers=4 --set data.micro_batch=1 \
       --output out/pp2-$sched.h5 > pp2-$sched.log 2>&1 \
     && grep -q "pipeline bubble ($sched" pp2-$sched.log \
     && "$py" "$src/tests/python/check_report.py" out/pp2-$sched.h5 --steps 4 --layers 4 --world 2 > checkpp.log 2>&1
  then ok "2-stage $sched pipeline run and report"; else bad "2-stage $sched pipeline"; cat pp2-$sched.log checkpp.log; fi
done

# --- optimizer offload to the host: the same losses, the optimizer state in the host arena ---
if mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --set parallel.zero=2 --output out/zero2.h5 > off0.log 2>&1 \
   && mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --set parallel.zero=2 --set parallel.offload=\"host\" \
        --output out/offload.h5 > off1.log 2>&1 \
   && "$py" "$src/tests/python/check_report.py" out/offload.h5 --steps 4 --layers 2 --world 2 >> off1.log 2>&1 \
   && "$py" -c "import sys,h5py; a,b=(h5py.File(p)['steps'][...] for p in sys.argv[1:]); assert (a['loss']==b['loss']).all() and (b['offload_bytes_to_host']>0).all()" out/zero2.h5 out/offload.h5 >> off1.log 2>&1
then ok "offload to host: same losses, optimizer state on the host"; else bad "offload to host"; cat off0.log off1.log; fi

# --- every deck in inputs/ resolves and is estimated, in one process whatever its world size ---
for deck in "$src"/inputs/*.toml "$src"/inputs/llama/*.toml; do
  if "$strata" run "$deck" --dry-run > deck.log 2>&1 && grep -q "parameters:" deck.log && grep -q "memory estimate" deck.log
  then ok "deck $(basename "$deck") estimated in one process"; else bad "deck $(basename "$deck")"; cat deck.log; fi
done

# --- checkpoint and resume: bit for bit, atomic ---
ck() { OMP_NUM_THREADS=1 mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --set run.steps=6 "$@"; }
same_losses() {  # two reports: every step of the second has the first's loss and grad norm, exactly
  "$py" - "$1" "$2" <<'PY'
import sys, h5py
a, b = (h5py.File(p, "r")["steps"][...] for p in sys.argv[1:3])
want = {(int(r["rank"]), int(r["step"])): (r["loss"], r["grad_norm"]) for r in a}
got = {(int(r["rank"]), int(r["step"])): (r["loss"], r["grad_norm"]) for r in b}
assert got and all(want[k] == v for k, v in got.items()), (got, want)
assert min(s for _, s in got) == int(h5py.File(sys.argv[2], "r").attrs["resumed_at_step"])
PY
}
ck --checkpoint-every 2 --checkpoint-dir ck1 --output out/ck-whole.h5 > ck1.log 2>&1 || { bad "checkpointed run"; cat ck1.log; }
[[ -f ck1/step-000006/manifest.toml && -f ck1/step-000002/rank-00001.bin ]] && ok "checkpoints written per step and rank" || bad "checkpoints written"
STRATA_INJECT_FAILURE=0:3 ck --checkpoint-every 2 --checkpoint-dir ck2 --output out/ck-failed.h5 > ck2.log 2>&1
[[ $? -ne 0 && -d ck2/step-000002 && ! -e ck2/step-000004 ]] && ok "a failed run keeps its last checkpoint" || { bad "failed run's checkpoint"; cat ck2.log; }
if ck --resume ck2 --checkpoint-every 2 --checkpoint-dir ck2 --output out/ck-resumed.h5 > ck3.log 2>&1 \
   && grep -q "resumed from ck2/step-000002" ck3.log && same_losses out/ck-whole.h5 out/ck-resumed.h5 >> ck3.log 2>&1
then ok "resume after a failure equals the uninterrupted run bit for bit"; else bad "resume after a failure"; cat ck3.log; fi
# Another world: the 2-rank checkpoint of step 2 continued on one rank with ZeRO off, re-sharded by parameter name.
if OMP_NUM_THREADS=1 "$strata" run tiny.toml --set run.steps=6 --resume ck1/step-000002 --output out/ck-one.h5 > ck6.log 2>&1 \
   && grep -q "re-sharded from 2 rank(s)" ck6.log && "$py" - out/ck-whole.h5 out/ck-one.h5 >> ck6.log 2>&1 <<'PY'
import sys, h5py
a, b = (h5py.File(p, "r")["steps"][...] for p in sys.argv[1:3])
want = {int(r["step"]): r["loss"] for r in a if r["rank"] == 0}
got = {int(r["step"]): r["loss"] for r in b}
assert sorted(got) == [2, 3, 4, 5] and all(abs(got[k] - want[k]) <= 1e-5 * abs(want[k]) for k in got), (got, want)
PY
then ok "resume on another world re-shards (losses within 1e-5)"; else bad "resume re-sharded"; cat ck6.log; fi
# fp16 with a loss scale that overflows at step 1 and again after it doubles (step 4): the checkpoint of
# step 2 carries the halved scale and the skipped step, so the resumed run skips step 4 too, bit for bit.
fp16=(--set 'backend.precision="fp16"' --set backend.loss_scale=262144 --set backend.loss_scale_window=2 --set parallel.zero=2)
if ck "${fp16[@]}" --checkpoint-every 2 --checkpoint-dir ck7 --output out/ck-fp16.h5 > ck7.log 2>&1 \
   && grep -q "skipped_steps = 1" ck7/step-000002/manifest.toml \
   && ck "${fp16[@]}" --resume ck7/step-000002 --output out/ck-fp16-resumed.h5 > ck8.log 2>&1 \
   && "$py" - out/ck-fp16.h5 out/ck-fp16-resumed.h5 >> ck8.log 2>&1 <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r")["steps"][...] for p in sys.argv[1:3])
key = lambda r: (int(r["rank"]), int(r["step"]))
want = {key(r): r for r in a}
for r in b:
    w = want[key(r)]
    assert r["loss"] == w["loss"] and r["skipped"] == w["skipped"] and r["loss_scale"] == w["loss_scale"], (r, w)
    assert r["grad_norm"] == w["grad_norm"] or (np.isnan(r["grad_norm"]) and np.isnan(w["grad_norm"])), (r, w)
assert sorted({int(r["step"]) for r in b if r["skipped"]}) == [4], b
PY
then ok "fp16 resume carries the loss scaler: skips and losses bit for bit"; else bad "fp16 resume"; cat ck7.log ck8.log; fi
# Killed (SIGKILL) while writing step 4's checkpoint: step 2's stays whole, step 4's is never published.
STRATA_INJECT_CHECKPOINT_KILL=4 ck --checkpoint-every 2 --checkpoint-dir ck4 --output out/ck-killed.h5 > ck4.log 2>&1
rc=$?
if [[ $rc -ne 0 && -f ck4/step-000002/manifest.toml && ! -e ck4/step-000004 && -d ck4/.step-000004.partial ]] \
   && ck --resume ck4 --output out/ck-after-kill.h5 > ck5.log 2>&1 && grep -q "ck4/step-000002" ck5.log \
   && same_losses out/ck-whole.h5 out/ck-after-kill.h5 >> ck5.log 2>&1
then ok "a run killed mid-checkpoint resumes from the previous one"; else bad "kill mid-checkpoint (rc $rc)"; ls -a ck4; cat ck4.log ck5.log; fi
# run.keep_checkpoints: the latest N stay; a later step (another run's) is left.
mkdir -p ck9/step-000099
if ck --set run.steps=10 --set run.keep_checkpoints=2 --checkpoint-every 2 --checkpoint-dir ck9 --output out/ck-keep.h5 \
     > ck9.log 2>&1 && [[ "$(LC_ALL=C ls ck9 | tr '\n' ' ')" == "step-000008 step-000010 step-000099 " ]]; then
  ok "run.keep_checkpoints = 2 keeps the latest two, and leaves a later step"
else bad "keep_checkpoints"; ls -a ck9; cat ck9.log; fi

# --- no report is replaced silently ---
# Without --output, a taken name gives the next free one, and says so (a
# resumed run's report too: the first run's steps stay where they were);
# --output naming a file is refused (exit 2, the file untouched) unless
# --force; plan and simulate follow the same rule.
rm -rf keep && mkdir keep && (
  cd keep && ln -s ../tiny.toml tiny.toml && ln -s "$src/inputs" inputs
  "$strata" run tiny.toml --checkpoint-every 2 > k1.log 2>&1 \
    && "$strata" run tiny.toml --set run.steps=6 --resume checkpoints/tiny > k2.log 2>&1 \
    && grep -q "^results/tiny.h5 exists: this report goes to results/tiny-2.h5" k2.log \
    && "$strata" run tiny.toml > k3.log 2>&1 && grep -q "^report: results/tiny-3.h5" k3.log \
    && "$py" -c "import h5py,sys; a=h5py.File('results/tiny.h5'); b=h5py.File('results/tiny-2.h5'); sys.exit(0 if len(set(a['steps']['step'])) == 4 and b.attrs['resumed_at_step'] == 4 and set(b['steps']['step']) == {4, 5} else 1)" \
    || exit 1
  sum=$(md5sum results/tiny.h5)
  "$strata" run tiny.toml --output results/tiny.h5 > k4.log 2>&1
  [[ $? == 2 ]] && grep -q "report path results/tiny.h5: a file is there, and an earlier report is never replaced silently: --force replaces it" k4.log \
    && [[ "$(md5sum results/tiny.h5)" == "$sum" ]] || exit 1
  "$strata" run tiny.toml --output results/tiny.h5 --force > k5.log 2>&1 && [[ "$(md5sum results/tiny.h5)" != "$sum" ]] || exit 1
  "$strata" plan tiny.toml --machine a100-80gb --world 2 > k6.log 2>&1 && "$strata" plan tiny.toml --machine a100-80gb --world 4 > k7.log 2>&1 \
    && grep -q "^report: results/tiny-plan-2.h5\|results/tiny-plan-2.h5" k7.log && [[ -f results/tiny-plan.h5 ]] || exit 1
  "$strata" simulate tiny.toml --machine a100-80gb --output results/tiny-plan.h5 > k8.log 2>&1
  [[ $? == 2 ]] && grep -q "a file is there" k8.log || exit 1
  LC_ALL=C ls results | tr '\n' ' ' > ../keep.ls
) > keep.log 2>&1 && [[ "$(cat keep.ls)" == "tiny-2.h5 tiny-3.h5 tiny-plan-2.h5 tiny-plan.h5 tiny.h5 " ]]
if [[ $? == 0 ]]; then ok "no run, resume, plan or simulate replaces a report silently (a new name, or --force)"
else bad "reports replaced"; cat keep.log keep.ls keep/k*.log; fi
# --- dry run, help, version ---
if "$strata" run tiny.toml --dry-run > dry.log 2>&1 && grep -q "parameters:" dry.log \
   && grep -q "optimizer" dry.log && [[ ! -e results/tiny.h5 ]]; then ok "dry run prints the estimate, writes nothing"; else bad "dry run"; cat dry.log; fi
# With --output, the estimate is a report (status "estimate") whose /memory
# rows are the 2-rank ZeRO-2 run's above, rank by rank, every step: each
# rank's are those of its class (/rank_classes), every rank in one class.
if "$strata" run tiny.toml --set parallel.dp=2 --set parallel.zero=2 --dry-run --output out/dry.h5 > dry.log 2>&1 \
   && "$py" - out/dry.h5 out/dp2.h5 >> dry.log 2>&1 <<'PY'
import sys, h5py
est, run = (h5py.File(p, "r") for p in sys.argv[1:3])
assert est.attrs["status"] == b"estimate" or est.attrs["status"] == "estimate", est.attrs["status"]
assert int(est.attrs["world_size"]) == 2
assert est.attrs["rank_rows"] in ("classes", b"classes")
cls = {}
for c in est["rank_classes"][...]:
    for r in range(int(c["first"]), int(c["last"]) + 1):
        assert r not in cls, f"rank {r} in two classes"
        cls[r] = int(c["rank"])
assert sorted(cls) == [0, 1], cls
key = lambda r: (int(r["rank"]), r["pool"], r["category"])
want = {key(r): (int(r["current_bytes"]), int(r["peak_bytes"]), int(r["pool_peak_bytes"])) for r in est["memory"][...]}
got = run["memory"][...]
assert len(want) == len(set(cls.values())) * 6 and len(got) == 4 * 2 * 6, (len(want), len(got))
for r in got:
    k = (cls[int(r["rank"])], r["pool"], r["category"])
    assert want[k] == (int(r["current_bytes"]), int(r["peak_bytes"]), int(r["pool_peak_bytes"])), (r, want[k])
PY
then ok "dry run --output: an estimate report equal to the run's /memory"; else bad "dry run --output"; cat dry.log; fi
"$strata" run tiny.toml --dry-run --set backend.memory_limit=64KiB > dry3.log 2>&1
rc=$?
[[ $rc -eq 3 ]] && grep -q "DOES NOT FIT" dry3.log && ok "dry run of a layout that does not fit exits 3" \
  || { bad "dry run that does not fit (rc $rc)"; cat dry3.log; }
# The host arena's limit too: the dry run says it does not fit (it failed
# at the first request past it, naming the device's limit), and a run that
# exceeds it names backend.host_memory_limit.
hostlimit=(--set 'parallel.offload="host"' --set parallel.dp=2 --set parallel.zero=1 --set backend.host_memory_limit=16KiB)
"$strata" run tiny.toml --dry-run "${hostlimit[@]}" > dry4.log 2>&1
rc=$?
mpiexec -n 2 "$strata" run tiny.toml "${hostlimit[@]}" --output out_host/x.h5 > host4.log 2>&1
if [[ $rc -eq 3 ]] && grep -q "^DOES NOT FIT: ranks 0-1: host peak .* exceeds backend.host_memory_limit = 16.00 KiB" dry4.log \
   && grep -q "limit (backend.host_memory_limit) is in use" host4.log; then
  ok "a host arena that does not fit: the dry run exits 3, the run names backend.host_memory_limit"
else bad "host limit (rc $rc)"; cat dry4.log host4.log; fi
"$strata" --help > help.log 2>&1 && grep -q "run" help.log && ok "--help" || bad "--help"
"$strata" --version > version.log 2>&1 && grep -q "strata" version.log && ok "--version" || bad "--version"

# --- bad input: exit 2, message names the problem, nothing written ---
expect_input_error() {  # name, expected substring, then the command
  local name=$1 want=$2; shift 2
  rm -rf out_bad
  "$@" > bad.log 2>&1
  local rc=$?
  if [[ $rc -eq 2 ]] && grep -qF -- "$want" bad.log && [[ ! -e out_bad ]]; then ok "bad input: $name"
  else bad "bad input: $name (rc $rc, want '$want')"; cat bad.log; fi
}
deck_with() {  # file, sed expression
  sed "$2" tiny.toml > "$1"
}

# --- prediction: simulate any layout on a described machine, in one process ---
if "$strata" simulate tiny.toml --machine a100-80gb --set parallel.pp=2 --set parallel.dp=2 --set data.micro_batch=1 --output out/sim.h5 > sim.log 2>&1 \
   && grep -q "predicted step" sim.log \
   && "$py" "$src/tests/python/check_report.py" out/sim.h5 --steps 1 --layers 2 --world 4 > checksim.log 2>&1 \
   && "$py" -c "import h5py,sys; f=h5py.File('out/sim.h5'); m=f.attrs['machine']; m=m.decode() if isinstance(m,bytes) else m; sys.exit(0 if f.attrs['simulated']==1 and m=='a100-80gb' else 1)"; then
  ok "simulate: a 4-rank layout's report, marked simulated"; else bad "simulate"; cat sim.log checksim.log; fi
# It explains its step: per stage, compute by phase adds up to the stage's
# compute, each op's exposed time to the stage's exposed communication, and
# the largest causes come largest first.
if "$py" - sim.log > simexplain.log 2>&1 <<'PY'
import re, sys
log = open(sys.argv[1]).read()
table = {int(m[0]): (float(m[1]), float(m[2])) for m in
         re.findall(r"^ +(\d+) +\d+ +([\d.]+) +([\d.]+) +[\d.]+ +[\d.]+ ", log, re.M)}
stages = re.split(r"^  stage (?=\d+ \()", log, flags=re.M)[1:]
assert len(stages) == len(table) == 2, (table, len(stages))
for block in stages:
    s = int(block.split()[0])
    head = block.splitlines()[0]
    phases = [float(x) for x in re.findall(r"(?:forward|backward|optimizer) ([\d.]+)", head)]
    assert abs(sum(phases) - 1e3 * table[s][0]) < 0.06 + 0.005 * len(phases), (head, table[s])
    exposed = float(re.search(r"exposed comm ([\d.]+) ms", head).group(1))
    ops = [float(x) for x in re.findall(r"exposed +([\d.]+) ms \(waiting", block)]
    assert ops and abs(sum(ops) - exposed) < 0.005 * (len(ops) + 1), (ops, exposed)
    assert abs(exposed - 1e3 * table[s][1]) < 0.06, (exposed, table[s])
causes = [float(x) for x in re.findall(r"\d\. [a-z]+ [a-z_]+ on stage \d: ([\d.]+) ms", log)]
assert len(causes) == 3 and causes == sorted(causes, reverse=True), causes
PY
then ok "simulate: per stage, phases and ops add up to the stage's figures; causes largest first"
else bad "simulate explains its step"; cat sim.log simexplain.log; fi
if "$strata" simulate tiny.toml --machine h100-80gb --set 'backend.device="cuda"' --set backend.precision='"bf16"' \
     --output out/simcuda.h5 > simcuda.log 2>&1 && grep -q "bf16" simcuda.log; then
  ok "simulate: a CUDA deck on a CPU-only machine"; else bad "simulate a CUDA deck"; cat simcuda.log; fi
if "$strata" simulate "$src/inputs/gpt-7b-4096.toml" --machine h200 --output out/sim4096.h5 > sim4096.log 2>&1 \
   && grep -q "4096 rank(s)" sim4096.log; then ok "simulate: 4096 ranks in one process"; else bad "simulate 4096"; cat sim4096.log; fi
# A layout that does not fit says so last, exits 3 as the dry run does, and
# its report carries the capacity and the verdict; one that fits says so too.
"$strata" simulate tiny.toml --machine a100-80gb --set backend.memory_limit=64KiB --output out/simbig.h5 > simbig.log 2>&1
rc=$?
if [[ $rc == 3 ]] && tail -n 1 simbig.log | grep -q "^DOES NOT FIT: ranks 0: device peak .* exceeds backend.memory_limit = 64.00 KiB$" \
   && "$py" -c "import h5py,sys; f=h5py.File('out/simbig.h5'); sys.exit(0 if f.attrs['fits']==0 and f.attrs['memory_capacity']==65536 else 1)" \
   && tail -n 1 sim4096.log | grep -qE "^fits: every rank's device peak is within [0-9.]+ GiB per device$" \
   && "$py" -c "import h5py,sys; f=h5py.File('out/sim4096.h5'); sys.exit(0 if f.attrs['fits']==1 else 1)"; then
  ok "simulate: a layout that does not fit says so last, exits 3, and its report says so"
else bad "simulate: does not fit (rc $rc)"; tail -n 3 simbig.log sim4096.log; fi
# It says how far its repeats spread, and each doubt in the file too.
if mpiexec -n 2 "$strata" calibrate --quick --output out/here.toml > calib.log 2>&1 \
   && grep -qE "^  repeats: [0-9]+ measurement\(s\), the widest spread [0-9]+%" calib.log \
   && [[ $(grep -c "^  NOT TO BE TRUSTED: " calib.log) == $(grep -c "^# NOT TO BE TRUSTED: " out/here.toml) ]] \
   && "$strata" simulate tiny.toml --machine out/here.toml --set parallel.dp=2 --output out/simhere.h5 > simhere.log 2>&1; then
  ok "calibrate --quick writes a machine description simulate reads, with its doubts"; else bad "calibrate"; cat calib.log simhere.log; fi
if "$strata" plan tiny.toml --machine a100-80gb --world 4 --top 3 --output out/plan.h5 > plan.log 2>&1 \
   && grep -q "rank     tokens/s" plan.log \
   && "$py" - <<'PY' > plancheck.log 2>&1
import h5py, numpy as np
f = h5py.File("out/plan.h5")
assert f.attrs["schema"] in (b"strata-plan", "strata-plan"), f.attrs["schema"]
p = f["points"][:]
st = np.array([s.decode() for s in p["status"]])
limit = float(f.attrs["memory_limit"])
assert (st == "complete").sum() > 0 and (st == "skipped").sum() > 0, st
assert np.all(p["peak_bytes"][st == "complete"] <= limit)
assert np.all(p["tokens_per_s"][st == "complete"] > 0)
assert all(len(r) > 0 for r in p["reason"][st == "skipped"])
for o in p["overrides"]:  # every candidate uses the 4 devices
    kv = dict(x.split("=") for x in o.decode().split())
    assert int(kv["parallel.dp"]) * int(kv["parallel.cp"]) * int(kv["parallel.tp"]) * int(kv["parallel.pp"]) == 4, o
assert any(b"parallel.cp=2" in o for o in p["overrides"]), "context parallelism is searched"
PY
then ok "plan: every layout of 4 devices, the fitting ones ranked"; else bad "plan"; cat plan.log plancheck.log; fi
# One process or several judging the layouts: the same table, row for row.
if "$strata" plan tiny.toml --machine a100-80gb --world 4 --top 3 --jobs 1 --output out/plan1.h5 > plan1.log 2>&1 \
   && "$strata" plan tiny.toml --machine a100-80gb --world 4 --top 3 --jobs 3 --output out/plan3.h5 > plan3.log 2>&1 \
   && "$py" - <<'PY' > planjobs.log 2>&1
import h5py, numpy as np
a, b = h5py.File("out/plan1.h5")["points"][:], h5py.File("out/plan3.h5")["points"][:]
assert len(a) == len(b) > 0, (len(a), len(b))
for n in a.dtype.names:
    if n != "final_loss":
        assert np.array_equal(a[n], b[n]), n
PY
then ok "plan: one process and three give the same table"; else bad "plan --jobs"; cat plan1.log plan3.log planjobs.log; fi
# Pruned by the bound or judged in full: the same table of the best, and
# the bound under every prediction (tiny.toml's layouts on 8 devices, 4
# micro-batches a step so that pipelines have some).
if "$strata" plan tiny.toml --machine a100-80gb --world 8 --top 3 --set data.global_batch=32 --exhaustive \
     --output out/planall.h5 > planall.log 2>&1 \
   && "$strata" plan tiny.toml --machine a100-80gb --world 8 --top 3 --set data.global_batch=32 \
     --output out/planbest.h5 > planbest.log 2>&1 \
   && "$py" - <<'PY' > planbound.log 2>&1
import h5py, numpy as np
def table(path):
    f = h5py.File(path)
    p = f["points"][:]
    st = np.array([s.decode() for s in p["status"]])
    done = np.where(st == "complete")[0]
    best = done[np.argsort(-p["tokens_per_s"][done], kind="stable")][:3]
    return f, p, st, [(p["overrides"][i], p["tokens_per_s"][i]) for i in best]
fa, a, sa, best_a = table("out/planall.h5")
fb, b, sb, best_b = table("out/planbest.h5")
assert len(best_a) == 3 and best_a == best_b, (best_a, best_b)
predicted = a["step_time"] > 0
assert predicted.sum() > 100, predicted.sum()
assert np.all(a["bound"][predicted] > 0), "every layout is bounded"
over = a["bound"][predicted] / a["step_time"][predicted]
assert over.max() <= 1.0, [(o, x) for o, x in zip(a["overrides"][predicted], over) if x > 1]
assert fa.attrs["layouts_pruned"] == 0 and fb.attrs["layouts_pruned"] > 0, (fa.attrs["layouts_pruned"], fb.attrs["layouts_pruned"])
third = best_b[-1][1]
pruned = np.array(["cannot win" in r.decode() for r in b["reason"]])
assert pruned.sum() == fb.attrs["layouts_pruned"]
# A pruned layout's bound is slower than the table's last row.
steps = b["step_time"][sb == "complete"]
assert np.all(b["bound"][pruned] > np.sort(steps)[2]), "pruned only beyond the third best"
print("bound/prediction", over.min(), over.mean(), over.max(), "pruned", pruned.sum(), "of", fb.attrs["layouts"])
PY
then ok "plan: the bound never exceeds a prediction; pruning keeps the best"; else bad "plan bound"; cat planall.log planbest.log planbound.log; fi
# One count of layouts: the header, the last progress line and the report
# agree on those judged and pruned, and the candidates are the rows judged.
if "$strata" plan "$src/inputs/gpt-7b-4096.toml" --machine h100-80gb --world 32 --output out/plancount.h5 \
     > plancount.log 2> plancount.err \
   && "$py" - <<'PY' > plancountcheck.log 2>&1
import re, h5py
head = re.search(r"(\d+) layout\(s\): (\d+) judged \((\d+) candidate\(s\).*\), (\d+) pruned by their bound",
                 open("plancount.log").read())
layouts, judged, candidates, pruned = map(int, head.groups())
last = open("plancount.err").read().strip().splitlines()[-1]
m = re.match(r"strata plan: (\d+)/(\d+) layouts judged, (\d+) pruned, ", last)
assert m and tuple(map(int, m.groups())) == (judged, layouts, pruned), (last, head.groups())
f = h5py.File("out/plancount.h5")
assert (f.attrs["layouts"], f.attrs["layouts_judged"], f.attrs["layouts_pruned"]) == (layouts, judged, pruned)
assert judged + pruned == layouts and pruned > judged > 0, (judged, pruned, layouts)
assert len(f["points"]) == candidates + pruned, (len(f["points"]), candidates, pruned)
PY
then ok "plan: header, progress and report count the same layouts judged and pruned"
else bad "plan counts"; cat plancount.log plancount.err plancountcheck.log; fi
# Stopped by SIGTERM: what was judged is written, the report says it was
# interrupted, the exit status is 143 and no worker is left running. (8
# devices: the bounds take a second here and a minute in the sanitized
# build, and judging every layout takes long enough to be stopped.)
"$strata" plan "$src/inputs/gpt-7b-4096.toml" --machine h100-80gb --world 8 --jobs 2 --exhaustive \
  --output out/planstop.h5 > planstop.log 2> planstop.err &
planpid=$!
for _ in $(seq 1 240); do grep -q "layouts judged" planstop.err 2>/dev/null && break; sleep 0.5; done
kill -TERM "$planpid"
wait "$planpid"
rc=$?
sleep 1
if [[ $rc -eq 143 ]] && ! pgrep -f "out/planstop.h5" > /dev/null && grep -q "judged before SIGTERM" planstop.log \
   && "$py" - <<'PY' > planstopcheck.log 2>&1
import h5py
f = h5py.File("out/planstop.h5")
a = dict(f.attrs)
status = a["status"].decode() if isinstance(a["status"], bytes) else a["status"]
by = a["interrupted_by"].decode() if isinstance(a["interrupted_by"], bytes) else a["interrupted_by"]
assert status == "interrupted" and by == "SIGTERM", (status, by)
assert 0 < a["layouts_judged"] < a["layouts"], (a["layouts_judged"], a["layouts"])
assert len(f["points"]) >= a["layouts_judged"]
PY
then ok "plan: SIGTERM writes what was judged, exit 143"; else bad "plan stop (rc $rc)"; cat planstop.log planstop.err planstopcheck.log; fi
# Context parallelism on 2 ranks: each sequence split in two, the ring's
# exchanges on the cp axis; the dry run prints the cp groups.
if mpiexec -n 2 "$strata" run tiny.toml --set run.steps=2 --set parallel.cp=2 --output out/cp.h5 > cp.log 2>&1 \
   && "$strata" run tiny.toml --dry-run --set parallel.cp=2 > cpdry.log 2>&1 && grep -q "cp group" cpdry.log \
   && "$strata" simulate tiny.toml --machine h100-80gb --set parallel.cp=2 --output out/simcp.h5 > simcp.log 2>&1 \
   && "$py" - <<'PY' > cpcheck.log 2>&1
import h5py, numpy as np
for path in ("out/cp.h5", "out/simcp.h5"):
    f = h5py.File(path)
    c = f["comm"][:]
    ring = c[c["axis"] == b"cp"]
    assert len(ring) > 0 and set(ring["op"]) <= {b"send", b"recv"}, (path, set(ring["op"]))
    assert "cp 2" in f["summary"]["layout"][()].decode(), f["summary"]["layout"][()]
PY
then ok "context parallelism: a 2-rank run and its simulation over the cp ring"; else bad "context parallelism run"; cat cp.log cpdry.log simcp.log cpcheck.log; fi
# Hybrid sharding on 4 ranks: ZeRO-3 over two groups of two, each shard's
# gradients all-reduced over its replica pair; the dry run names the groups.
if mpiexec -n 4 "$strata" run tiny.toml --set run.steps=2 --set data.micro_batch=1 --set parallel.dp=4 \
     --set parallel.zero=3 --set parallel.dp_shard=2 --output out/hsdp.h5 > hsdp.log 2>&1 \
   && "$strata" run tiny.toml --dry-run --set parallel.dp=4 --set data.micro_batch=1 --set parallel.zero=3 \
     --set parallel.dp_shard=2 > hsdpdry.log 2>&1 && grep -q "replica group" hsdpdry.log \
   && "$py" - <<'PY' > hsdpcheck.log 2>&1
import h5py, numpy as np
f = h5py.File("out/hsdp.h5")
c = f["comm"][:]
axes = {a.decode() for a in c["axis"]}
assert {"dp_shard", "dp_replica"} <= axes, axes
rs = c[(c["axis"] == b"dp_shard") & (c["op"] == b"reduce_scatter")]
ar = c[(c["axis"] == b"dp_replica") & (c["op"] == b"all_reduce")]
assert len(rs) > 0 and len(ar) > 0 and np.all(rs["group_size"] == 2) and np.all(ar["group_size"] == 2)
assert "exposed_comm_dp_replica" in f["steps"].dtype.names
PY
then ok "hybrid sharding: a 4-rank run over shard and replica groups"; else bad "hybrid sharding run"; cat hsdp.log hsdpdry.log hsdpcheck.log; fi
# Two devices per node: four data-parallel ranks span two nodes, so ZeRO may
# shard over each node's pair and replicate across the nodes.
sed 's/^devices_per_node = .*/devices_per_node = 2/' "$src/inputs/machines/a100-80gb.toml" > twopernode.toml
if "$strata" plan tiny.toml --machine twopernode.toml --world 4 --output out/planhsdp.h5 > planhsdp.log 2>&1 \
   && "$py" - <<'PY' > planhsdpcheck.log 2>&1
import h5py, numpy as np
p = h5py.File("out/planhsdp.h5")["points"][:]
hybrid = [r for r in p if b"parallel.dp_shard=2" in r["overrides"]]
assert hybrid and all(b"parallel.dp=4" in r["overrides"] and b"parallel.zero=0" not in r["overrides"] for r in hybrid)
assert any(r["status"] == b"complete" and r["tokens_per_s"] > 0 for r in hybrid)
PY
then ok "plan: hybrid sharding over each node's dp ranks is a candidate"; else bad "plan hybrid"; cat planhsdp.log planhsdpcheck.log; fi
if "$py" "$src/analysis/strata-report" out/plan.h5 --plots out/planplots > planreport.log 2>&1 \
   && grep -q "plan on machine a100-80gb" planreport.log && [[ -s out/planplots/sweep.png ]]; then
  ok "strata-report ranks a plan and plots it against memory"; else bad "plan report"; cat planreport.log; fi
"$strata" plan tiny.toml --machine a100-80gb --world 2 --memory-limit 1KiB --output out/plannone.h5 > plannone.log 2>&1
rc=$?
if [[ $rc -eq 3 ]] && grep -q "no layout fits" plannone.log; then ok "plan: nothing fits, exit 3"; else bad "plan nothing fits (rc $rc)"; cat plannone.log; fi
expect_input_error "plan without devices" "--world 0" "$strata" plan tiny.toml --machine a100-80gb --world 0 --output out_bad/x.h5
expect_input_error "plan bad memory limit" "--memory-limit 12 apples" "$strata" plan tiny.toml --machine a100-80gb --world 2 --memory-limit "12 apples" --output out_bad/x.h5
# Outputs that are not files: a FIFO (never /dev/null here: a regression
# would replace it) is refused by every writer before any work, and stays a
# FIFO; claims and files being written are never outputs.
mkfifo fifo.out
expect_input_error "run into a FIFO" "not a regular file" "$strata" run tiny.toml --output fifo.out
expect_input_error "simulate into a FIFO" "not a regular file" "$strata" simulate tiny.toml --machine a100-80gb --output fifo.out
expect_input_error "plan into a FIFO" "not a regular file" "$strata" plan tiny.toml --machine a100-80gb --world 2 --output fifo.out
expect_input_error "calibrate into a FIFO" "not a regular file" mpiexec -n 2 "$strata" calibrate --quick --output fifo.out
if [[ -p fifo.out ]]; then ok "a FIFO given as output stays a FIFO"; else bad "the FIFO was replaced"; fi
expect_input_error "output named as a claim" 'ends in ".lock"' "$strata" run tiny.toml --output out_bad/A.h5.lock
expect_input_error "output named as a partial file" 'ends in ".partial"' "$strata" run tiny.toml --output out_bad/A.h5.partial
mkdir -p out && printf '\x89HDF\r\n' > out/notaclaim.h5.lock
expect_input_error "a malformed claim" "is not a run's claim" "$strata" run tiny.toml --output out/notaclaim.h5
# Numbers that are not finite, in a machine description; worlds past the bound.
sed 's/^latency_us = 8 .*/latency_us = nan/' "$src/inputs/machines/a100-80gb.toml" > nan-machine.toml
expect_input_error "NaN in a machine" "must be a finite number" "$strata" simulate tiny.toml --machine nan-machine.toml --output out_bad/x.h5
sed 's/^memory_bandwidth_gbs = .*/memory_bandwidth_gbs = inf/' "$src/inputs/machines/a100-80gb.toml" > inf-machine.toml
expect_input_error "infinity in a machine" "must be a finite number" "$strata" simulate tiny.toml --machine inf-machine.toml --output out_bad/x.h5
# Finite but absurd: no machine figure is past 1e9 of its unit, or a
# positive one under a millionth (a prediction would be 300 digits long).
sed 's/^latency_us = 8 .*/latency_us = 1e300/' "$src/inputs/machines/a100-80gb.toml" > huge-machine.toml
expect_input_error "a huge figure in a machine" "latency_us must be in [0, 1e+09] (microseconds per ring step), got 1e+300" \
  "$strata" simulate tiny.toml --machine huge-machine.toml --output out_bad/x.h5
sed 's/^memory_bandwidth_gbs = .*/memory_bandwidth_gbs = 1e-300/' "$src/inputs/machines/a100-80gb.toml" > tiny-machine.toml
expect_input_error "a vanishing figure in a machine" "must be in [1e-06, 1e+09]" \
  "$strata" simulate tiny.toml --machine tiny-machine.toml --output out_bad/x.h5
expect_input_error "plan past the world bound" "1 to 1048576" "$strata" plan tiny.toml --machine a100-80gb --world 2147483647 --output out_bad/x.h5
expect_input_error "a layout past the world bound" "at most 1048576" "$strata" run tiny.toml --dry-run --set parallel.dp=1000000000
expect_input_error "run.name out of results/" "must be a file name" "$strata" run tiny.toml --set 'run.name="../../x"'
expect_input_error "run.name with a NUL" "must be a file name" "$strata" run tiny.toml --set 'run.name="a\u0000b"'
touch offload-file
expect_input_error "offload.path a file" "offload.path offload-file: exists and is not a directory" \
  "$strata" run tiny.toml --set 'parallel.offload="nvme"' --set 'offload.path="offload-file"' --output out_bad/x.h5
expect_input_error "unknown machine" "known: a100-80gb, h100-80gb, h200" "$strata" simulate tiny.toml --machine dgx-z9 --output out_bad/x.h5
sed 's/^memory_bandwidth_gbs = .*/memory_bandwidth_gbs = -5/' "$src/inputs/machines/a100-80gb.toml" > negative.toml
expect_input_error "negative machine figure" "negative.toml:21: device.memory_bandwidth_gbs must be > 0" \
  "$strata" simulate tiny.toml --machine ./negative.toml --output out_bad/x.h5
grep -v '^peak_tflops_bf16' "$src/inputs/machines/a100-80gb.toml" > missing.toml
expect_input_error "missing machine figure" "missing.toml:11: device.peak_tflops_bf16 is missing" \
  "$strata" simulate tiny.toml --machine ./missing.toml --output out_bad/x.h5
deck_with unknown.toml 's/^layers = 2/layerz = 2/'
expect_input_error "unknown key" "layers" "$strata" run unknown.toml --output out_bad/x.h5
expect_input_error "unknown key names line" "unknown.toml:7" "$strata" run unknown.toml --output out_bad/x.h5
deck_with wrongtype.toml 's/^d_model = 16/d_model = "sixteen"/'
expect_input_error "wrong type" "d_model" "$strata" run wrongtype.toml --output out_bad/x.h5
deck_with range.toml 's/^steps = 4/steps = 0/'
expect_input_error "out of range" "run.steps" "$strata" run range.toml --output out_bad/x.h5
deck_with heads.toml 's/^heads = 2/heads = 3/'
expect_input_error "d_model % heads" "heads" "$strata" run heads.toml --output out_bad/x.h5
deck_with batch.toml 's/^micro_batch = 2/micro_batch = 3/'
expect_input_error "global_batch % micro_batch" "micro_batch" "$strata" run batch.toml --output out_bad/x.h5
deck_with nodata.toml 's|^path = .*|path = "/nonexistent/corpus.txt"|'
expect_input_error "missing data file" "/nonexistent/corpus.txt" "$strata" run nodata.toml --output out_bad/x.h5
expect_input_error "missing deck" "nothere.toml" "$strata" run nothere.toml --output out_bad/x.h5
expect_input_error "bad --set key" "--set" "$strata" run tiny.toml --set model.layerz=3 --output out_bad/x.h5
expect_input_error "bad --set value" "model.layers" "$strata" run tiny.toml --set model.layers=-1 --output out_bad/x.h5
expect_input_error "unknown flag" "--frobnicate" "$strata" run tiny.toml --frobnicate
moe="$src/inputs/moe-ep.toml"  # 8 experts, dp 8, ep 4
expect_input_error "experts % ep" "model.moe_experts = 6" "$strata" run "$moe" --set model.moe_experts=6 --output out_bad/x.h5
expect_input_error "ep does not divide dp" "does not divide parallel.dp = 8" "$strata" run "$moe" --set parallel.ep=3 --output out_bad/x.h5
expect_input_error "top_k > experts" "exceeds model.moe_experts = 1" "$strata" run "$moe" --set model.moe_experts=1 --set parallel.ep=1 --output out_bad/x.h5
expect_input_error "capacity factor <= 0" "'model.moe_capacity_factor' must be > 0" "$strata" run "$moe" --set model.moe_capacity_factor=0 --output out_bad/x.h5
expect_input_error "resume: no checkpoint" "no complete checkpoint" "$strata" run tiny.toml --resume out --output out_bad/x.h5
expect_input_error "resume: another model" "the checkpoint's model differs" mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --set run.steps=8 --set model.layers=3 --resume ck1 --output out_bad/x.h5
expect_input_error "resume: nothing left" "nothing left to run" mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --set run.steps=6 --resume ck1 --output out_bad/x.h5
expect_input_error "ep without experts" "needs a Mixture-of-Experts model" "$strata" run tiny.toml --set parallel.ep=2 --output out_bad/x.h5
expect_input_error "nvme offload without a path" "needs offload.path" "$strata" run tiny.toml --set parallel.offload=\"nvme\" --output out_bad/x.h5
expect_input_error "micro-batches < pp for 1f1b" "at least as many micro-batches" "$strata" run tiny.toml --set parallel.pp=2 --set data.micro_batch=4 --output out_bad/x.h5
expect_input_error "heads % tp" "parallel.tp" "$strata" run tiny.toml --set parallel.tp=4 --output out_bad/x.h5
expect_input_error "vocab % tp" "model.vocab = 255" "$strata" run tiny.toml --set parallel.tp=2 --set model.vocab=255 --output out_bad/x.h5
expect_input_error "layers % (pp x v)" "x parallel.virtual_stages = 2" "$strata" run tiny.toml --set parallel.pp=2 --set parallel.schedule=\"interleaved\" --set parallel.virtual_stages=2 --set model.layers=2 --output out_bad/x.h5
expect_input_error "micro-batches < pp for interleaved" "at least as many micro-batches" "$strata" run tiny.toml --set parallel.pp=2 --set parallel.schedule=\"interleaved\" --set parallel.virtual_stages=2 --set model.layers=4 --set data.micro_batch=4 --output out_bad/x.h5
expect_input_error "seq_len % tp with sequence parallelism" "sequence parallelism splits the sequence" "$strata" run tiny.toml --set parallel.tp=2 --set parallel.sequence_parallel=true --set model.seq_len=15 --output out_bad/x.h5
expect_input_error "dp does not fit the world" "dp 2" "$strata" run tiny.toml --set parallel.dp=2 --output out_bad/x.h5
expect_input_error "zero stage out of range" "parallel.zero" "$strata" run tiny.toml --set parallel.zero=4 --output out_bad/x.h5
expect_input_error "bucket of 0" "parallel.bucket_mb" "$strata" run tiny.toml --set parallel.bucket_mb=0 --output out_bad/x.h5
expect_input_error "more ranks than the layout" "rank" mpiexec -n 2 "$strata" run tiny.toml --output out_bad/x.h5
expect_input_error "dp 3 on 4 ranks" "dp 3" mpiexec -n 4 "$strata" run tiny.toml --set parallel.dp=3 --set data.global_batch=6 --output out_bad/x.h5

# --- a run that fails leaves a report marked failed, never a complete-looking one ---
"$strata" run tiny.toml --set backend.memory_limit=64KiB --output out/oom.h5 > oom.log 2>&1
rc=$?
if [[ $rc -eq 1 ]] && grep -q "memory_limit" oom.log && [[ -f out/oom.h5 ]] \
   && "$py" -c "import h5py,sys; f=h5py.File('out/oom.h5'); s=f.attrs['status']; sys.exit(0 if (s.decode() if isinstance(s, bytes) else s)=='failed' else 1)"; then
  ok "out of memory: exit 1, report status failed"
else bad "out of memory (rc $rc)"; cat oom.log; fi

# --- one failing rank ends the whole job with its message, never a hang ---
start=$(date +%s)
STRATA_INJECT_FAILURE=1:2 timeout 120 mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --set run.steps=4 \
  --output out/inject.h5 > inject.log 2>&1
rc=$?
# The others wait in a collective for it, so it publishes its own records,
# marked as its alone, and no temporary file is left.
if [[ $rc -eq 1 ]] && grep -q "rank 1 failed: failure injected" inject.log && [[ ! -e out/inject.h5.partial ]] \
   && "$py" -c "
import h5py, sys
f = h5py.File('out/inject.h5')
a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
sys.exit(0 if a['status'] == 'failed' and a['failed_rank'] == 1 and 'failure injected' in a['error']
         and set(f['steps']['rank']) == {1} else 1)"; then
  ok "a failing rank ends the job (rc $rc, $(( $(date +%s) - start )) s) with a failed report of its records"
else bad "failing rank (rc $rc)"; cat inject.log; fi

# After windows of rows went to the shared file, the failing rank's own
# report holds its last window's rows and says from which step; its summary
# covers every step it ran; the shared file is kept with every rank's rows
# of the windows before.
STRATA_INJECT_FAILURE=1:5 timeout 120 mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --set run.steps=8 \
  --set run.flush_every=2 --output out/inject2.h5 > inject2.log 2>&1
rc=$?
if [[ $rc -eq 1 && ! -e out/inject2.h5.partial ]] && "$py" -c "
import h5py, sys
f = h5py.File('out/inject2.h5')
kept = h5py.File(f.attrs['streamed_report'])['steps'][:]
rows = sorted((int(r['rank']), int(r['step'])) for r in kept)
sys.exit(0 if f.attrs['failed_rank'] == 1 and f.attrs['rows_from_step'] == 4 and list(f['steps']['step']) == [4]
         and f['summary/measured_steps'][()] == 4 and f.attrs['streamed_until_step'] == 4
         and f.attrs['streamed_report'] == 'out/inject2.streamed.h5'
         and rows == [(r, s) for r in (0, 1) for s in range(4)] else 1)"; then
  ok "a failing rank's own report after windows were written: its last window, rows_from_step 4, a summary of all; every rank's rows 0-3 kept"
else bad "failing rank after windows (rc $rc)"; cat inject2.log; fi

# --- records a window at a time: the same rows, and memory flat in run.steps ---
# A 3D layout with ZeRO-3 (non-blocking gathers and reduce-scatters), written
# a step at a time and at once: the same rows in every table, the same
# communication summary.
grid=(--set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=3 --set data.global_batch=8 --set run.steps=5
      --set run.log_every=0)
if timeout 120 mpiexec -n 4 "$strata" run tiny.toml "${grid[@]}" --set run.flush_every=1 --output out/win1.h5 > win1.log 2>&1 \
   && timeout 120 mpiexec -n 4 "$strata" run tiny.toml "${grid[@]}" --output out/win0.h5 > win0.log 2>&1 \
   && "$py" -c "
import h5py, sys
a, b = h5py.File('out/win1.h5'), h5py.File('out/win0.h5')
timed = {'start', 'end', 'wait', 'peer_wait', 'transfer_start', 'transfer_end', 'step_time', 'rank_step_time',
         'tokens_per_s', 'flops_per_s', 'mfu', 'hfu', 'offload_copy_time', 'offload_copy_wait', 'offload_update_time'}
def rows(f, t):
    d = f[t][...]
    keep = [n for n in d.dtype.names if n not in timed and not n.startswith('exposed_comm_')]
    return sorted(tuple(r[n] for n in keep) for r in d)
bad = [t for t in ['steps', 'memory', 'timeline', 'comm', 'experts'] if rows(a, t) != rows(b, t)]
sc = lambda f: sorted(zip(*(f['summary/comm'][c] for c in ['rank', 'axis', 'op', 'size_class', 'count', 'bytes'])))
if sc(a) != sc(b): bad.append('summary/comm')
if a['steps'].chunks != (4,): bad.append('chunks %s' % (a['steps'].chunks,))
print(bad); sys.exit(1 if bad else 0)"; then
  ok "a 3D ZeRO-3 run written a step at a time holds the rows and comm summary of one written at once"
else bad "rows a window at a time"; cat win1.log win0.log; fi
# 50 times the steps: the records and the process stay the same size.
# (Under AddressSanitizer freed memory waits in a quarantine, up to 256 MiB,
# and stays resident: without one, its resident set means the program's.)
flat=(--set run.flush_every=20 --set run.log_every=0 --set run.warmup_steps=0)
noquarantine="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0"
if ASAN_OPTIONS=$noquarantine "$strata" run tiny.toml "${flat[@]}" --set run.steps=40 --output out/flat40.h5 > flat40.log 2>&1 \
   && ASAN_OPTIONS=$noquarantine "$strata" run tiny.toml "${flat[@]}" --set run.steps=2000 --output out/flat2000.h5 > flat2000.log 2>&1 \
   && "$py" -c "
import h5py, sys
a, b = (h5py.File(f'out/flat{n}.h5')['summary/host_memory'][0] for n in (40, 2000))
steps = len(h5py.File('out/flat2000.h5')['steps'])
grow_records = int(b['records_bytes']) - int(a['records_bytes'])
grow_rss = int(b['peak_rss']) - int(a['peak_rss'])
print('records', int(a['records_bytes']), '->', int(b['records_bytes']), 'rss', int(a['peak_rss']), '->', int(b['peak_rss']))
# The medians' 32 B a step (1960 more steps: 63 KB); before the window, a
# run reserved about 17 KB a step of this deck up front (33 MB here).
sys.exit(0 if steps == 2000 and grow_records <= 32 * 1960 and grow_rss < 4 << 20 else 1)" > flat.log 2>&1; then
  ok "memory flat in run.steps: 40 and 2000 steps hold the same records and resident set ($(cat flat.log))"
else bad "memory flat in run.steps"; cat flat.log flat40.log flat2000.log; fi
# The dry run says what the records take.
if "$strata" run tiny.toml "${flat[@]}" --set run.steps=2000 --dry-run > flatdry.log 2>&1 \
   && grep -q "^report records: .* per rank on the host at most (ranks 0), written to the report every 20 step(s)" flatdry.log; then
  ok "the dry run gives the records' window"; else bad "dry run records window"; cat flatdry.log; fi

# --- sweeps: points listed with reasons, run as separate jobs, a failure recorded, resumed ---
cp tiny.toml sweep.toml
cat >> sweep.toml <<'DECK'
[sweep]
name = "clisweep"
"parallel.pp" = [1, 2]
"parallel.tp" = [1, 3]
"backend.memory_limit" = ["0", "64KiB"]
where = ["parallel.pp == 1 or backend.memory_limit == 0"]
DECK
if "$strata" sweep sweep.toml --list > sweeplist.log 2>&1 && grep -q "8 point(s), 3 valid (--all adds the 5 skipped and why)" sweeplist.log \
   && [[ $(grep -c " valid  " sweeplist.log) == 3 ]] && ! grep -q "skipped  " sweeplist.log \
   && "$strata" sweep sweep.toml --list --all > sweepall.log 2>&1 && [[ $(grep -c "skipped  " sweepall.log) == 5 ]] \
   && grep -q "is not a multiple of parallel.tp = 3" sweepall.log && grep -q "filtered out by where" sweepall.log; then
  ok "sweep --list: the valid points; --all the skipped ones and why"; else bad "sweep --list"; cat sweeplist.log sweepall.log; fi
"$strata" sweep sweep.toml --results out/sweeps > sweeprun.log 2>&1
rc=$?
if [[ $rc -eq 1 ]] && grep -q "point   0 .*: complete" sweeprun.log && grep -q "point   1 .*: FAILED" sweeprun.log \
   && grep -q "point   4 .*: complete" sweeprun.log \
   && "$py" - out/sweeps/clisweep/index.h5 > sweepidx.log 2>&1 <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1])
assert f.attrs["schema"] == "strata-sweep", f.attrs["schema"]
st = {int(r["point"]): r["status"].decode() for r in f["points"][...]}
assert st == {0: "complete", 1: "failed", 2: "skipped", 3: "skipped", 4: "complete", 5: "skipped", 6: "skipped",
              7: "skipped"}, st
assert b"memory_limit" in f["points"][1]["reason"]
assert f["points"][4]["tokens_per_s"] > 0
PY
then ok "sweep: a failing point is recorded, the others complete (rc 1)"; else bad "sweep run (rc $rc)"; cat sweeprun.log sweepidx.log; fi
if "$strata" sweep sweep.toml --results out/sweeps > sweepagain.log 2>&1; [[ $? -eq 1 ]] \
   && grep -q "complete already" sweepagain.log && grep -q "failed before, skipped" sweepagain.log \
   && ! grep -q "running on" sweepagain.log; then ok "sweep resumes: complete and failed points are not run again"
else bad "sweep resume"; cat sweepagain.log; fi
# A subset: --where, --points and --limit choose among the valid points
# (0, 1 and 4 here); the others stay valid, not run (not_run in the index);
# points the deck's where leaves out are counted apart from invalid ones.
if "$strata" sweep sweep.toml --list --where "parallel.pp == 2" > subw.log 2>&1 \
   && [[ $(grep -c " valid  " subw.log) == 1 ]] && grep -q "^   4 .* valid " subw.log \
   && grep -q "3 valid, 1 chosen by --where, --points or --limit" subw.log \
   && "$strata" sweep sweep.toml --list --points 0-3 --limit 1 > subl.log 2>&1 && [[ $(grep -c " valid  " subl.log) == 1 ]] \
   && grep -q "^   0 " subl.log \
   && "$strata" sweep sweep.toml --results out/subset --points 4,5 > subrun.log 2>&1 \
   && grep -q "sweep 'clisweep': 1 run(s) of 8 point(s); 2 left out by the deck's where or world; 3 skipped as invalid; 2 valid not chosen" subrun.log \
   && grep -q "point   4 .*: complete" subrun.log && ! grep -q "point   0 " subrun.log \
   && "$py" - out/subset/clisweep/index.h5 > subidx.log 2>&1 <<'PY'
import sys, h5py
st = {int(r["point"]): r["status"].decode() for r in h5py.File(sys.argv[1])["points"][...]}
assert st[4] == "complete" and st[0] == "not_run" and st[1] == "not_run", st
PY
then ok "sweep --where, --points, --limit: a subset runs, the rest stays not_run"
else bad "sweep subsets"; cat subw.log subl.log subrun.log subidx.log; fi
expect_input_error "sweep --points out of range" '--points "9": give indices and ranges of the sweep' "$strata" sweep sweep.toml --list --points 9
expect_input_error "sweep --where choosing none" "choose none of the 3 valid point(s)" "$strata" sweep sweep.toml --list --where "parallel.pp == 7"
expect_input_error "sweep --where malformed" '--where: "parallel.pp ==":' "$strata" sweep sweep.toml --list --where "parallel.pp =="
# run.repeats: each point run three times; the index has the medians and the spread.
cat > sweeprep.toml <<'DECK'
[run]
name = "rep"
steps = 4
warmup_steps = 1
repeats = 3
[model]
layers = 1
d_model = 16
heads = 2
vocab = 64
seq_len = 8
[data]
global_batch = 2
micro_batch = 1
[backend]
threads = 1
peak_tflops = 0.05
[sweep]
"parallel.dp" = [1, 2]
DECK
if "$strata" sweep sweeprep.toml --results out/rep > sweeprep.log 2>&1 && grep -q "point   1 \[parallel.dp=2\] run 3/3: complete" sweeprep.log \
   && "$py" - out/rep/rep/index.h5 > sweeprepidx.log 2>&1 <<'PY'
import sys, h5py, numpy as np
pts = h5py.File(sys.argv[1])["points"][...]
for p in pts:
    base = p["report"].decode()[:-3]
    runs = [h5py.File(r)["summary"] for r in (base + ".h5", base + ".r1.h5", base + ".r2.h5")]
    tps = [s["tokens_per_s"][()] for s in runs]
    times = [s["step_time"][()] for s in runs]
    assert p["runs"] == 3 and p["status"] == b"complete", p
    assert p["tokens_per_s"] == np.median(tps) and p["tokens_per_s_min"] == min(tps) and p["tokens_per_s_max"] == max(tps)
    assert p["step_time"] == np.median(times)
    assert abs(p["step_time_spread"] - (max(times) - min(times)) / np.median(times)) < 1e-12
PY
then ok "run.repeats: every point run three times, the index has their median and spread"
else bad "run.repeats"; cat sweeprep.log sweeprepidx.log; fi

sed 's/"parallel.tp" = \[1, 3\]/"parallel.tq" = [1, 3]/' sweep.toml > sweeptypo.toml
expect_input_error "sweep axis typo" "unknown deck key 'parallel.tq' (did you mean 'parallel.tp'?)" "$strata" sweep sweeptypo.toml --list
sed 's/"parallel.tp" = \[1, 3\]/"parallel.tp" = []/' sweep.toml > sweepempty.toml
expect_input_error "sweep empty axis" "axis 'parallel.tp' is empty" "$strata" sweep sweepempty.toml --list
sed 's/"parallel.tp" = \[1, 3\]/"parallel.tp" = [3]/' sweep.toml > sweepnone.toml
expect_input_error "sweep without a valid point" "no valid point in the sweep" "$strata" sweep sweepnone.toml --results out_bad
expect_input_error "sweep where clause" "unknown deck key 'parallel.pq'" "$strata" sweep <(sed 's/parallel.pp == 1 or/parallel.pq == 1 or/' sweep.toml) --list
# A launcher that cannot start, or that publishes no report, makes the
# point failed with the reason, not "not run".
for l in "/nonexistent/launcher -n {n}|cannot start /nonexistent/launcher" "true {n}|exited with status 0 and published no report"; do
  launcher=${l%%|*} want=${l#*|}
  rm -rf out/sweeplaunch
  "$strata" sweep sweep.toml --results out/sweeplaunch --launcher "$launcher" > sweeplaunch.log 2>&1
  rc=$?
  if [[ $rc -eq 1 ]] && "$py" - "$want" <<'PY' > sweeplaunchidx.log 2>&1
import sys, h5py
p = h5py.File("out/sweeplaunch/clisweep/index.h5")["points"][:]
run = [r for r in p if r["status"].decode() != "skipped"]
assert len(run) == 3, [r["status"] for r in p]
assert all(r["status"].decode() == "failed" and sys.argv[1] in r["reason"].decode() for r in run), \
    [(r["status"], r["reason"]) for r in run]
PY
  then ok "sweep: a launcher that fails ($launcher) fails its points with the reason"
  else bad "sweep launcher $launcher (rc $rc)"; cat sweeplaunch.log sweeplaunchidx.log; fi
done
expect_input_error "sweep --point -1" "--point: Value -1 not in range 0 to 2147483647" "$strata" sweep sweep.toml --point -1
# Deep nesting is a parser limit, said as such (it overflowed the stack).
grep -v '^where = ' sweep.toml > sweepdeep.toml
printf 'where = ["%s1"]\n' "$(printf '(%.0s' $(seq 10000))" >> sweepdeep.toml
expect_input_error "sweep where nested too deep" "nested more than 100 deep" "$strata" sweep sweepdeep.toml --list
grep -v '^where = ' sweep.toml > sweepnots.toml
printf 'where = ["%s1"]\n' "$(printf 'not %.0s' $(seq 100000))" >> sweepnots.toml
expect_input_error "sweep where with 100 000 nots" "nested more than 100 deep" "$strata" sweep sweepnots.toml --list
sed 's/^where = .*/where = ["1e999 > parallel.pp"]/' sweep.toml > sweepbig.toml
expect_input_error "sweep where number past range" "past a number's range" "$strata" sweep sweepbig.toml --list

finish

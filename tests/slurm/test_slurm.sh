#!/usr/bin/env bash
# Strata under a real SLURM (slurm/start-local's single-node cluster, or any
# cluster SLURM_CONF points at): the quickstart with sbatch --wait, a sweep as
# job arrays with slurm/submit-sweep --wait, the reports' SLURM provenance,
# SIGTERM to a running job, and the guard against srun without a PMI plugin.
# usage: test_slurm.sh STRATA_BIN SOURCE_DIR WORK_DIR PYTHON
set -uo pipefail
strata=$1 src=$2 work=$3 py=$4
export STRATA_BIN=$strata OMP_NUM_THREADS=1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

if ! sinfo -h -o %t 2>/dev/null | grep -q -E "idle|mix|alloc"; then
  echo "FAIL no SLURM reachable (sinfo): start one with slurm/start-local and export the SLURM_CONF it prints"
  exit 1
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1

# --- the quickstart as a batch job ---
if timeout 600 sbatch --wait -n 2 -o qs.out "$src/slurm/strata.sbatch" "$src/inputs/quickstart.toml" \
     --set run.steps=6 --output results/quickstart.h5 > sbatch.log 2>&1 \
   && "$py" "$src/tests/python/check_report.py" results/quickstart.h5 --steps 6 --layers "$(sed -n "s/^layers = //p" "$src/inputs/quickstart.toml")" --world 2 > check.log 2>&1 \
   && "$py" - results/quickstart.h5 <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1])
assert f.attrs["slurm_job_id"] != "", "no job id"
assert f.attrs["slurm_tasks_per_node"] == "2", f.attrs["slurm_tasks_per_node"]
assert f.attrs["slurm_nodelist"] != ""
PY
then ok "sbatch --wait quickstart: complete report with the job's provenance"
else bad "sbatch quickstart"; cat sbatch.log qs.out check.log 2>/dev/null; fi

# --- a sweep as job arrays, one per rank count, then the index ---
cat > sweep.toml <<'DECK'
[run]
name = "slurmsweep"
steps = 3
warmup_steps = 1
[model]
layers = 4
d_model = 16
heads = 2
vocab = 32
seq_len = 8
[data]
global_batch = 8
micro_batch = 1
[backend]
threads = 1
[sweep]
"parallel.dp" = [1, 2]
"parallel.pp" = [1, 2]
"parallel.zero" = [0, 1]
where = ["parallel.dp > 1 or parallel.zero == 0"]
DECK
# Where this machine is the cluster's node and claims more CPUs than it has
# (slurm/start-local on a small machine), two 4-rank points at once would
# share its cores: submit-sweep says so.
claimed=$(sinfo -h -N -o "%N %c" | awk -v h="$(hostname -s)" '$1 == h {print $2}')
shared=0
[[ -n $claimed ]] && (( claimed > $(nproc --all) && 2 * 4 > $(nproc --all) )) && shared=1
if timeout 900 "$src/slurm/submit-sweep" sweep.toml --results sweepres --max-running 2 --wait -- -o "slurm-%A_%a.out" \
     > submit.log 2>&1 \
   && grep -q "on 4 rank(s): job array" submit.log \
   && { [[ $shared == 0 ]] || grep -q "warning: up to 2 points of 4 rank(s) may run at once on node $(hostname -s) (.*it claims [0-9]* CPUs and has $(nproc --all) cores).*--max-running" submit.log; } \
   && grep -q "done; analysis/strata-report sweepres/slurmsweep/index.h5" submit.log \
   && "$py" - sweepres/slurmsweep/index.h5 <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1])
pts = f["points"][...]
status = {int(p["point"]): p["status"].decode() for p in pts}
assert status == {0: "complete", 1: "skipped", 2: "complete", 3: "skipped", 4: "complete", 5: "complete",
                  6: "complete", 7: "complete"}, status
for p in pts:
    if p["status"] == b"complete":
        r = h5py.File(p["report"].decode())
        assert r.attrs["slurm_array_task_id"] == str(int(p["point"])), (p["point"], r.attrs["slurm_array_task_id"])
        assert int(r.attrs["world_size"]) == int(p["world"])
PY
then ok "submit-sweep --results --max-running --wait: every valid point ran as an array task; the index lists them"
else bad "submit-sweep"; cat submit.log; tail -n 5 slurm-*.out 2>/dev/null; fi

# --- the analysis of what came back ---
if "$src/analysis/strata-report" results/quickstart.h5 --plots plots --trace quickstart.json > report.log 2>&1 \
   && grep -q "status  complete" report.log && grep -q "SLURM job" report.log && [[ -s plots/timeline.png ]] \
   && "$src/analysis/strata-report" sweepres/slurmsweep/index.h5 --plots plots > sweepreport.log 2>&1 \
   && grep -q "8 point(s): 6 complete, 2 skipped" sweepreport.log && [[ -s plots/sweep.png ]]; then
  ok "strata-report on the batch job's report and the sweep's index"
else bad "strata-report on SLURM results"; cat report.log sweepreport.log; fi

# --- SIGTERM to a running job's tasks (what SLURM sends at a time limit) ---
jid=$(sbatch --parsable -n 2 -o term.out "$src/slurm/strata.sbatch" "$src/inputs/quickstart.toml" \
  --set run.steps=100000 --set run.log_every=0 --output results/term.h5 --checkpoint-every 100000 --checkpoint-dir ckterm)
for _ in $(seq 1 600); do [[ -e results/term.h5.partial ]] && break; sleep 0.2; done
sleep 2
scancel --signal=TERM "$jid"
for _ in $(seq 1 600); do squeue -h -j "$jid" 2>/dev/null | grep -q . || break; sleep 0.2; done
status=$("$py" -c "import h5py; a=h5py.File('results/term.h5').attrs; print(a['status'], a['interrupted_by'])" 2>/dev/null)
if [[ $status == "interrupted SIGTERM" ]] && ls -d ckterm/step-* > /dev/null 2>&1 && grep -q "SIGTERM: stopped after step" term.out; then
  ok "SIGTERM under srun: the tasks stop at one step, checkpoint, and publish the report as interrupted"
else bad "SIGTERM under srun ($status)"; cat term.out; fi

# --- srun without a PMI plugin starts unconnected copies: refused ---
timeout 120 srun --mpi=none -n 2 "$strata" run "$src/inputs/quickstart.toml" --set run.steps=3 --set run.warmup_steps=1 \
  --output results/nopmi.h5 > nopmi.log 2>&1
rc=$?
if [[ $rc -ne 0 ]] && grep -q "SLURM started 2 tasks for this job step but MPI sees 1 rank" nopmi.log \
   && [[ ! -e results/nopmi.h5 ]]; then ok "srun without --mpi=pmi2 is refused with the reason"
else bad "srun without PMI (rc $rc)"; cat nopmi.log; fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]

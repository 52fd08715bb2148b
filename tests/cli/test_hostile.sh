#!/usr/bin/env bash
# Hostile inputs: what a careful user tries to break (docs/failures.md).
# No command writes over what it reads, no numeric key sizes more than it
# should, no input file blocks, and every refusal is exit 2 with nothing
# written and the inputs unchanged.
#
# usage: test_hostile.sh STRATA SOURCE_DIR WORK_DIR PYTHON
source "$(dirname "$0")/harness.sh"
# The tiny deck on a text of its own (an output collision below names it)
# and eight sequences a step.
tiny_deck tiny.toml
sed -i 's|^path = .*|path = "text.txt"|; s|^global_batch = .*|global_batch = 8|' tiny.toml
head -c 4096 /usr/share/common-licenses/GPL-3 > text.txt
cp "$src/inputs/machines/a100-80gb.toml" m.toml

# refused NAME WANT CMD...: exit 2 within 20 s, WANT in the message, every
# input file byte-identical, no new file but the log, no claim left.
refused() {
  local name=$1 want=$2; shift 2
  local before after
  before=$(find . -type f ! -name '*.log' -exec md5sum {} + | sort)
  timeout -k 5 20 "$@" > bad.log 2>&1
  local rc=$?
  after=$(find . -type f ! -name '*.log' -exec md5sum {} + | sort)
  if [[ $rc -eq 2 ]] && grep -qF -- "$want" bad.log && [[ "$before" == "$after" ]]; then ok "refused: $name"
  else bad "refused: $name (rc $rc, want '$want')"; cat bad.log; diff <(echo "$before") <(echo "$after"); fi
}

# --- outputs against inputs: every command, every input it reads ---
ln -s tiny.toml link.toml
ln tiny.toml hard.toml
for out in tiny.toml ./tiny.toml link.toml hard.toml sub/../tiny.toml; do
  mkdir -p sub
  refused "simulate --output $out (the deck)" "is the deck" "$strata" simulate tiny.toml --machine m.toml --output "$out"
  refused "plan --output $out (the deck)" "is the deck" "$strata" plan tiny.toml --machine m.toml --world 4 --output "$out"
  refused "run --output $out (the deck)" "is the deck" "$strata" run tiny.toml --output "$out"
  refused "run --dry-run --output $out (the deck)" "is the deck" "$strata" run tiny.toml --dry-run --output "$out"
done
refused "simulate --output the machine file" "is the machine description (--machine)" \
  "$strata" simulate tiny.toml --machine m.toml --output m.toml
refused "plan --output the machine file" "is the machine description (--machine)" \
  "$strata" plan tiny.toml --machine m.toml --world 4 --output ./m.toml
refused "simulate --output data.path" "is data.path" "$strata" simulate tiny.toml --machine m.toml --output text.txt
refused "run --output backend.machine's file" "is backend.machine's description" \
  "$strata" run tiny.toml --set 'backend.machine="m.toml"' --output m.toml

# --- the checkpoint a run resumes and the one it writes ---
"$strata" run tiny.toml --set run.steps=3 --checkpoint-every 3 --checkpoint-dir ck --output r.h5 > ck.log 2>&1 \
  || { bad "checkpointed run"; cat ck.log; }
for out in ck/step-000003/rank-00000.bin ck/step-000003/manifest.toml ck/step-000003/new.h5; do
  refused "--output $out inside the checkpoint resumed" "lies inside the checkpoint resumed (--resume)" \
    "$strata" run tiny.toml --resume ck/step-000003 --set run.steps=8 --output "$out"
done
refused "--output inside the checkpoint directory written" "lies inside the checkpoint directory this run writes" \
  "$strata" run tiny.toml --checkpoint-every 2 --checkpoint-dir ck2 --output ck2/step-000002
refused "--checkpoint-dir inside the checkpoint resumed" "lies inside the checkpoint resumed" \
  "$strata" run tiny.toml --resume ck/step-000003 --set run.steps=8 --checkpoint-every 2 \
  --checkpoint-dir ck/step-000003/more --output r2.h5
# The directory that holds the resumed checkpoint may take the next ones.
if "$strata" run tiny.toml --resume ck --set run.steps=5 --checkpoint-every 5 --checkpoint-dir ck --output r3.h5 \
     > ck3.log 2>&1 && [[ -f ck/step-000005/manifest.toml ]]
then ok "resume from a checkpoint directory and write the next checkpoints there"
else bad "resume into the same checkpoint directory"; cat ck3.log; fi

# --- numeric keys bounded by what they size ---
for b in 1e30 2e6; do
  refused "parallel.bucket_mb=$b" "is more than 1048576 MiB" \
    "$strata" run tiny.toml --set parallel.dp=2 --set parallel.bucket_mb=$b --dry-run
done
for b in 1e-30 1e-5; do
  refused "parallel.bucket_mb=$b under dp" "at most 1024" \
    mpiexec -n 2 "$strata" run tiny.toml --set parallel.dp=2 --set parallel.bucket_mb=$b --output out/b.h5
done
refused "run.flush_every past 1 GiB of records" "at most" \
  "$strata" run tiny.toml --set run.flush_every=2147483647 --set run.steps=2000000 --output out/f.h5
refused "run.flush_every past 1 GiB (dry run)" "run.flush_every = 2147483647" \
  "$strata" run tiny.toml --set run.flush_every=2147483647 --set run.steps=2000000 --dry-run
moe=(--set 'model.kind="moe"' --set model.moe_experts=2)
refused "moe_every beyond the layers" "leaves no Mixture-of-Experts block" \
  "$strata" run tiny.toml "${moe[@]}" --set model.moe_every=3 --dry-run
if "$strata" run tiny.toml "${moe[@]}" --set model.moe_capacity_factor=1e30 --set run.steps=2 --output out/cap.h5 \
     > cap.log 2>&1 && "$strata" simulate tiny.toml --machine m.toml "${moe[@]}" --set model.moe_capacity_factor=1e30 \
     --output out/capsim.h5 > capsim.log 2>&1
then ok "moe_capacity_factor = 1e30: an expert takes every token at most (runs and simulates)"
else bad "moe_capacity_factor = 1e30"; cat cap.log capsim.log; fi

# --- sweeps: bounded before they are expanded, named as files ---
vals() { "$py" -c "import sys; print('[' + ', '.join(str(1e-3 * (i + 1)) for i in range(int(sys.argv[1]))) + ']')" "$1"; }
{ cat tiny.toml; echo "[sweep]"; for k in optim.lr optim.weight_decay optim.beta1 optim.grad_clip; do
    echo "\"$k\" = $(vals 1000)"; done; } > huge.toml
refused "a sweep of 1e12 points" "at most 100000" "$strata" sweep huge.toml --list
for name in '../../esc' '' 'a/b' '..'; do
  { cat tiny.toml; echo "[sweep]"; echo "name = \"$name\""; echo '"optim.lr" = [0.1]'; } > name.toml
  refused "sweep.name = '$name'" "must be a file name" "$strata" sweep name.toml --list
done

# --- sweeps side by side, retried, indexed where nothing can be written ---
{ cat tiny.toml; echo '[sweep]'; echo 'name = "two"'; echo '"optim.lr" = [0.1, 0.2]'; } > two.toml
"$strata" sweep two.toml --results res > sweep1.log 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -e res/two.lock ]] && break; sleep 0.05; done
"$strata" sweep two.toml --results res > sweep2.log 2>&1
rc2=$?
wait $pid
rc1=$?
if [[ $rc1 -eq 0 && $rc2 -eq 2 ]] && grep -q "sweep directory res/two is claimed by another run" sweep2.log \
   && [[ ! -e res/two.lock ]]
then ok "a second driver of one sweep directory is refused while the first runs it; the first completes"
else bad "two sweeps side by side (rc $rc1, $rc2)"; cat sweep1.log sweep2.log; fi
# A point retried whose launcher then fails: the console and the index agree.
"$py" -c "
import h5py
with h5py.File('res/two/point-000.h5', 'r+') as f: f.attrs['status'] = 'interrupted'"
"$strata" sweep two.toml --results res --retry-failed --launcher "/nonexistent/launcher -n {n}" > retry.log 2>&1
rc=$?
if [[ $rc -eq 1 ]] && grep -q "; 1 point(s) failed" retry.log && "$py" -c "
import h5py, sys
p = h5py.File('res/two/index.h5')['points'][:]
sys.exit(0 if [r['status'].decode() for r in p] == ['failed', 'complete'] else 1)"
then ok "--retry-failed with a failing launcher: 1 failed on the console and in the index"
else bad "retry with a failing launcher (rc $rc)"; cat retry.log; fi
refused "sweep --index where no directory can be made" "sweep index tiny.toml/two/index.h5" \
  "$strata" sweep two.toml --results tiny.toml --index

# --- input files that are not files: refused, never waited on ---
mkfifo fifo.toml
refused "a FIFO as backend.machine" "not a regular file" \
  "$strata" run tiny.toml --set backend.peak_tflops=0 --set 'backend.machine="fifo.toml"' --output out/x.h5
refused "a FIFO as --machine" "not a regular file" "$strata" simulate tiny.toml --machine fifo.toml --output out/x.h5
mkdir -p ckf && cp -r ck/step-000003 ckf/ && rm ckf/step-000003/manifest.toml && mkfifo ckf/step-000003/manifest.toml
refused "a FIFO as a checkpoint's manifest" "not a regular file" \
  "$strata" run tiny.toml --resume ckf/step-000003 --set run.steps=8 --output out/x.h5
refused "a device as the deck" "not a regular file" "$strata" run /dev/zero --output out/x.h5
# A deck may come through a pipe (process substitution), read to its end.
if "$strata" run <(cat tiny.toml) --dry-run > pipe.log 2>&1; then ok "a deck through a pipe"
else bad "a deck through a pipe"; cat pipe.log; fi
[[ -z $(find . -name '*.lock') ]] && ok "no claim left behind" || { bad "claims left"; find . -name '*.lock'; }

# --- stop signals before step 1 ---
# A text of 4 GiB (sparse: no disk) starts at once (samples are read when
# asked for), so a SIGTERM 3 s in ends the run as interrupted, promptly.
truncate -s 4G big.txt
start=$(date +%s)
"$strata" run tiny.toml --set 'data.path="big.txt"' --set run.steps=1000000 --set run.log_every=0 \
  --output out/big.h5 > big.log 2>&1 &
pid=$!
sleep 3
kill -TERM $pid
wait $pid
rc=$?
took=$(( $(date +%s) - start ))
if [[ $rc -eq 143 && $took -le 15 ]] && "$py" -c "
import h5py, sys
f = h5py.File('out/big.h5')
sys.exit(0 if f.attrs['status'] == 'interrupted' and len(f['steps']) > 0 else 1)"
then ok "SIGTERM 3 s into a run on a 4 GiB text: interrupted after ${took} s with its steps"
else bad "SIGTERM on a 4 GiB text (rc $rc, ${took} s)"; cat big.log; fi
rm -f big.txt
# A plan stopped before it judged anything says so, and not "no layout fits".
"$strata" plan "$src/inputs/gpt-175b-pipeline.toml" --machine m.toml --world 4096 --output out/plan.h5 \
  > plan.log 2>&1 &
pid=$!
sleep 5
kill -TERM $pid
wait $pid
rc=$?
if [[ $rc -eq 143 ]] && grep -q "not reached before SIGTERM" plan.log && grep -q "^stopped by SIGTERM" plan.log \
   && ! grep -q "no layout fits" plan.log \
   && "$py" "$src/analysis/strata-report" out/plan.h5 > plansum.log 2>&1 \
   && grep -q "^INTERRUPTED by SIGTERM: 0 of [0-9]* layouts judged" plansum.log
then ok "a plan stopped by SIGTERM says what it had not reached, and so does strata-report on its report"
else bad "plan stopped (rc $rc)"; cat plan.log plansum.log; fi

# --- a report read while it is written ---
# A reader follows a two-rank run through its .partial file: it opens, reads
# and closes it at each look (a look that meets a window being written may
# fail, and is retried), and sees the steps grow before the run ends.
if "$py" - "$strata" > follow.log 2>&1 <<'PY'
import subprocess, sys, time, h5py
strata = sys.argv[1]
out = "out/follow.h5"
job = subprocess.Popen(["mpiexec", "-n", "2", strata, "run", "tiny.toml", "--set", "parallel.dp=2",
                        "--set", "run.steps=3000", "--set", "run.flush_every=100", "--output", out],
                       stdout=subprocess.DEVNULL)
seen, failed = [], 0
while job.poll() is None:
    try:
        with h5py.File(out + ".partial", "r") as f:
            if "steps" in f:
                seen.append((len(f["steps"]), f.attrs["status"]))
    except (OSError, KeyError):
        failed += 1
    time.sleep(0.02)
rows = len(h5py.File(out, "r")["steps"])
counts = [n for n, _ in seen]
print(f"rc {job.returncode}; {len(set(counts))} distinct row counts seen while it ran ({counts[:3]} ... "
      f"{counts[-3:]}), {failed} looks failed; {rows} rows at the end")
assert job.returncode == 0 and rows == 6000
assert 0 < min(counts) and len({n for n in counts if n < rows}) >= 2, "the steps were not seen to grow"
# (The last window and the status "complete" are written before the rename.)
status = {(s.decode() if isinstance(s, bytes) else s) for n, s in seen if n < rows}
assert counts == sorted(counts) and status == {"running"}, status
PY
then ok "a reader follows a running two-rank job: $(head -1 follow.log)"
else bad "following a running job"; cat follow.log; fi

finish

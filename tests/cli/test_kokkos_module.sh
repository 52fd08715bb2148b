#!/usr/bin/env bash
# The Kokkos backend is a module (libstrata_kokkos.so) that `strata` loads
# when a run asks for the kokkos device: the program links no Kokkos library,
# the module does, a kokkos deck on two ranks runs on it (its report says
# which backend) and ends at the CPU's losses, and a missing module is an
# error that names where it was looked for.
#
# usage: test_kokkos_module.sh STRATA MODULE WORK_DIR
set -uo pipefail
strata=$(realpath "$1") module=$(realpath "$2") work=$3
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

# ldd's output kept in files: `ldd | grep -q` fails under pipefail when grep
# stops reading early and ldd dies of SIGPIPE.
if ! ldd "$strata" > strata.ldd; then bad "ldd $strata"
elif grep -q kokkos strata.ldd; then bad "strata links no Kokkos library"; grep kokkos strata.ldd
else ok "strata links no Kokkos library"; fi
ldd "$module" > module.ldd || bad "ldd $module"
grep -q "kokkoscore" module.ldd && ok "the module links Kokkos" || bad "the module links Kokkos"
grep -q "kokkoskernels" module.ldd && ok "the module links KokkosKernels" || bad "the module links KokkosKernels"

cat > tiny.toml <<'DECK'
[run]
name = "tiny"
steps = 3
warmup_steps = 0
[model]
layers = 1
d_model = 16
heads = 2
vocab = 256
seq_len = 16
[data]
source = "text"
path = "/usr/share/common-licenses/GPL-3"
global_batch = 4
micro_batch = 2
[parallel]
dp = 2
zero = 2
[backend]
threads = 1
peak_tflops = 0.05
DECK

for d in cpu kokkos; do
  mpiexec -n 2 "$strata" run tiny.toml --set "backend.device=\"$d\"" --output "out/$d.h5" > "$d.log" 2>&1 \
    && ok "a $d deck on 2 ranks runs" || { bad "a $d deck on 2 ranks: exit $?"; cat "$d.log"; }
done
if "$py" - out/cpu.h5 out/kokkos.h5 > compare.log 2>&1 <<'PY'
import sys
import h5py
cpu, kok = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
assert kok.attrs["backend"].startswith("kokkos/"), kok.attrs["backend"]
assert kok.attrs["device"] == "kokkos", kok.attrs["device"]
a, b = cpu["steps"]["loss"], kok["steps"]["loss"]
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert worst <= 1e-5, worst
print("backend", kok.attrs["backend"], "largest relative loss difference", worst)
PY
then ok "the report says kokkos, and the losses are the CPU's to 1e-5 ($(tail -1 compare.log))"
else bad "report"; cat compare.log; fi

STRATA_KOKKOS_MODULE=/nonexistent/libstrata_kokkos.so "$strata" run tiny.toml --set 'backend.device="kokkos"' \
  --set parallel.dp=1 --output out/missing.h5 > missing.log 2>&1
rc=$?
if [[ $rc != 0 ]] && grep -q "not found; looked in: /nonexistent/libstrata_kokkos.so (set STRATA_KOKKOS_MODULE" missing.log; then
  ok "a missing module is named, with where it was looked for (exit $rc)"
else bad "missing module: exit $rc"; cat missing.log; fi

echo "$pass passed, $fail failed"
[[ $fail == 0 ]]

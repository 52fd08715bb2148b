#!/usr/bin/env bash
# The CUDA backend is two modules (libstrata_cuda.so, the kernels;
# libstrata_cuda_comm.so, the NCCL and staged communicators) that `strata`
# loads when a run asks for a GPU: the program links none of the CUDA
# libraries, the modules have them, a cuda deck loads them (on a machine
# without a GPU the error comes from the CUDA runtime inside the kernels'
# module, which proves it loaded), and a missing module is an error that
# names where it was looked for.
#
# usage: test_cuda_module.sh STRATA KERNELS_MODULE COMM_MODULE WORK_DIR
set -uo pipefail
strata=$(realpath "$1") module=$(realpath "$2") comm_module=$(realpath "$3") work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

cuda_libs='libcudart|libcublas|libcublasLt|libnccl'
if ! ldd "$strata" > strata.ldd; then bad "ldd $strata"
elif grep -Eq "$cuda_libs" strata.ldd; then bad "strata links no CUDA library"; grep -E "$cuda_libs" strata.ldd
else ok "strata links no CUDA library"; fi
# ldd's output kept in files: `ldd | grep -q` fails under pipefail when grep
# stops reading early and ldd dies of SIGPIPE.
ldd "$module" > kernels.ldd || bad "ldd $module"
ldd "$comm_module" > comm.ldd || bad "ldd $comm_module"
for lib in libcudart libcublas libcublasLt; do
  grep -q "$lib\.so" kernels.ldd && ok "the kernels' module links $lib" || bad "the kernels' module links $lib"
done
for lib in libcudart libnccl; do
  grep -q "$lib\.so" comm.ldd && ok "the comm module links $lib" || bad "the comm module links $lib"
done
# The comm module takes the MPI communicator from the program that loads it,
# so it is undefined in the module alone (ldd -r lists it): one copy in the
# process. (The kernels use only foundation's headers.)
ldd -r "$comm_module" > comm-r.ldd 2>&1
if grep -q "undefined symbol: _ZN6strata4comm15MpiCommunicator" comm-r.ldd; then
  ok "the comm module takes the MPI communicator from the program"
else bad "the comm module takes the MPI communicator from the program"; fi

cat > tiny.toml <<'DECK'
[run]
name = "tiny"
steps = 2
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
global_batch = 2
micro_batch = 2
[backend]
device = "cuda"
threads = 1
peak_tflops = 0.05
DECK

"$strata" run tiny.toml --output out/gpu.h5 > gpu.log 2>&1
rc=$?
if grep -q "no usable GPU (no" gpu.log; then
  # No GPU: the message is the CUDA runtime's, from inside the module.
  [[ $rc != 0 ]] && ok "cuda deck without a GPU: the module loads and says why (exit $rc)" || bad "exit status"
elif [[ $rc == 0 ]]; then
  ok "cuda deck on a GPU runs"
else bad "cuda deck: exit $rc"; cat gpu.log; fi

STRATA_CUDA_MODULE=/nonexistent/libstrata_cuda.so "$strata" run tiny.toml --output out/missing.h5 > missing.log 2>&1
rc=$?
if [[ $rc != 0 ]] && grep -q "not found; looked in: /nonexistent/libstrata_cuda.so (set STRATA_CUDA_MODULE" missing.log; then
  ok "a missing module is named, with where it was looked for (exit $rc)"
else bad "missing module: exit $rc"; cat missing.log; fi

echo "$pass passed, $fail failed"
[[ $fail == 0 ]]

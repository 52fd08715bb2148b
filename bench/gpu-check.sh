#!/usr/bin/env bash
# The CUDA backend's checks on a GPU, in one call (about 5 minutes on an H200).
#
#   bench/gpu-check.sh pack   on the build machine: builds with the cuda preset
#                             (build-cuda/) and packs the programs and the CUDA
#                             modules they load (beside them), with every
#                             shared library they load that is not the CUDA
#                             toolkit's or glibc's, into .gpu/pack.tar.xz
#   bench/gpu-check.sh run    on the GPU machine (from the repository root,
#                             .gpu carried along; give the call about 580 s):
#                             unpacks, then runs
#                               1. the kernel tests against the CPU backend
#                                  (fp32 within 1e-5, bf16 bit for bit or 1e-2)
#                               2. the training parity test (one process trains
#                                  the same deck on the CPU and on the GPU)
#                               3. the NCCL communicator test (one rank)
#                               4. the kernel times at inputs/gpu-gpt.toml's shapes
#                               5. inputs/gpu-gpt.toml (355 M parameters, seq
#                                  1024, bf16) and the same deck with ZeRO-3,
#                                  a few steps each, with NCCL on one rank
#                               6. a small deck on 2 ranks sharing the GPU
#                                  (MPI staged through the host), ZeRO-3,
#                                  against the same on the CPU
#                             and prints the table (bench/gpu_table.py).
#
# Why two halves: the GPU machine has nvcc and CMake but none of the
# project's Debian-packaged dependencies (MPICH, parallel HDF5, OpenBLAS,
# toml++, CLI11, fmt, GoogleTest) and cannot fetch them, so the cuda preset
# builds where they are and the programs travel with the libraries they load.
# CUDA's own libraries (cudart, cuBLAS, NCCL) are the GPU machine's.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
pack_dir=.gpu
programs=(strata tests/test_backend_ops tests/test_cuda_attention tests/test_gpu_training tests/test_nccl
          bench/gpu_kernels)

pack() {
  set -e
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda -j "$(nproc)" --target strata test_backend_ops test_cuda_attention \
    test_gpu_training test_nccl gpu_kernels strata_cuda strata_cuda_comm
  rm -rf "$pack_dir/stage" && mkdir -p "$pack_dir/stage/bin" "$pack_dir/stage/lib"
  for p in "${programs[@]}"; do cp "build-cuda/$p" "$pack_dir/stage/bin/"; done
  # The CUDA backend's modules, found beside the program that loads them.
  cp build-cuda/libstrata_cuda.so build-cuda/libstrata_cuda_comm.so "$pack_dir/stage/bin/"
  # MPICH's launcher, for runs of more than one rank.
  cp "$(readlink -f "$(command -v mpiexec)")" "$pack_dir/stage/bin/mpiexec"
  cp "$(command -v hydra_pmi_proxy)" "$pack_dir/stage/bin/"
  strip "$pack_dir"/stage/bin/*
  for p in "$pack_dir"/stage/bin/*; do
    ldd "$p" | awk '/=>/ {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      # glibc and its internal libraries are the GPU machine's own (they
      # import its private symbols); so are the CUDA driver and toolkit.
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libresolv*|libnss_*|libanl*|libutil*|libmvec*) ;;
      libcuda.so*|libcudart.so*|libcublas*|libnccl*) ;;
      *) cp -L "$lib" "$pack_dir/stage/lib/" ;;
    esac
  done
  echo "/$pack_dir/" >> .git/info/exclude
  sort -u -o .git/info/exclude .git/info/exclude
  tar -C "$pack_dir/stage" -cf - bin lib | xz -T0 -6 > "$pack_dir/pack.tar.xz"
  rm -rf "$pack_dir/stage"
  ls -l "$pack_dir/pack.tar.xz"
}

run() {
  # What comes back: checks.log (every step's output), table.txt and the
  # run's report; the rest stays in /tmp.
  local out=${OUT:-/tmp/gpu-check}
  mkdir -p "$out" /tmp/gpu && tar -C /tmp/gpu -xJf "$pack_dir/pack.tar.xz" || exit 1
  # CUDA's libraries: the toolkit's first, then the Python wheels' (NCCL).
  local cuda_libs
  cuda_libs=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib /opt \
                -name 'libnccl.so.2' -o -name 'libcublas.so.13' -o -name 'libcudart.so.13' 2>/dev/null |
              xargs -r -n1 dirname | awk '!seen[$0]++' | paste -sd:)
  export LD_LIBRARY_PATH=/tmp/gpu/lib:/usr/local/cuda/lib64:${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=/tmp/gpu/bin:$PATH OMP_NUM_THREADS=8 OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
  # One node, no network: MPICH's UCX over shared memory and loopback; NCCL
  # says why when it fails.
  export UCX_TLS=self,sm,tcp UCX_NET_DEVICES=lo NCCL_DEBUG=WARN
  local log=$out/checks.log
  : > "$log"
  nvidia-smi -L 2>&1 | tee -a "$log"
  if ldd /tmp/gpu/bin/strata | grep 'not found'; then echo "missing libraries (above)"; fi
  local failed=()
  step() {  # name, timeout in seconds, command...
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*" | tee -a "$log"
    if ! timeout "$limit" "$@" 2>&1 | tee -a "$log" "/tmp/gpu/$name.log"; then failed+=("$name"); fi
  }
  # About 9 minutes at most in all, within one call's 10.
  step kernels 60 test_backend_ops --gtest_brief=1 '--gtest_filter=*_cuda:BackendOpsList.*'
  step attention 45 test_cuda_attention --gtest_brief=1
  step parity 90 test_gpu_training --gtest_brief=1
  step nccl 30 test_nccl --gtest_brief=1
  step kernel_times 45 gpu_kernels 8 1024 1024 16 50304 bf16
  step train 120 strata run inputs/gpu-gpt.toml --set "run.output=$out/gpu-gpt.h5"
  step train_zero3 75 strata run inputs/gpu-gpt.toml --set run.steps=4 --set run.warmup_steps=1 \
    --set parallel.zero=3 --set run.output=/tmp/gpu/gpu-gpt-zero3.h5
  # Two ranks on the one GPU (NCCL cannot share it: MPI staged through the
  # host) under ZeRO-3, against the same deck on the CPU: the multi-rank
  # paths of the strategies on device memory.
  # (Hydra's fork launcher: one node, no ssh, no name lookup.) fp32 over 12
  # steps: the final losses within 1e-3 relative.
  local small=(inputs/dp-zero.toml --set parallel.dp=2 --set parallel.zero=3 --set data.source=synthetic)
  local two=(mpiexec -launcher fork -n 2)
  step dp2_gpu 30 "${two[@]}" strata run "${small[@]}" --set backend.device=cuda --set backend.comm=mpi \
    --set run.output=/tmp/gpu/dp2-gpu.h5
  step dp2_cpu 30 "${two[@]}" strata run "${small[@]}" --set run.output=/tmp/gpu/dp2-cpu.h5
  step dp2_compare 20 env -u LD_LIBRARY_PATH python3 -c 'import h5py, sys
l = [h5py.File(p)["summary/final_loss"][()] for p in sys.argv[1:]]
d = abs(l[0] - l[1]) / l[1]
print(f"dp 2 x ZeRO-3 final loss: GPU {l[0]:.5f}, CPU {l[1]:.5f} (relative difference {d:.1e}, bound 1e-3)")
sys.exit(0 if d < 1e-3 else 1)' /tmp/gpu/dp2-gpu.h5 /tmp/gpu/dp2-cpu.h5
  # The machine's own Python (h5py), without the packed libraries.
  env -u LD_LIBRARY_PATH python3 bench/gpu_table.py "$out/gpu-gpt.h5" /tmp/gpu/kernel_times.log |
    tee "$out/table.txt"
  if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]}"
    return 1
  fi
  echo "all GPU checks passed"
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac

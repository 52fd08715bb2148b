#!/usr/bin/env bash
# The floors point one way: each library target compiles against an include
# root that holds only the floors below it (CMakeLists.txt, strata_floor).
# This test compiles, with each floor's include root, one include of every
# floor: those below (and its own) must compile, those above must not.
# Usage: test_floors.sh CXX BUILD_DIR
set -uo pipefail
cxx=$1
floors=$(cd "$2" && pwd)/floors
fail=0
# From an empty folder: a quoted include from standard input is looked up in
# the current directory first.
cd "$(mktemp -d)" || exit 1
# target | its own floor's header | the floors above it (header each)
check() {
  local target=$1 header=$2 expect=$3
  if echo "#include \"$header\"" | "$cxx" -std=c++20 -fsyntax-only -x c++ -I "$floors/$target" - >/dev/null 2>&1; then
    got=compiles
  else
    got=refused
  fi
  if [[ $got == "$expect" ]]; then
    echo "ok   $target: #include \"$header\" $got"
  else
    echo "FAIL $target: #include \"$header\" $got, expected $expect"
    fail=1
  fi
}
foundation=kernels/foundation/memory.hpp
kernels=kernels/kernels.hpp
plan=plan/keys.hpp
models=models/param_registry.hpp
strategies=strategies/pp/schedule.hpp
harness=src/deck/deck.hpp
check strata_foundation $foundation compiles
for h in $kernels $plan $models $strategies $harness; do check strata_foundation $h refused; done
check strata_kernels $foundation compiles
check strata_kernels $kernels compiles
for h in $plan $models $strategies $harness; do check strata_kernels $h refused; done
for h in $foundation $kernels $plan; do check strata_plan $h compiles; done
for h in $models $strategies $harness; do check strata_plan $h refused; done
for h in $foundation $kernels $plan $models; do check strata_models $h compiles; done
for h in $strategies $harness; do check strata_models $h refused; done
for h in $foundation $kernels $plan $models $strategies; do check strata_strategies $h compiles; done
check strata_strategies $harness refused
exit $fail

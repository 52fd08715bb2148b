# Sourced by the shell tests (tests/cli, tests/faults): their arguments, a
# fresh working directory, the pass/fail counters and the tiny deck they
# share.
#   usage of a test: TEST.sh STRATA SOURCE_DIR WORK_DIR PYTHON
set -uo pipefail
strata=$1 src=$2 work=$3 py=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
pass=0 fail=0 skipped=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
skip() { echo "skip $1"; skipped=$((skipped + 1)); }
# The counts, and the test's status: failed if any case failed.
finish() {
  echo "$pass passed, $fail failed$( ((skipped > 0)) && echo ", $skipped skipped")"
  [[ $fail -eq 0 ]]
}

# tiny_deck FILE: two layers of width 16 on the GPL's text, four steps of
# four sequences; a test changes what it needs with --set or sed.
tiny_deck() {
  cat > "$1" <<'DECK'
[run]
name = "tiny"
steps = 4
warmup_steps = 1
seed = 3
[model]
layers = 2
d_model = 16
heads = 2
vocab = 256
seq_len = 16
[data]
source = "text"
path = "/usr/share/common-licenses/GPL-3"
global_batch = 4
micro_batch = 2
[backend]
threads = 1
peak_tflops = 0.05
DECK
}

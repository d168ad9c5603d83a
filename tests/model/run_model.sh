#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks one Promela model exhaustively with SPIN: generates the verifier
# (spin -a), compiles it for safety properties (-DSAFETY: assertions and
# invalid end states), runs it and compares the outcome with the expected one.
#
# usage: run_model.sh MODEL.pml pass|fail[=VIOLATION] [-DMACRO ...]
#   pass: the search must complete with "errors: 0"
#   fail: SPIN must find a violation (a mutant: proof that the model can fail)
#   fail=VIOLATION: and one of the violations pan reports must contain the
#     text VIOLATION (e.g. "assertion violated (total==0)", "invalid end
#     state"), so that a mutant fails for the reason it claims, not for any
#     (a typo that deadlocks the model fails too); pan's first violation is
#     tried, then, if it is another, every violation (pan -c0 -e)
# Prints one line: "model NAME [MACROS]: OK|FAILED (errors N, S states, T s)".
# Environment: SPIN (default spin), CC (default cc), PAN_MEMLIM (pan's
# memory limit in MB, default 2048), PAN_OPT (one compiler flag, the
# verifier's optimisation, default -O0: compiling pan.c at -O2 takes 3.5 s
# and saves less than that on every model but the two largest searches,
# whose tests set -O2).
set -euo pipefail

model=$(realpath "$1")
expect=$2
shift 2
violation=
case $expect in
fail=*) violation=${expect#fail=}; expect=fail ;;
pass|fail) ;;
*) echo "usage: run_model.sh MODEL.pml pass|fail[=VIOLATION] [-DMACRO ...]" >&2; exit 2 ;;
esac
name=$(basename "$model" .pml)
label="model $name${*:+ $*}"
spin=${SPIN:-spin}
cc=${CC:-cc}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
cp "$model" .

"$spin" "$@" -a "$name.pml" >spin.log 2>&1 || { cat spin.log; echo "$label: FAILED (spin -a)"; exit 1; }
"$cc" "${PAN_OPT:--O0}" -DSAFETY -DMEMLIM="${PAN_MEMLIM:-2048}" -o pan pan.c 2>cc.log || { cat cc.log; echo "$label: FAILED (cc)"; exit 1; }
./pan -m200000 >pan.log 2>&1 || true

errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' pan.log | head -n1)
states=$(awk '/states, stored/ {print $1; exit}' pan.log)
secs=$(sed -n 's/^pan: elapsed time \([0-9.e+-]*\) seconds.*/\1/p' pan.log | head -n1)
if [ -z "$errors" ]; then
  cat pan.log
  echo "$label: FAILED (no verdict from pan)"
  exit 1
fi
# A depth-limit warning would mean the search was not exhaustive.
if grep -q "max search depth too small" pan.log; then
  cat pan.log
  echo "$label: FAILED (search depth too small)"
  exit 1
fi
# A search cut short (pan's memory limit, or malloc failing) prints
# "errors: 0" too, with this warning; a search that stopped at an error
# prints it as well, so it only voids a verdict of no error.
if [ "$errors" = 0 ] && grep -q "Search not completed" pan.log; then
  cat pan.log
  echo "$label: FAILED (search not completed)"
  exit 1
fi
summary="errors $errors, ${states:-?} states, ${secs:-?} s"

if [ "$expect" = pass ] && [ "$errors" = 0 ]; then
  echo "$label: OK (exhaustive, $summary)"
elif [ "$expect" = fail ] && [ "$errors" != 0 ]; then
  # Show the counterexample: what the mutant breaks.
  "$spin" "$@" -t "$name.pml" 2>&1 | grep -E "assertion|violated" | head -n3 || true
  if [ -n "$violation" ] && ! grep -E '^pan:[0-9]+: ' pan.log | grep -F -- "$violation" >/dev/null; then
    ./pan -m200000 -c0 -e >pan-all.log 2>&1 || true
    if ! grep -E '^pan:[0-9]+: ' pan-all.log | grep -F -- "$violation" >/dev/null; then
      grep -E '^pan:[0-9]+: ' pan-all.log | sed 's/^pan:[0-9]*: //; s/ (at depth [0-9]*)//' |
        sort | uniq -c | head -n 10
      echo "$label: FAILED (no violation \"$violation\", $summary)"
      exit 1
    fi
  fi
  echo "$label: OK (violation found as expected${violation:+: $violation}, $summary)"
else
  cat pan.log
  [ "$errors" != 0 ] && "$spin" "$@" -t -p "$name.pml" 2>&1 | tail -n 40
  echo "$label: FAILED (expected $expect, $summary)"
  exit 1
fi

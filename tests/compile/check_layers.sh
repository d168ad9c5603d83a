#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The library's layers, checked on its object files: an object may use only
# what its own layer and the layers below define, so that a lower layer
# never calls up into a higher one (a higher one that must be called back
# registers a hook: the fork and exit hooks, percpuref_readers_set_exit_work()).
#   0  the runtime: runtime.c, the fast paths it chooses between
#      (rseq_register.c, fallback.c) and thread_exit.c
#   1  on the runtime alone: the per-CPU allocator (percpu_alloc.c), the
#      callback thread (deferred.c), hcount.c, refcount_baselines.c
#   2  the modes and the reclaimer (percpu_ref.c, managed.c), which call
#      each other: a switch to managed mode pushes the ref on the
#      reclaimer's list, and the reclaimer checks and switches it through
#      the mode code
#   3  percpu_rcuref.c, on the modes and the reclaimer
# A source file not in this table fails the check until it is given a
# layer.  So does a symbol two objects define (a lower layer's weak
# default, which a call in that layer reaches undefined by nothing, would
# bind to a higher layer's definition), and an object this nm cannot read
# (GCC's slim LTO objects without the linker plugin: only
# __gnu_lto_slim shows, and nothing would be checked).
# Usage: check_layers.sh NM OBJECT...
set -u
nm=$1
shift
declare -A layer=(
  [runtime]=0 [rseq_register]=0 [fallback]=0 [thread_exit]=0
  [percpu_alloc]=1 [deferred]=1 [hcount]=1 [refcount_baselines]=1
  [percpu_ref]=2 [managed]=2
  [percpu_rcuref]=3
)
declare -A definer=()
status=0
n=0

module() {
  local base
  base=$(basename "$1")
  echo "${base%%.*}"
}

if [ $# -ne ${#layer[@]} ]; then
  echo "not ok 1 - $# objects given, the table has ${#layer[@]}: give each source file a layer"
  exit 1
fi
# Who defines what: every global symbol an object defines.
for obj in "$@"; do
  m=$(module "$obj")
  n=$((n + 1))
  if [ -z "${layer[$m]+set}" ]; then
    echo "not ok $n - $m has no layer in this table"
    status=1
    continue
  fi
  defined=$("$nm" --defined-only -g "$obj" | awk 'NF == 3 { print $3 }')
  if [ -z "$defined" ] || grep -qx '__gnu_lto_slim' <<<"$defined"; then
    echo "not ok $n - $m: $nm read no symbol it defines (a slim LTO object? use gcc-nm)"
    status=1
    continue
  fi
  twice=()
  for sym in $defined; do
    [ -n "${definer[$sym]-}" ] && twice+=("$sym (${definer[$sym]} too)")
    definer[$sym]=$m
  done
  if [ ${#twice[@]} -ne 0 ]; then
    echo "not ok $n - $m defines what another object defines: ${twice[*]}"
    status=1
    continue
  fi
  echo "ok $n - $m: layer ${layer[$m]}, $(wc -w <<<"$defined") symbols defined"
done
# Who uses what: an undefined symbol of a higher layer's is a call up.
for obj in "$@"; do
  m=$(module "$obj")
  [ -n "${layer[$m]+set}" ] || continue
  n=$((n + 1))
  up=()
  for sym in $("$nm" -u "$obj" | awk '{ print $NF }'); do
    d=${definer[$sym]-}
    if [ -n "$d" ] && [ "${layer[$d]}" -gt "${layer[$m]}" ]; then
      up+=("$sym ($d, layer ${layer[$d]})")
    fi
  done
  if [ ${#up[@]} -eq 0 ]; then
    echo "ok $n - $m (layer ${layer[$m]}) uses nothing above it"
  else
    echo "not ok $n - $m (layer ${layer[$m]}) calls up: ${up[*]}"
    status=1
  fi
done
echo "1..$n"
exit $status

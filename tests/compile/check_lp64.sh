#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_hardening.c's finding 9: a 32-bit (-m32) or x32 (-mx32) build of the
# public headers must stop at compile time with the library's own #error, not
# compile and miscount.  Each target is checked only if the compiler can produce
# it (skipped with a message otherwise); the native build must compile.  Usage:
# check_lp64.sh CC INCLUDE_DIR
set -u
cc=$1
include=$2
src='#include <percpuref/compiler.h>
int main(void) { return 0; }'
status=0

if ! printf '%s\n' "$src" | "$cc" -fsyntax-only -I"$include" -x c -; then
  echo "not ok - the native build does not compile"
  exit 1
fi
echo "ok - native 64-bit build compiles"
for flag in -m32 -mx32; do
  if ! echo 'int x;' | "$cc" "$flag" -fsyntax-only -x c - 2>/dev/null; then
    echo "# skipped $flag: the compiler cannot target it"
    continue
  fi
  out=$(printf '%s\n' "$src" | "$cc" "$flag" -fsyntax-only -I"$include" -x c - 2>&1)
  if [ $? -ne 0 ] && grep -q 'needs a 64-bit (LP64) target' <<<"$out"; then
    echo "ok - $flag build refused with the library's #error"
  else
    echo "not ok - $flag build was not refused: $out"
    status=1
  fi
done
exit $status

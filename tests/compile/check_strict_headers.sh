#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The public headers under the strict warnings users build with, as
# errors, by gcc and (when installed: scripts/deps.sh installs it) clang:
# each C header alone as C11, and tests/cxx/headers_cxx.cpp (every header,
# every inline function called) as C++17 and C++20.  clang warned where gcc did not
# (-Wcast-align on the rseq area's address; -Wold-style-cast and
# -Wzero-as-null-pointer-constant in C++), so both are asked.  The C++
# file is compiled to an object, optimised: parsing alone never reaches
# the back end nor clang's integrated assembler, which are what read the
# fast paths' inline asm (an operand or a directive gas accepts and clang
# refuses fails only there).
# Usage: check_strict_headers.sh INCLUDE_DIR HEADERS_CXX_SOURCE
set -u
include=$1
cxx_source=$2
status=0
common=(-Werror -Wall -Wextra -Wpedantic -Wconversion -Wsign-conversion -Wshadow -Wcast-qual
        -Wundef -Wredundant-decls)
c_flags=(-std=c11 -Wstrict-prototypes -Wmissing-prototypes -Wold-style-definition)
cxx_flags=(-Wold-style-cast -Wzero-as-null-pointer-constant)

check() {	# what, compiler, flags...
  local what=$1 out
  shift
  if out=$("$@" 2>&1); then
    echo "ok - $what"
  else
    echo "not ok - $what"
    sed 's/^/# /' <<<"$out" | head -20
    status=1
  fi
}

for pair in gcc:g++ clang:clang++; do
  cc=${pair%%:*}
  cxx=${pair##*:}
  if ! command -v "$cc" >/dev/null || ! command -v "$cxx" >/dev/null; then
    echo "# skipped $cc: not installed"
    continue
  fi
  # gcc's -Wcast-align checks only targets that need alignment; =strict
  # checks all, as clang's does.
  if [ "$cc" = gcc ]; then align=-Wcast-align=strict; else align=-Wcast-align; fi
  for header in "$include"/percpuref/*.h; do
    name=percpuref/$(basename "$header")
    check "$cc: <$name> alone, C11, strict warnings" \
      "$cc" -fsyntax-only -I"$include" "${common[@]}" "${c_flags[@]}" "$align" -x c - \
      <<<"#include <$name>
typedef int translation_unit_not_empty;"
  done
  for std in c++17 c++20; do
    check "$cxx: every header and inline function, $std, strict warnings" \
      "$cxx" -c -O2 -o /dev/null -I"$include" "${common[@]}" "${cxx_flags[@]}" -std=$std \
      "$align" "$cxx_source"
  done
done
exit $status

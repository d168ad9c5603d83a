#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The library's sources compile, with the project's warnings as errors, by
# compilers other than the build's: musl's (musl-gcc, Debian's musl-tools),
# so that no glibc-only interface creeps in (up to 0.4.3 one had:
# pthread_rwlockattr_setkind_np), the oldest gcc and clang that Debian
# 12 ships (gcc-11, Ubuntu 22.04's default; clang-13, whose back end could
# not compile the thread pointer up to 0.4.6) and its clang (14).  Compiled at -O2,
# so that the back end and the assembler read the inline asm; not linked
# or run: Debian ships no musl build of liburcu (docs/percpu_ref.md,
# "Platform", has a run by hand), and the fast paths compiled by clang 13
# run in the clang13_test_fast_path tests.  For musl the kernel's headers
# and liburcu's are the system's, through a directory of links that holds
# them alone, so that no glibc header is found in place of a missing musl
# one.  A compiler that is not installed is skipped (scripts/deps.sh
# installs them all).  Usage: check_compilers.sh SOURCE_DIR SCRATCH_DIR
set -eu
src=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch/include"
ln -s /usr/include/linux /usr/include/asm-generic "$scratch/include/"
triplet=$(gcc -print-multiarch)
ln -s "/usr/include/$triplet/asm" "/usr/include/$triplet/urcu" "$scratch/include/"
status=0
n=0
for cc in musl-gcc gcc-11 clang-13 clang; do
  if ! command -v "$cc" >/dev/null; then
    n=$((n + 1))
    echo "ok $n - # SKIP $cc not installed"
    continue
  fi
  extra=()
  if [ "$cc" = musl-gcc ]; then extra=(-idirafter "$scratch/include"); fi
  mkdir -p "$scratch/$cc"
  for c in "$src"/src/*.c; do
    n=$((n + 1))
    if "$cc" -std=gnu11 -O2 -Wall -Wextra -Wshadow -Wno-unused-parameter -Werror \
         -fvisibility=hidden -DPERCPUREF_BUILDING=1 -I"$src/include" -I"$src/src" \
         "${extra[@]}" -c "$c" -o "$scratch/$cc/$(basename "$c" .c).o"; then
      echo "ok $n - $(basename "$c") compiles with $cc"
    else
      echo "not ok $n - $(basename "$c") does not compile with $cc"
      status=1
    fi
  done
done
echo "1..$n"
exit $status

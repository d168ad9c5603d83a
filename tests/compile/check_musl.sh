#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The library's sources compile with musl (musl-gcc, Debian's musl-tools)
# and the project's warnings as errors: no glibc-only interface creeps in
# (up to 0.4.3 one had: pthread_rwlockattr_setkind_np).  Compiled, not
# linked or run: Debian ships no musl build of liburcu (docs/percpu_ref.md,
# "Platform", has a run by hand).  The kernel's headers and liburcu's are
# the system's, through a directory of links that holds them alone, so
# that no glibc header is found in place of a missing musl one.  Usage:
# check_musl.sh SOURCE_DIR SCRATCH_DIR
set -eu
src=$1
scratch=$2
if ! command -v musl-gcc >/dev/null; then
  echo "1..0 # SKIP musl-gcc not installed (scripts/deps.sh installs musl-tools)"
  exit 0
fi
triplet=$(gcc -print-multiarch)
rm -rf "$scratch"
mkdir -p "$scratch/include"
ln -s /usr/include/linux /usr/include/asm-generic "$scratch/include/"
ln -s "/usr/include/$triplet/asm" "/usr/include/$triplet/urcu" "$scratch/include/"
status=0
n=0
for c in "$src"/src/*.c; do
  n=$((n + 1))
  if musl-gcc -std=gnu11 -O2 -Wall -Wextra -Wshadow -Wno-unused-parameter -Werror \
       -fvisibility=hidden -DPERCPUREF_BUILDING=1 -I"$src/include" -I"$src/src" \
       -idirafter "$scratch/include" -c "$c" -o "$scratch/$(basename "$c" .c).o"; then
    echo "ok $n - $(basename "$c") compiles with musl"
  else
    echo "not ok $n - $(basename "$c") does not compile with musl"
    status=1
  fi
done
echo "1..$n"
exit $status

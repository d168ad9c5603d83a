#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The argument checks of the two scripts that run everything as root:
# scripts/test.sh (the README's test command) and kernel/run.sh.  Before
# 0.4.26 "scripts/test.sh --help" started the whole run (apt, five builds,
# the kernel series), "KERNEL_TESTS=no" ran the kernel series, and
# "kernel/run.sh --install --prefixes" ran --install alone.
#
# Each script runs as a copy in a scratch tree that holds nothing else,
# with stubs first on PATH for every command a regressed check would reach
# next (apt-get, sudo, dpkg-query, git, tar, id): a check that let a bad
# argument through fails at its next step, inside the scratch tree, instead
# of installing or building anything.  The controls (valid arguments reach
# that next step) show that the scratch tree tells the two apart.
# Usage: check_script_args.sh SOURCE_DIR
set -u
src=$1
# Each case sets what it tests, nothing is inherited: a KERNEL_BUILD from
# the caller's environment (scripts/test.sh runs this under its own) had
# the controls remove and unpack a real kernel tree there.
unset KERNEL_BUILD JOBS KERNEL_TESTS STRESS_SECONDS
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' HUP INT TERM
# Absolute, and without a ':': the stubs' folder goes first on PATH, which
# a relative folder (after the cases' cd) or a ':' would take out of it.
tmp=$(cd "$tmp" && pwd -P) || exit 1
case $tmp in
*:*) echo "Bail out! the scratch folder $tmp holds a ':', which PATH splits"; exit 1 ;;
esac
# The scratch folder as an extended regular expression matches it.
tmp_re=$(printf '%s\n' "$tmp" | sed 's/[][\.*^$+?(){}|]/\\&/g')
mkdir -p "$tmp/tree/scripts" "$tmp/tree/kernel" "$tmp/bin"
cp "$src/scripts/test.sh" "$tmp/tree/scripts/"
cp "$src/kernel/run.sh" "$tmp/tree/kernel/"
for cmd in apt-get sudo git tar; do
  printf '#!/bin/sh\necho "stub %s $*" >&2\nexit 97\n' "$cmd" >"$tmp/bin/$cmd"
done
# Not root (test.sh skips the kernel series' packages); every kernel
# package installed (run.sh installs nothing).
printf '#!/bin/sh\necho 1000\n' >"$tmp/bin/id"
printf '#!/bin/sh\nprintf "install ok installed"\n' >"$tmp/bin/dpkg-query"
chmod +x "$tmp/bin"/*
for cmd in apt-get sudo git tar id dpkg-query; do
  if [ "$(PATH="$tmp/bin:$PATH" command -v "$cmd")" != "$tmp/bin/$cmd" ]; then
    echo "Bail out! $cmd is not its stub on the cases' PATH"
    exit 1
  fi
done
status=0
n=0

# expect DESCRIPTION STATUS PATTERN COMMAND...: runs COMMAND in the
# scratch tree with the stubs; its exit status must be STATUS and its
# stderr must match PATTERN (grep -E), or be empty if PATTERN is.
expect() {
  local what=$1 want=$2 pattern=$3 got matched
  shift 3
  n=$((n + 1))
  (cd "$tmp/tree" && PATH="$tmp/bin:$PATH" timeout 20 "$@") \
    >"$tmp/out" 2>"$tmp/err" </dev/null
  got=$?
  if [ -z "$pattern" ]; then
    [ ! -s "$tmp/err" ]
  else
    grep -Eq -- "$pattern" "$tmp/err"
  fi
  matched=$?
  if [ "$got" -eq "$want" ] && [ "$matched" -eq 0 ]; then
    echo "ok $n - $what"
  else
    echo "not ok $n - $what: exit $got (want $want), stderr:"
    sed 's/^/#   /' "$tmp/err"
    status=1
  fi
}

t=scripts/test.sh
expect "test.sh --help refused" 2 '^usage: ' bash $t --help
expect "test.sh with two arguments refused" 2 '^usage: ' bash $t a b
expect "test.sh with an empty argument refused" 2 '^usage: ' bash $t ''
for v in no false off 2 ' 1' 00 1x; do
  expect "test.sh KERNEL_TESTS='$v' refused" 2 "KERNEL_TESTS=$v: want 0" \
    env KERNEL_TESTS="$v" bash $t
done
for v in 0 abc 1000000 -1 1.5 08; do
  expect "test.sh STRESS_SECONDS='$v' refused" 2 "STRESS_SECONDS=$v: want whole seconds" \
    env STRESS_SECONDS="$v" bash $t
done
# Controls: accepted, on to the packages stage, which the scratch tree
# lacks (scripts/deps.sh: 127, command not found).
expect "control: test.sh with no argument reaches its packages stage" 127 'deps.sh' bash $t
expect "control: KERNEL_TESTS=0 STRESS_SECONDS=999999 accepted" 127 'deps.sh' \
  env KERNEL_TESTS=0 STRESS_SECONDS=999999 bash $t

k=kernel/run.sh
expect "run.sh --install --prefixes refused" 2 '^usage: kernel/run.sh' bash $k --install --prefixes
expect "run.sh --prepare --prefixes refused" 2 '^usage: kernel/run.sh' bash $k --prepare --prefixes
expect "run.sh --installx refused" 2 '^usage: kernel/run.sh' bash $k --installx
expect "run.sh --help refused" 2 '^usage: kernel/run.sh' bash $k --help
expect "run.sh with an empty argument refused" 2 '^usage: kernel/run.sh' bash $k ''
for v in 0 abc 10000 -2 ' 4' 08; do
  expect "run.sh JOBS='$v' refused" 2 "JOBS=$v: want a whole number" env JOBS="$v" bash $k
done
# Controls: --install finds every package (the dpkg-query stub) and does
# nothing more; no argument goes on to unpack the source, the git stub's
# 97, and a relative KERNEL_BUILD is taken from the current folder.
expect "control: run.sh --install with every package installed" 0 '' bash $k --install
expect "control: run.sh with no argument reaches the unpacking" 97 \
  "unpacking linux-source-6.12 into $tmp_re/tree/kernel/build\$" bash $k
expect "control: a relative KERNEL_BUILD is made absolute" 97 \
  "unpacking linux-source-6.12 into $tmp_re/tree/rel/kb\$" env KERNEL_BUILD=rel/kb JOBS=9999 bash $k
echo "1..$n"
exit $status

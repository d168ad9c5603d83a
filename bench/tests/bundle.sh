#!/bin/sh
# SPDX-License-Identifier: MIT
# bundle.sh BENCH - scripts/bundle.sh packs this build's benchmarks so that
# they run where nothing is installed: the usage errors (2; 1 for a build
# without the benchmarks), every library besides the C and C++ runtimes
# resolved from the bundle, and the packed run.sh: its usage errors, and a
# short run of two workloads that leaves the tables and JSON it promises.
set -u
bench=$1
build=$(dirname "$(dirname "$bench")")
bundle_sh=$(dirname "$0")/../../scripts/bundle.sh
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() { # check DESCRIPTION CONDITION...
	what=$1
	shift
	if "$@"; then
		echo "ok: $what"
	else
		echo "FAIL: $what"
		fails=$((fails + 1))
	fi
}
status_of() { # status_of WANT COMMAND...: the command exits with WANT
	want=$1
	shift
	"$@" >"$tmp/out" 2>"$tmp/err"
	got=$?
	[ "$got" -eq "$want" ] || { echo "  exit $got, want $want"; sed 's/^/  /' "$tmp/err"; false; }
}

check "bundle.sh without arguments: exit 2" status_of 2 bash "$bundle_sh"
check "bundle.sh on a folder with no benchmarks: exit 1" status_of 1 bash "$bundle_sh" "$tmp" "$tmp/b"
mkdir "$tmp/keep" && touch "$tmp/keep/precious"
check "bundle.sh onto a folder that is not a bundle: exit 1" \
	status_of 1 bash "$bundle_sh" "$build" "$tmp/keep"
check "and the folder is kept" test -e "$tmp/keep/precious"
check "bundle.sh packs this build" status_of 0 bash "$bundle_sh" "$build" "$tmp/b"
check "bundle.sh replaces its own bundle" status_of 0 bash "$bundle_sh" "$build" "$tmp/b"

# Every library that is not the C or C++ runtime comes from the bundle.
LD_LIBRARY_PATH=$tmp/b/lib ldd "$tmp/b/bin/percpuref-bench" >"$tmp/ldd"
check "no library is missing" sh -c "! grep -q 'not found' '$tmp/ldd'"
check "liburcu-bp is loaded from the bundle" grep -q "=> $tmp/b/lib/liburcu-bp" "$tmp/ldd"

run=$tmp/b/run.sh
check "run.sh --bogus: exit 2" status_of 2 "$run" --bogus
check "run.sh with an unknown workload: exit 2" status_of 2 "$run" --out "$tmp/none" nosuch
check "and nothing measured" test ! -e "$tmp/none"
check "run.sh --out without a folder: exit 2" status_of 2 "$run" --out
check "run.sh --help: exit 0" status_of 0 "$run" --help
check "run.sh --quick --threads 1 micro anatomy" \
	status_of 0 "$run" --quick --threads 1 --out "$tmp/res" micro anatomy
for f in machine.txt micro.txt micro.json anatomy.txt; do
	check "run.sh wrote $f" test -s "$tmp/res/$f"
done
check "micro.json has a row per variant" \
	sh -c "[ \$(grep -c '\"variant\"' '$tmp/res/micro.json') -ge 4 ]"
check "machine.txt names the fast path" grep -q "fast path" "$tmp/res/machine.txt"

[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "all passed"

#!/bin/sh
# SPDX-License-Identifier: MIT
# bundle.sh BENCH - scripts/bundle.sh packs this build's benchmarks so that
# they run where nothing is installed: the usage errors (2; 1 for a build
# without the benchmarks), every library besides the C and C++ runtimes
# resolved from the bundle, and the packed run.sh: its usage errors, and a
# short run of two workloads that leaves the tables and JSON it promises.
. "$(dirname -- "$0")/lib/preamble.sh"
build=$(dirname "$(dirname "$bench")")
bundle_sh=$(dirname "$0")/../../scripts/bundle.sh

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
# An empty folder name (an unset variable) is a usage error: an empty
# BUNDLE_DIR packed into the default, build/bundle under the current
# folder, and an empty BUILD_DIR looked for /bench/percpuref-bench.
check "bundle.sh with an empty BUNDLE_DIR: exit 2" \
	status_of 2 sh -c 'cd "$1" && exec bash "$2" "$3" ""' sh "$tmp" "$(readlink -f "$bundle_sh")" \
	"$(readlink -f "$build")"
check "and nothing packed" test ! -e "$tmp/build"
check "bundle.sh with an empty BUILD_DIR: exit 2" status_of 2 bash "$bundle_sh" "" "$tmp/b"
mkdir "$tmp/keep" && touch "$tmp/keep/precious"
check "bundle.sh onto a folder that is not a bundle: exit 1" \
	status_of 1 bash "$bundle_sh" "$build" "$tmp/keep"
check "and the folder is kept" test -e "$tmp/keep/precious"
check "bundle.sh packs this build" status_of 0 bash "$bundle_sh" "$build" "$tmp/b"
mkdir "$tmp/b/results-kept"
check "bundle.sh replaces its own bundle" status_of 0 bash "$bundle_sh" "$build" "$tmp/b"
check "and keeps the results beside it" test -d "$tmp/b/results-kept"
mkdir "$tmp/half" && echo "# Runs the packed percpuref benchmarks (unfinished)" >"$tmp/half/run.sh"
check "bundle.sh finishes a bundle that failed halfway" \
	status_of 0 bash "$bundle_sh" "$build" "$tmp/half"

# Every library of either binary that is not the C or C++ runtime comes
# from the bundle (ldd would otherwise find this machine's copies).
LD_LIBRARY_PATH=$tmp/b/lib ldd "$tmp/b/bin/percpuref-bench" "$tmp/b/bin/percpuref-anatomy" \
	>"$tmp/ldd"
check "no library is missing" sh -c "! grep -q 'not found' '$tmp/ldd'"
awk -v lib="$tmp/b/lib/" '$2 == "=>" && index($3, lib) != 1 &&
	$1 !~ /^(libc|libm|libmvec|libpthread|libdl|librt|libstdc\+\+|libgcc_s)\.so/' \
	"$tmp/ldd" >"$tmp/outside"
check "every other library comes from the bundle" test ! -s "$tmp/outside"
check "liburcu-bp is one of them" grep -q "=> $tmp/b/lib/liburcu-bp" "$tmp/ldd"

run=$tmp/b/run.sh
check "run.sh --bogus: exit 2" status_of 2 "$run" --bogus
check "run.sh with an unknown workload: exit 2" status_of 2 "$run" --out "$tmp/none" nosuch
check "and nothing measured" test ! -e "$tmp/none"
check "run.sh --out without a folder: exit 2" status_of 2 "$run" --out
check "run.sh --out '' (no name, not the current folder): exit 2" status_of 2 "$run" --out "" micro
check "run.sh --help: exit 0" status_of 0 "$run" --help
# A repeated option is refused, as percpuref-bench refuses one: the last
# one silently won (--out a/ --out b/ wrote only b/).
check "run.sh --threads twice: exit 2" status_of 2 "$run" --threads 1 --threads 2 --out "$tmp/none" micro
check "run.sh --out twice: exit 2" status_of 2 "$run" --out "$tmp/none" --out "$tmp/none2" micro
check "and nothing written" test ! -e "$tmp/none" -a ! -e "$tmp/none2"
check "run.sh --out onto a file: exit 2" status_of 2 "$run" --out "$tmp/ldd" micro
check "run.sh with a pattern for a workload: exit 2" status_of 2 "$run" --out "$tmp/none" 'mic.o'
mkdir "$tmp/elsewhere" && ln -s "$run" "$tmp/elsewhere/bench-run"
check "run.sh through a symlink finds its bundle" status_of 0 "$tmp/elsewhere/bench-run" --help
check "run.sh --quick --threads 1 micro anatomy" \
	status_of 0 "$run" --quick --threads 1 --out "$tmp/res" micro anatomy
for f in machine.txt micro.txt micro.json anatomy.txt; do
	check "run.sh wrote $f" test -s "$tmp/res/$f"
done
# An --out that starts with '-' is a folder, not an option of tee's.
check "run.sh --out -res (a name starting with '-')" \
	sh -c 'cd "$1" && "$2" --quick --threads 1 --out -res micro >/dev/null && test -s ./-res/micro.json' \
	sh "$tmp" "$run"
# A bad --threads is refused before anything is written: it failed in
# the first workload, machine.txt and micro.txt already overwritten.
cp "$tmp/res/machine.txt" "$tmp/machine.before"
check "run.sh --threads ,: exit 2" status_of 2 "$run" --threads , --out "$tmp/res" micro
check "and machine.txt kept" cmp -s "$tmp/machine.before" "$tmp/res/machine.txt"
check "and micro.txt kept" test -s "$tmp/res/micro.txt"
# ... and so is a --threads past the CPUs, which every workload but signal1
# refuses: the check allowed it for signal1's sake, and micro failed after
# machine.txt and micro.txt were overwritten.  signal1 alone still takes it.
over=$(($("$bench" --topology | sed -n 's/^machine: .*; \([0-9]*\) of .*/\1/p') + 1))
check "run.sh --threads $over micro: exit 2" status_of 2 "$run" --threads "$over" --out "$tmp/res" micro
check "and machine.txt kept" cmp -s "$tmp/machine.before" "$tmp/res/machine.txt"
check "and micro.txt kept" test -s "$tmp/res/micro.txt"
check "run.sh --quick --threads $over signal1" \
	status_of 0 "$run" --quick --threads "$over" --out "$tmp/res" signal1
# Every workload is checked before anything is written, with its own
# arguments: a --threads that signal1's limit on pending signals refuses
# (it failed after machine.txt and micro.txt were overwritten) ...
cp "$tmp/res/machine.txt" "$tmp/machine.before"
check "run.sh --threads 1 micro signal1, 0 pending signals allowed: exit 2" \
	status_of 2 prlimit --sigpending=0 "$run" --threads 1 --out "$tmp/res" micro signal1
check "naming signal1's limit" grep -q 'signal1: bad arguments' "$tmp/err"
check "and machine.txt kept" cmp -s "$tmp/machine.before" "$tmp/res/machine.txt"
# ... and managed-scan, one scan at a time, runs one thread whatever
# --threads says (two refused it after the others had run).
check "run.sh --quick --threads 1,2 managed-scan" \
	status_of 0 "$run" --quick --threads 1,2 --out "$tmp/res" managed-scan
check "managed-scan.json has one-thread rows only" \
	sh -c "grep -q '\"threads\":1,' '$tmp/res/managed-scan.json' &&
	       ! grep -q '\"threads\":[02-9]' '$tmp/res/managed-scan.json'"
# managed-hot: the scans' share of idle throughput, paired (--versus idle).
check "run.sh --quick --threads 1 managed-hot" \
	status_of 0 "$run" --quick --threads 1 --out "$tmp/res" managed-hot
check "managed-hot.txt pairs the scans with idle" grep -q '^versus idle: ' "$tmp/res/managed-hot.txt"
check "managed-hot.json names idle as the reference" \
	grep -q '"versus":{"variant":"idle"' "$tmp/res/managed-hot.json"
check "micro.json has a row per variant" \
	sh -c "[ \$(grep -c '\"variant\"' '$tmp/res/micro.json') -ge 4 ]"
check "machine.txt names the fast path" grep -q "fast path" "$tmp/res/machine.txt"
# switch-storm-in-flight: switch-storm with threads that do not wait for
# each batch, in the default set (the JSON names the option's value and
# the rows --threads asked for).
check "run.sh runs switch-storm-in-flight by default" \
	grep -Eq '^[[:space:]]*workloads=\(.* switch-storm-in-flight ' "$run"
check "run.sh --quick --threads 1 switch-storm-in-flight" \
	status_of 0 "$run" --quick --threads 1 --out "$tmp/res" switch-storm-in-flight
check "switch-storm-in-flight.txt has its table" \
	grep -q '^ *1  1C1T ' "$tmp/res/switch-storm-in-flight.txt"
check "switch-storm-in-flight.json ran --in-flight 16" \
	grep -q '"in-flight":16' "$tmp/res/switch-storm-in-flight.json"
check "switch-storm-in-flight.json has the rows of --threads 1 only" \
	sh -c "grep -q '\"threads\":1,' '$tmp/res/switch-storm-in-flight.json' &&
	       ! grep -q '\"threads\":[02-9]' '$tmp/res/switch-storm-in-flight.json'"

finish

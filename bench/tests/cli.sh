#!/bin/sh
# SPDX-License-Identifier: MIT
# cli.sh BENCH - the command line of percpuref-bench: exit statuses of the
# usage errors (2, with the usage on stderr, before anything is measured),
# --help (0), and the JSON Lines of --json - (one valid object per row and
# variant, with the fields docs/bench.md promises, a workload's metrics
# included).  Runs are a few
# milliseconds each, so the test suits every build, sanitizers included.
. "$(dirname -- "$0")/lib/preamble.sh"

# expect STATUS ARGS...: run BENCH ARGS, want STATUS; 2 also wants the
# usage on stderr and nothing on stdout (no table: nothing was measured).
expect() {
	want=$1
	shift
	"$bench" "$@" >"$tmp/out" 2>"$tmp/err"
	got=$?
	if [ "$got" -ne "$want" ]; then
		echo "FAIL: percpuref-bench $*: exit $got, want $want"
		sed 's/^/  stderr: /' "$tmp/err" | head -5
		fails=$((fails + 1))
	elif [ "$want" -eq 2 ] && { ! grep -q '^usage: percpuref-bench' "$tmp/err" ||
				    [ -s "$tmp/out" ]; }; then
		echo "FAIL: percpuref-bench $*: no usage on stderr, or output on stdout"
		fails=$((fails + 1))
	else
		echo "ok: percpuref-bench $* -> $got"
	fi
}

cpus=$("$bench" --topology | sed -n 's/^machine: .*; \([0-9]*\) of .*/\1/p')
over=$((cpus + 1))
# Long enough that a point finishes operations on a loaded machine: a
# measurement window with none has no ns/op to report.
short="--duration 0.05"

expect 2
expect 2 no-such-workload
expect 2 micro --no-such-flag
expect 2 micro --threads
expect 2 micro --threads 0
expect 2 micro --threads 2-1
expect 2 micro --threads x
# Empty elements, and numbers that do not start with a digit: strtoul()
# alone would skip the blank, take the sign, and wrap "-18446744073709551615"
# to 1.
expect 2 micro --threads 1,,2 --variants private $short
expect 2 micro --threads 1, --variants private $short
expect 2 micro --threads ,1 --variants private $short
expect 2 micro --threads " 1" --variants private $short
expect 2 micro --threads +1 --variants private $short
expect 2 micro --threads 1-+2 --variants private $short
expect 2 micro --threads -18446744073709551615 --variants private $short
# Ranges that overlap name at most 65536 counts: each element was stored
# before the duplicates went, so 16000 copies of 1-65536 (an argument of
# 128 KB) took 4 GiB and minutes of sorting.  Under a 1 GiB limit on the
# address space that failed, "out of memory"; skipped where the bench
# cannot start under one (a sanitizer's shadow memory: ThreadSanitizer's
# dies by SIGSEGV, reported inside the subshell, which does not exec it).
if (ulimit -v 1048576 && "$bench" --version; exit) >/dev/null 2>&1; then
	many=$(yes 1-65536 | head -n 16000 | tr '\n' ,)1
	(ulimit -v 1048576 && exec "$bench" micro --threads "$many" --variants private $short) \
		>/dev/null 2>"$tmp/err"
	got=$?
	if [ "$got" -eq 2 ] && grep -q '^percpuref-bench: --threads 65536: only' "$tmp/err"; then
		echo "ok: percpuref-bench micro --threads 1-65536,...(16000 times) -> 2"
	else
		echo "FAIL: percpuref-bench micro --threads 1-65536,...(16000 times): exit $got," \
		     "$(head -1 "$tmp/err")"
		fails=$((fails + 1))
	fi
else
	echo "ok: --threads of 16000 ranges # skip: no run under ulimit -v"
fi
expect 2 micro --threads "$over" $short
expect 2 micro --variants no-such-variant
# Empty names: strtok_r() alone skipped them and ran the rest.
expect 2 micro --variants private,,kref --threads 1 $short
expect 2 micro --variants private, --threads 1 $short
expect 2 micro --variants ,private --threads 1 $short
expect 2 micro --duration 0
expect 2 micro --duration -1
expect 2 micro --duration 1s
expect 2 micro --duration 1e-300 --threads 1 --variants private
expect 2 micro --hang-limit 0 --threads 1 --variants private
expect 2 micro --hang-limit 86401 --threads 1 --variants private
expect 2 micro --hang-limit 1m --threads 1 --variants private
expect 2 micro --repeat 0
# Past 32 bits: once truncated to 1000 and run.
expect 2 micro --repeat 4294968296 --threads 1 --variants private $short
expect 2 micro --repeat -18446744073709551615 --threads 1 --variants private $short
expect 2 micro --stat mean
expect 2 micro --baseline 0
expect 2 micro --baseline x
expect 2 micro --baseline
expect 2 micro --baseline 4294967298 --threads 1 --variants private $short
expect 2 micro --baseline +1 --threads 1 --variants private $short
expect 2 micro extra-argument
# An unknown short option inside a cluster is named, not the argument
# before it; a --baseline row past the CPUs is blamed on --baseline.
expect 2 micro --threads 1 -xyz
grep -q 'unknown option -x$' "$tmp/err" ||
	{ echo "FAIL: -xyz: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
expect 2 micro --baseline "$over"
grep -q "^percpuref-bench: --baseline $over:" "$tmp/err" ||
	{ echo "FAIL: --baseline $over: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
# --versus names a variant the run measures, beside at least one other.
expect 2 micro --threads 1 --variants private,kref --versus
expect 2 micro --threads 1 --variants private,kref --versus no-such-variant $short
expect 2 micro --threads 1 --variants private,kref --versus rcuref $short
grep -q '^percpuref-bench: --versus rcuref: not one of the variants' "$tmp/err" ||
	{ echo "FAIL: --versus rcuref: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
expect 2 micro --threads 1 --variants private --versus private $short
grep -q '^percpuref-bench: --versus private: no other variant' "$tmp/err" ||
	{ echo "FAIL: --versus alone: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
expect 2 micro --threads 1 --variants private,kref --versus kref --versus private $short
expect 2 micro --threads 1 --variants private,kref --versus rcuref --dry-run
# Where the library's threads run: a list that is not one, from the option
# or the environment (which the library only warns about), fails the run
# rather than measuring another placement; a good one is in the header.
expect 2 micro --library-cpus zz --threads 1 --variants private $short
grep -q '^percpuref-bench: --library-cpus zz: not a list of CPUs' "$tmp/err" ||
	{ echo "FAIL: --library-cpus zz: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
expect 2 micro --library-cpus "" --threads 1 --variants private $short
# A CPU the machine lacks (the last the library's lists take) is refused
# too, though no library thread ran yet: up to 0.4.6 the run went on,
# the header naming it, the library only warning.
expect 2 micro --library-cpus 8191 --threads 1 --variants kref $short
grep -q '^percpuref-bench: --library-cpus 8191: not a list of CPUs' "$tmp/err" ||
	{ echo "FAIL: --library-cpus 8191: $(grep -v '^percpuref: ' "$tmp/err" | head -1)"
	  fails=$((fails + 1)); }
export PERCPUREF_LIBRARY_CPUS=zz
expect 2 micro --threads 1 --variants private $short
unset PERCPUREF_LIBRARY_CPUS
grep -q '^percpuref-bench: PERCPUREF_LIBRARY_CPUS=zz: not a list of CPUs' "$tmp/err" ||
	{ echo "FAIL: PERCPUREF_LIBRARY_CPUS=zz: $(grep -v '^percpuref: ' "$tmp/err" | head -1)"
	  fails=$((fails + 1)); }
first_cpu=$("$bench" --topology | sed -n 's/^placement: \([0-9]*\).*/\1/p')
for how in option environment; do
	if [ $how = option ]; then
		"$bench" micro --library-cpus "$first_cpu" --threads 1 --variants private $short \
			--json "$tmp/placed.json" >"$tmp/out" 2>"$tmp/err"
	else
		PERCPUREF_LIBRARY_CPUS=$first_cpu "$bench" micro --threads 1 --variants private \
			$short --json "$tmp/placed.json" >"$tmp/out" 2>"$tmp/err"
	fi
	if grep -q "^library threads: CPUs $first_cpu\$" "$tmp/out" &&
	   grep -q "\"library_cpus\":\"$first_cpu\"" "$tmp/placed.json"; then
		echo "ok: library threads on CPU $first_cpu ($how), in the header and the JSON"
	else
		echo "FAIL: library threads on CPU $first_cpu ($how): $(sed -n 4p "$tmp/out")"
		fails=$((fails + 1))
	fi
done
# The PERCPUREF_ environment and the fences the fast path makes are named
# in the header and the JSON: on the fallback, a run under
# PERCPUREF_NO_MEMBARRIER=1 (readers fence) took 3 times as long a pair
# under the same "fast path: fallback", and a sandbox that refuses
# membarrier does the same unnamed.
PERCPUREF_NO_RSEQ=1 PERCPUREF_NO_MEMBARRIER=1 "$bench" micro --threads 1 --variants private \
	$short --json - >"$tmp/out" 2>"$tmp/err"
if grep -q '"environment":{[^}]*"PERCPUREF_NO_MEMBARRIER":"1"' "$tmp/out" &&
   grep -q '^environment: PERCPUREF_NO_MEMBARRIER=1$' "$tmp/err" &&
   grep -q '"fences":"reader-fences"' "$tmp/out" && grep -q '^fences: reader-fences$' "$tmp/err" &&
   "$bench" --topology | grep -q '^fences: [a-z-]*$'; then
	echo "ok: PERCPUREF_NO_MEMBARRIER=1 and reader fences named in the header and the JSON"
else
	echo "FAIL: PERCPUREF_NO_MEMBARRIER=1 or reader fences not named:"
	grep '^environment\|^fences' "$tmp/err" | sed 's/^/  /'
	fails=$((fails + 1))
fi
# Any bytes in a value: the JSON stays UTF-8 (plot.py refused the whole
# file), and a newline does not make a header line of its own.
PERCPUREF_ODD=$(printf '\377\nfast path: forged') "$bench" micro --threads 1 \
	--variants private $short --json - >"$tmp/out" 2>"$tmp/err"
if "$python" -c '
import json, sys
rec = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))
assert rec["environment"]["PERCPUREF_ODD"] == "\ufffd\nfast path: forged", rec["environment"]
' "$tmp/out" && [ "$(grep -ac '^fast path:' "$tmp/err")" = 1 ] &&
   [ "$(grep -ac '^environment: PERCPUREF_ODD=' "$tmp/err")" = 1 ]; then
	echo "ok: odd environment values: UTF-8 JSON, one header line each"
else
	echo "FAIL: odd environment values"
	sed 's/^/  /' "$tmp/err" | head -8
	fails=$((fails + 1))
fi
# A name twice in the environment (only a raw execve makes one): named
# once, with the value getenv() and so the library read, the first (two
# walks of environ wrote a JSON object with a duplicate key, whose value
# a reader takes from the last).
if "$python" -c '
import ctypes, sys
args = [a.encode() for a in sys.argv[1:]]
env = [b"PERCPUREF_TWICE=first", b"PERCPUREF_TWICE=second"]
argv = (ctypes.c_char_p * (len(args) + 1))(*args, None)
envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
ctypes.CDLL(None, use_errno=True).execve(args[0], argv, envp)
sys.exit("execve: errno %d" % ctypes.get_errno())
' "$bench" micro --threads 1 --variants private $short --json - >"$tmp/out" 2>"$tmp/err" &&
   [ "$(grep -o '"PERCPUREF_TWICE"' "$tmp/out" | wc -l)" = 1 ] &&
   grep -q '"PERCPUREF_TWICE":"first"' "$tmp/out" &&
   [ "$(grep -c '^environment: PERCPUREF_TWICE=' "$tmp/err")" = 1 ] &&
   grep -q '^environment: PERCPUREF_TWICE=first$' "$tmp/err"; then
	echo "ok: a name twice in the environment: named once, with its first value"
else
	echo "FAIL: a name twice in the environment"
	grep -o '"environment":{[^}]*}' "$tmp/out" | sed 's/^/  /'
	grep '^environment' "$tmp/err" | sed 's/^/  /'
	fails=$((fails + 1))
fi
# Every micro variant on each fast path: the unprotected lower bound read
# the cpu_id of a thread that the library's own rseq registration had not
# yet registered (-1) and added far outside the counter (SIGSEGV).
for fast_path in "GLIBC_TUNABLES=glibc.pthread.rseq=0" "PERCPUREF_NO_RSEQ=1"; do
	env "$fast_path" "$bench" micro --threads 1,2 $short >"$tmp/out" 2>"$tmp/err"
	got=$?
	if [ "$got" -eq 0 ] && grep -q '^ *2 ' "$tmp/out"; then
		echo "ok: micro, every variant, under $fast_path ($(sed -n 's/^fast path: //p' "$tmp/out"))"
	else
		echo "FAIL: micro under $fast_path: exit $got"
		sed 's/^/  /' "$tmp/err" | head -5
		fails=$((fails + 1))
	fi
done
# Results that cannot be written (a full disk) are an error, not exit 0.
# expect_full ARGS...: BENCH ARGS with standard output on a full disk
# must fail, saying so.
expect_full() {
	"$bench" "$@" >/dev/full 2>"$tmp/err"
	got=$?
	if [ "$got" -ne 1 ] || ! grep -q 'cannot write' "$tmp/err"; then
		echo "FAIL: percpuref-bench $* >/dev/full: exit $got, want 1 and a message"
		fails=$((fails + 1))
	else
		echo "ok: percpuref-bench $* >/dev/full -> $got"
	fi
}
expect 1 micro --threads 1 --variants private $short --json /dev/full
expect_full micro --threads 1 --variants private $short
# The stand-alone options take nothing else (they ignored it), and their
# output counts as results (it was lost with exit 0).
for opt in --help --version --list --topology; do
	expect 2 $opt extra
	expect_full $opt
done
expect_full micro --list
expect_full micro --help
# -h is --help after a workload's name too (it was an unknown option).
expect 0 micro -h
grep -q '^micro: ' "$tmp/out" || {
	echo "FAIL: micro -h: no workload help on stdout"
	fails=$((fails + 1))
}
expect 2 micro -h extra
# ... and so do a workload's --list and --help, whichever comes first (the
# other arguments were ignored: --json wrote no file).
expect 2 micro --help extra
expect 2 micro extra --help
expect 2 micro --help --duration 1
expect 2 micro --list --json "$tmp/list.json"
expect 2 micro --threads 1 --list
# A value given to an option that takes none is named as such (it was
# "unknown option" and the low byte of the option's internal code).
expect 2 micro --help=x
grep -q 'takes no value' "$tmp/err" ||
	{ echo "FAIL: --help=x: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
expect 2 micro --oversubscribe=1
expect 2 micro --processes=1
# --processes splits nothing a workload shares by design: not its groups.
expect 2 signal1 --processes
grep -q 'runs its threads in containers' "$tmp/err" ||
	{ echo "FAIL: signal1 --processes: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
expect 2 micro --processes --processes --threads 1 --variants private $short
# fence-cost's thread 0 fences, the others are its victims: a process each
# would make every one a fencer.
expect 2 fence-cost --processes
# A flag given twice is an error: the last one won, silently ("--json a
# --json b" never wrote a); the message names the flag, not its value.
expect 2 micro --threads 1 --threads 2 --variants private $short
grep -q -- '--threads given twice' "$tmp/err" ||
	{ echo "FAIL: --threads twice: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
expect 2 micro --threads=1 --thr 1 --variants private $short
expect 2 micro --json "$tmp/a.json" --json "$tmp/b.json" --threads 1 --variants private $short
expect 2 micro --oversubscribe --oversubscribe --threads 1 --variants private $short
expect 2 labels --profile nginx --profile unconfined --threads 1 --variants off $short
# A prefix that fits two options is not called unknown only.
expect 2 labels --s 1
grep -q 'unknown or ambiguous option --s$' "$tmp/err" ||
	{ echo "FAIL: --s: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
# managed-latency leaves once its window ends: it waited for a release a
# scan interval away (--interval-ms 30000: 30 s for a 10 ms point).
if timeout 15 "$bench" managed-latency --threads 1 --variants filtered --duration 0.01 \
	--interval-ms 30000 >/dev/null 2>&1; then
	echo "ok: managed-latency ends with its window"
else
	echo "FAIL: managed-latency --interval-ms 30000 --duration 0.01: exit $?"
	fails=$((fails + 1))
fi
# interrupted_run FILE: a 5 s run with --json FILE, killed after 0.5 s
# (SIGTERM: SIGINT is ignored by a background job of sh).
interrupted_run() {
	"$bench" micro --threads 1 --variants private --duration 5 --json "$1" >/dev/null 2>&1 &
	pid=$!
	sleep 0.5
	kill -TERM "$pid"
	wait "$pid"
}
# A run that fails keeps the previous --json file: it was truncated before
# the run, and a Ctrl-C, a kill or a refused thread left it empty.
"$bench" micro --threads 1 --variants private $short --json "$tmp/keep.json" >/dev/null 2>&1
before=$(cksum <"$tmp/keep.json")
interrupted_run "$tmp/keep.json"
if [ -s "$tmp/keep.json" ] && [ "$(cksum <"$tmp/keep.json")" = "$before" ]; then
	echo "ok: an interrupted run kept the previous --json file"
else
	echo "FAIL: an interrupted run changed the previous --json file"
	fails=$((fails + 1))
fi
# ... and makes none where there was none: an empty FILE was left, which
# plot.py and report.py then refused.  A path that cannot be written still
# fails before the run.
interrupted_run "$tmp/new.json"
if [ ! -e "$tmp/new.json" ]; then
	echo "ok: an interrupted run left no new --json file"
else
	echo "FAIL: an interrupted run left a new --json file"
	fails=$((fails + 1))
fi
# ... and removes only a file it made: one another process creates between
# the check for it and its creation is theirs (an LD_PRELOAD shim creates
# it first; it was removed).  Skipped where the shim cannot load (a
# sanitizer's runtime must come first, another architecture under qemu).
if cc -shared -fPIC -o "$tmp/create_first.so" "$(dirname -- "$0")/lib/create_first.c" \
      -ldl 2>/dev/null; then
	CREATE_FIRST_PATH="$tmp/race.json" LD_PRELOAD="$tmp/create_first.so" \
		interrupted_run "$tmp/race.json"
	if [ ! -e "$tmp/race.json.shim" ]; then
		echo "ok: a --json file another process created is kept # skip: no preload"
	elif [ "$(cat "$tmp/race.json" 2>/dev/null)" = theirs ]; then
		echo "ok: a --json file another process created is kept"
	else
		echo "FAIL: a --json file another process created was removed or changed"
		fails=$((fails + 1))
	fi
else
	echo "ok: a --json file another process created is kept # skip: no cc"
fi
expect 1 micro --threads 1 --variants private $short --json "$tmp/nosuch/x.json"
[ -s "$tmp/out" ] && { echo "FAIL: --json nosuch/x.json: measured first"; fails=$((fails + 1)); }
# An empty name is a usage error, not "percpuref-bench: : No such file".
expect 2 micro --threads 1 --variants private $short --json ""
# A --json FILE that is standard output's own file (expect writes it to
# $tmp/out) is refused: opened again for the JSON, it was truncated and
# the table written there lost, exit 0.  --json - is the way to both.
expect 2 micro --threads 1 --variants private $short --json "$tmp/out"
expect 2 micro --threads 1 --variants private $short --json /dev/stdout
# So is standard error's (expect sends it to $tmp/err): a line written
# there after the JSON (labels' summary at exit) wrote over its start.
expect 2 micro --threads 1 --variants private $short --json "$tmp/err"
expect 2 micro --threads 1 --variants private $short --json /dev/stderr
# ... and when standard output is a pipe: the table and the JSON went down
# it mixed, exit 0, and the reader's JSON parser failed on the table.
for json in /dev/stdout /proc/self/fd/1; do
	{ "$bench" micro --threads 1 --variants private $short --json "$json" 2>"$tmp/err"
	  echo $? >"$tmp/rc"; } | cat >"$tmp/out"
	if [ "$(cat "$tmp/rc")" -eq 2 ] && grep -q 'the file standard output writes' "$tmp/err" &&
	   [ ! -s "$tmp/out" ]; then
		echo "ok: percpuref-bench micro --json $json | cat -> 2"
	else
		echo "FAIL: percpuref-bench micro --json $json | cat: exit $(cat "$tmp/rc")," \
		     "$(wc -c <"$tmp/out") bytes on the pipe"
		fails=$((fails + 1))
	fi
done
# A device both write to (/dev/null here, a terminal) loses nothing: allowed.
if "$bench" micro --threads 1 --variants private $short --json /dev/stdout >/dev/null \
	2>"$tmp/err"; then
	echo "ok: percpuref-bench micro --json /dev/stdout >/dev/null -> 0"
else
	echo "FAIL: percpuref-bench micro --json /dev/stdout >/dev/null: $(head -1 "$tmp/err")"
	fails=$((fails + 1))
fi
# With --json -, the table goes to standard error; losing it is an error.
if "$bench" micro --threads 1 --variants private $short --json - >/dev/null 2>/dev/full; then
	echo "FAIL: percpuref-bench micro --json - 2>/dev/full: exit 0"
	fails=$((fails + 1))
else
	echo "ok: percpuref-bench micro --json - 2>/dev/full -> $?"
fi
# A closed standard output (>&-) fails the run, as a full one does: the
# --json file, opened after it was closed, took its number, and the table
# went into that file, exit 0.
"$bench" micro --threads 1 --variants private $short --json /dev/null >&- 2>"$tmp/err"
got=$?
if [ "$got" -eq 1 ] && grep -q '^percpuref-bench: standard output: cannot write' "$tmp/err"; then
	echo "ok: percpuref-bench micro --json /dev/null >&- -> 1"
else
	echo "FAIL: percpuref-bench micro --json /dev/null >&-: exit $got, $(head -1 "$tmp/err")"
	fails=$((fails + 1))
fi
# ... and a closed standard error's messages go nowhere, not into a --json
# pipe that took its number: managed-latency's warning of a window that
# completed nothing (see below) was a line of the JSON Lines.
"$bench" managed-latency --interval-ms 500 --duration 0.002 --variants filtered \
	--json /dev/fd/3 3>&1 >/dev/null 2>&- | cat >"$tmp/closed.json"
if "$python" -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1 and json.loads(lines[0])["workload"] == "managed-latency", lines
' "$tmp/closed.json" 2>/dev/null; then
	echo "ok: percpuref-bench managed-latency --json /dev/fd/3 2>&-: JSON only"
else
	echo "FAIL: percpuref-bench managed-latency --json /dev/fd/3 2>&-: not JSON Lines:"
	sed 's/^/  /' "$tmp/closed.json" | head -3
	fails=$((fails + 1))
fi
# ended_saying WHAT STATUS WANT LINE: a run that exited with STATUS must
# have exited with WANT, with LINE (a basic regular expression for a whole
# line) in its standard error, $tmp/err.
ended_saying() {
	if [ "$2" -eq "$3" ] && grep -qx "$4" "$tmp/err"; then
		echo "ok: $1: exit $3, said"
	else
		echo "FAIL: $1: exit $2, $(head -1 "$tmp/err")"
		fails=$((fails + 1))
	fi
}
# fails_saying WHAT LINE CMD...: CMD must exit 1 with LINE on standard error.
fails_saying() {
	what=$1 line=$2
	shift 2
	"$@" >/dev/null 2>"$tmp/err"
	ended_saying "$what" $? 1 "$line"
}
# A CPU the kernel refuses to pin a thread to (one a cpuset excludes, or
# one gone offline since the topology was read) is named, with the call
# that refused it: the run said "pthread_create (thread 0 on CPU N)".  The
# made-up machine has only CPU 1023, which this one lacks.
if [ ! -e /sys/devices/system/cpu/cpu1023 ]; then
	mkdir "$tmp/cpu1023"
	echo 1023 >"$tmp/cpu1023/online"
	want='percpuref-bench: pinning thread 0 to CPU 1023 was refused: sched_setaffinity'
	fails_saying "a refused pin" "$want (in pthread_create): Invalid argument" \
		env PERCPUREF_BENCH_SYSFS="$tmp/cpu1023" "$bench" micro --threads 1 --variants private $short
else
	echo "ok: a refused pin # skip: this machine has a CPU 1023"
fi
# The line-transfer probe before each point (harness/transfer.c): on two
# CPUs or more every sample carries a positive figure and the table its
# range (over 2 ns: a divisor off by the batches' 16 reads less); a probe
# whose second thread cannot be pinned (the made-up CPU 1023 beside this
# machine's first usable CPU, where thread 0 of the point runs) reads
# null, prints no range, and neither hangs nor fails the run.  A probe that cannot
# finish in half a second reads null too (a loaded machine, two tests on
# its two CPUs): the first check takes the best of three runs.
probe_run() {
	: >"$tmp/err"
	"$bench" micro --threads 1,2 --variants private $short --json - >"$tmp/json" \
		2>"$tmp/table" &&
	"$python" -c '
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
ns = [s["line_transfer_ns"] for row in rows for s in row["samples"]]
assert len(ns) == 2 and all(isinstance(x, (int, float)) and 2 < x < 1e6 for x in ns), ns
' "$tmp/json" 2>"$tmp/err" &&
	grep -q '^line transfer between CPUs [0-9]* and [0-9]* before each point: [0-9-]* ns$' \
		"$tmp/table"
}
if [ "$cpus" -ge 2 ] && { probe_run || probe_run || probe_run; }; then
	echo "ok: the line-transfer probe: a figure a point, its range in the table"
elif [ "$cpus" -lt 2 ]; then
	echo "ok: the line-transfer probe # skip: one usable CPU"
else
	echo "FAIL: the line-transfer probe:"
	sed 's/^/  /' "$tmp/err" "$tmp/json" "$tmp/table" | head -20
	fails=$((fails + 1))
fi
if [ ! -e /sys/devices/system/cpu/cpu1023 ]; then
	mkdir "$tmp/first_and_1023"
	"$bench" --topology | sed -n 's/^placement: \([0-9]*\).*/\1,1023/p' \
		>"$tmp/first_and_1023/online"
	if env PERCPUREF_BENCH_SYSFS="$tmp/first_and_1023" "$bench" micro --threads 1 \
		--variants private $short --hang-limit 10 --json - >"$tmp/json" 2>"$tmp/table" &&
	   "$python" -c '
import json, sys
row = json.loads(open(sys.argv[1]).read())
assert [s["line_transfer_ns"] for s in row["samples"]] == [None], row["samples"]
assert row["ops_per_sec"] > 0, row
' "$tmp/json" && ! grep -q '^line transfer' "$tmp/table"; then
		echo "ok: a probe refused its second CPU: null, the run measured"
	else
		echo "FAIL: a probe refused its second CPU:"
		sed 's/^/  /' "$tmp/json" "$tmp/table" | head -20
		fails=$((fails + 1))
	fi
else
	echo "ok: a probe refused its second CPU # skip: this machine has a CPU 1023"
fi
# ... and so is a pin that cannot even be asked for (glibc's copy of the
# set could not be allocated): the thread ran unpinned, and nothing said
# so.  An LD_PRELOAD shim makes pthread_attr_setaffinity_np() fail;
# skipped where it cannot load (a sanitizer's runtime must come first).
if cc -shared -fPIC -o "$tmp/attr_affinity_fails.so" \
      "$(dirname -- "$0")/lib/attr_affinity_fails.c" 2>/dev/null &&
   LD_PRELOAD="$tmp/attr_affinity_fails.so" "$bench" --version >/dev/null 2>&1; then
	want='percpuref-bench: pinning thread 0 to CPU [0-9]*: pthread_attr_setaffinity_np:'
	fails_saying "pthread_attr_setaffinity_np refused" "$want Cannot allocate memory" \
		env LD_PRELOAD="$tmp/attr_affinity_fails.so" "$bench" micro --threads 1 --variants private $short
else
	echo "ok: pthread_attr_setaffinity_np refused # skip: no cc, or no preload"
fi
# C++ memory that runs out is "out of memory", exit 1, as C memory is:
# the shared_ptr variant's make_shared threw std::bad_alloc through the C
# harness, and the run aborted (terminate, SIGABRT, a core).  An
# LD_PRELOAD shim makes every operator new fail; skipped where it cannot
# load (a sanitizer's runtime must come first).
if c++ -shared -fPIC -o "$tmp/new_fails.so" "$(dirname -- "$0")/lib/new_fails.cpp" \
      2>/dev/null && LD_PRELOAD="$tmp/new_fails.so" "$bench" --version >/dev/null 2>&1; then
	fails_saying "operator new refused" \
		'percpuref-bench: micro shared_ptr: make_shared: out of memory (std::bad_alloc)' \
		env LD_PRELOAD="$tmp/new_fails.so" "$bench" micro --threads 1 --variants shared_ptr $short
else
	echo "ok: operator new refused # skip: no c++, or no preload"
fi
# A sandbox that refuses new threads once the program runs: the library's
# threads never start, and switch-storm's kills wait for the callback one.  The
# run must not wait out --hang-limit (it did, up to 0.4.0): a wait that
# sees no release looks for the callback thread, finds none, and the
# threads wait with percpu_ref_barrier() from then on, which runs the
# queued kills on their caller, saying so.  An LD_PRELOAD shim refuses
# the library's pthread_create() calls; skipped where it cannot load.
if cc -shared -fPIC -o "$tmp/library_threads_refused.so" \
      "$(dirname -- "$0")/lib/library_threads_refused.c" -ldl 2>/dev/null &&
   LD_PRELOAD="$tmp/library_threads_refused.so" "$bench" --version >/dev/null 2>&1; then
	for v in kill managed; do
		env LD_PRELOAD="$tmp/library_threads_refused.so" "$bench" switch-storm \
			--threads 1 --variants $v $short --hang-limit 20 >/dev/null 2>"$tmp/err"
		ended_saying "switch-storm $v, the library's threads refused" $? 0 \
			'percpuref-bench: warning: switch-storm: the library.s callback thread does not run (could it start?); kill and managed wait for their releases with percpu_ref_barrier(), which runs the kills on its caller'
	done
	# managed-poll needs no callback thread and never looked for one:
	# with no reclaimer either, it left every exited ref's node listed
	# for the run, memory growing by each cycle's impl.  It looks for the
	# reclaimer after its first batch, and flushes after each.
	env LD_PRELOAD="$tmp/library_threads_refused.so" "$bench" switch-storm \
		--threads 1 --variants managed-poll $short --hang-limit 20 >/dev/null 2>"$tmp/err"
	ended_saying "switch-storm managed-poll, the library's threads refused" $? 0 \
		'percpuref-bench: warning: switch-storm: the library.s reclaimer thread does not run (could it start?); the managed variants flush after each batch'
	# Without the reclaimer, managed-hot's scan rows and managed-latency
	# measured an idle reclaimer and printed "-": they fail, naming why.
	for wv in managed-hot:scan-batched managed-latency:faithful; do
		w=${wv%%:*} v=${wv#*:}
		fails_saying "$w $v, the library's threads refused" \
			"percpuref-bench: $w $v: no scan, and the library.s reclaimer thread (percpuref-recl) does not run: could it start?" \
			env LD_PRELOAD="$tmp/library_threads_refused.so" "$bench" $w --threads 1 \
			--variants $v $short --hang-limit 20
	done
else
	echo "ok: switch-storm, the library's threads refused # skip: no cc, or no preload"
fi
# Points that hang or pause.  A run that never ends must fail after
# --hang-limit, naming what hangs (exit 1; _exit, since a hung thread
# cannot be waited for); a pause (Ctrl-Z then fg, or no CPU) must not fail
# it, but a window it falls in gets a warning.  A thread that "hangs" is
# frozen with ptrace (bench/tests/lib/freeze_threads.c): a stop its process
# cannot see.  Each run is killed at 60 s, so a regression that hangs
# fails here instead of holding the test.
# start_bench ARGS...: BENCH ARGS in the background, in a process group of
# its own (timeout makes one: $parent); $run is the bench, within 5 s.
start_bench() {
	timeout -s KILL 60 "$bench" "$@" >/dev/null 2>"$tmp/err" &
	parent=$!
	run=""
	for _ in $(seq 100); do
		run=$(children_of "$parent")
		[ -n "$run" ] && break
		sleep 0.05
	done
}
# frozen PID...: freezes those threads in the background ($freezer) and
# waits up to 5 s for them to be; false (and a skip line) if ptrace is
# refused or freeze_threads could not be built; false with gone=yes if
# the threads are gone (see not_frozen).
frozen() {
	gone=no
	if [ ! -x "$tmp/freeze_threads" ]; then
		echo "ok: $what # skip: no cc for freeze_threads"
		return 1
	fi
	# No thread left to freeze: on a loaded machine the run may end
	# before this test gets the CPU to freeze it (CI saw that); the
	# caller's not_frozen judges how it ended.
	if [ $# -eq 0 ]; then
		gone=yes
		return 1
	fi
	"$tmp/freeze_threads" "$@" >"$tmp/frozen" 2>"$tmp/freeze_err" &
	freezer=$!
	for _ in $(seq 100); do
		grep -q frozen "$tmp/frozen" && return 0
		running "$freezer" || break
		sleep 0.05
	done
	wait "$freezer"
	case $? in
	77)	echo "ok: $what # skip: ptrace refused here" ;;
	78)	gone=yes ;;
	*)	echo "FAIL: $what: freeze_threads $*: $(head -1 "$tmp/freeze_err")"
		fails=$((fails + 1)) ;;
	esac
	return 1
}
# not_frozen: after frozen failed, waits for the run; one that ended
# before it could be frozen is a skip if it ended well, a failure if not.
not_frozen() {
	wait "$parent"
	status=$?
	[ "$gone" = yes ] || return 0
	if [ "$status" -eq 0 ]; then
		echo "ok: $what # skip: the run ended before it could be frozen"
	else
		echo "FAIL: $what: the run ended before it could be frozen, exit $status"
		sed 's/^/  stderr: /' "$tmp/err" | head -5
		fails=$((fails + 1))
	fi
}
# thaw: ends the freezer, whose tracees then run on.
thaw() {
	kill -KILL "$freezer" 2>/dev/null
	wait "$freezer" 2>/dev/null
}
# The processes whose parent is $1 (from /proc: procps may be missing):
# the kernel's list where it keeps one (a walk of every process takes
# seconds on a loaded machine, past a short point's end).
children_of() {
	if [ -r "/proc/$1/task/$1/children" ]; then
		for pid in $(cat "/proc/$1/task/$1/children"); do
			echo "$pid"
		done
		return
	fi
	for stat in /proc/[0-9]*/stat; do
		read -r pid _ _ ppid _ 2>/dev/null <"$stat" && [ "$ppid" = "$1" ] && echo "$pid"
	done
}
# The threads of the processes given.
tasks_of() {
	for pid in "$@"; do
		ls "/proc/$pid/task" 2>/dev/null
	done
}
# running PID: PID has not ended (a zombie has: only its status is left).
running() {
	read -r _ _ state _ 2>/dev/null <"/proc/$1/stat" && [ "$state" != Z ]
}
# The threads of process $1 pinned to one CPU, once there are $2 (5 s at
# most): the workers (the main thread and the watchdog are not pinned,
# and are told apart by name where one CPU makes every thread "pinned").
pinned_threads() {
	for _ in $(seq 100); do
		pinned=""
		for task in /proc/"$1"/task/*; do
			[ "${task##*/}" != "$1" ] &&
			[ "$(cat "$task/comm" 2>/dev/null)" != bench-watchdog ] &&
			grep -q '^Cpus_allowed_list:[[:space:]]*[0-9]*$' "$task/status" 2>/dev/null &&
			pinned="$pinned ${task##*/}"
		done
		[ "$(echo $pinned | wc -w)" -eq "$2" ] && return
		sleep 0.05
	done
}
cc -o "$tmp/freeze_threads" "$(dirname -- "$0")/lib/freeze_threads.c" 2>/dev/null
# A worker that never returns from its loop (frozen in its window, from
# 0.4 s).  With one CPU every thread is "pinned": skipped.
what="a thread that never returns"
if [ "$cpus" -lt 2 ]; then
	echo "ok: $what # skip: one CPU"
else
	start_bench micro --threads 1 --variants private --duration 2 --hang-limit 0.5
	pinned_threads "$run" 1
	sleep 0.6
	if [ -z "$pinned" ]; then
		echo "FAIL: $what: no pinned worker found"
		fails=$((fails + 1))
		wait "$parent"
	elif frozen $pinned; then
		wait "$parent"
		status=$?
		thaw
		want='percpuref-bench: micro private, 1 thread: thread 0 (CPU [0-9]*) has not'
		want="$want returned 0.5 s after the window closed (--hang-limit): its loop hangs"
		ended_saying "$what" "$status" 1 "$want"
	else
		wait "$parent"
	fi
fi
# The whole run stopped and continued in its window: measured (exit 0),
# and the warning says the point counts the pause.  The stop comes in the
# middle of the window, 1 s from either end: a window opens 0.4 s after
# the worker starts only if the bench's main thread gets the CPU at once
# (its start barrier, its warm-up), and a stop at 0.6 s, 0.2 s from the
# window's start, fell in the warm-up when that thread was kept off its
# CPU 300 ms there (a loaded machine): no warning, and the test failed.
start_bench micro --threads 1 --variants private --duration 2
pinned_threads "$run" 1	# its worker started: the window is 0.4 to 2.4 s on
sleep 1.4
kill -STOP -"$parent"
sleep 1
kill -CONT -"$parent"
wait "$parent"
status=$?
want='percpuref-bench: warning: micro private, 1 thread: the run was stopped and continued'
want="$want during this point's window; its time per operation counts the pause"
ended_saying "a run stopped and continued" "$status" 0 "$want"
# The whole run given no CPU across its window's end (frozen, which sends
# no SIGCONT): measured, and the warning says how long the window lasted.
# As above, frozen in the middle of a 2 s window (a window of 1 s, frozen
# 0.3 s after it opened, was frozen in the warm-up when the bench's main
# thread was kept off its CPU 450 ms: a window of 1 s, no warning), for
# 3 s: wherever in the window the freeze begins, the window ends past
# 2.5 s, the most a window of 2 s may last unwarned.
what="a run given no CPU"
start_bench micro --threads 1 --variants private --duration 2 --hang-limit 0.5
pinned_threads "$run" 1	# its worker started: the window is 0.4 to 2.4 s on
sleep 1.4
if frozen $(tasks_of "$run"); then
	sleep 3
	thaw
	wait "$parent"
	status=$?
	want='percpuref-bench: warning: micro private, 1 thread: the window lasted [0-9.]* s'
	want="$want instead of 2 s (the run got no CPU); its time per operation counts that"
	ended_saying "$what" "$status" 0 "$want"
else
	not_frozen
fi
# managed-latency with more threads than its default: their sums are
# shared (ThreadSanitizer builds report a race if they are not).
expect 0 managed-latency --threads 2 --oversubscribe --interval-ms 1 --variants filtered $short
# An operation longer than the window counts nowhere: its point shows "-"
# and standard error says how many measurements completed none (the table
# said "nan" and nothing said why).  A release waits for a scan every
# 500 ms: a window of 2.4 ms (with its warm-up) sees one about once in
# 40000 runs.
"$bench" managed-latency --interval-ms 500 --duration 0.002 --variants filtered \
	>"$tmp/out" 2>"$tmp/err"
if grep -q '^ *1  1C1T .*| *- ' "$tmp/out" &&
   grep -q 'managed-latency: 1 of 1 measurements completed no release' "$tmp/err"; then
	echo "ok: a window that completed nothing: shown as -, and said"
else
	echo "FAIL: a window that completed nothing:"
	sed 's/^/  /' "$tmp/out" "$tmp/err"
	fails=$((fails + 1))
fi
expect 2 signal1 --workers 0
# The usage under it lists the default, not the value refused: it said
# "(default 0)" under "--workers: want 1..65536".
grep -q -- '^  --workers N .*(default 1)$' "$tmp/err" ||
	{ echo "FAIL: signal1 --workers 0: $(grep -- '--workers N' "$tmp/err")"; fails=$((fails + 1)); }
expect 2 signal1 --workers -3
expect 2 signal1 --workers 12abc
expect 2 signal1 --workers ""
# Workload numbers are decimal: no hex, no octal, no blank or plus sign
# (base 0 read "0x10" as 16 and refused "08" as a bad octal number).
expect 2 signal1 --workers 0x10
expect 2 signal1 --workers " 2"
expect 2 signal1 --workers +2
expect 0 signal1 --workers 08 --threads 1 --variants global $short
# Real numbers too: strtod() alone takes blanks, "+", hexadecimal and "inf".
expect 2 labels --churn 0x10
expect 2 labels --churn 0x1p4
expect 2 labels --churn " 2"
expect 2 labels --churn +2
expect 2 labels --churn inf
expect 2 micro --duration " 0.05"
expect 2 micro --duration +0.05
expect 2 micro --duration 0x1p-4
expect 2 signal1 --batch -1
expect 2 signal1 --batch 0
expect 2 signal1 --batch 99999999999999999999
expect 2 signal1 --limit -1
expect 2 switch-storm --in-flight 0
expect 2 switch-storm --in-flight 65
expect 2 switch-storm --batch 0
# In range one by one, but thread_init fills --in-flight - 1 batches before
# the start barrier, where nothing stops it: 63 x 4096 x 10^6 pairs ran out
# --hang-limit and failed after 60 s as a hang.
expect 2 switch-storm --batch 4096 --burst 1000000 --in-flight 64 --threads 1 --variants kill $short
# A limit below the largest row's workers: refused before the first row
# runs (it used to die at that row, the earlier rows' results lost).
expect 2 signal1 --limit 1 --threads 1,2 --variants global $short
expect 2 labels --profile root
# Values setup() could not take, refused before the first point: a --work
# that never lets a measurement stop, a --churn period past 64 bits, a
# --scan-ms the reclaimer refuses (PERCPU_REF_MANAGED_INTERVAL_MAX_MS).
expect 2 labels --work -1
expect 2 labels --work 9223372036854775807 --threads 1 --variants off $short
expect 2 labels --churn -1
expect 2 labels --churn 1e-12 --threads 1 --variants kref $short
expect 2 labels --churn 1000001
expect 2 labels --scan-ms 86400001 --threads 1 --variants off,percpu-managed $short
expect 0 --help
expect 0 --version
expect 0 --list
expect 0 micro --help
expect 0 signal1 --list
# The --threads syntax --help promises, and the bounds themselves.
expect 0 micro --threads 1-2,max --oversubscribe --variants private $short
expect 0 labels --threads 1 --variants off,percpu-managed --work 1000000 --scan-ms 86400000 \
	$short
# signal1 oversubscribes by design: no --oversubscribe needed.
expect 0 signal1 --threads "$over" --variants cached $short
# The report's override_rlimit path, with a limit the refills run into.
expect 0 signal1 --threads 1-4 --workers 2 --limit 20 --override-rlimit \
	--variants cached-report,percpu-counter $short

# json WORKLOAD ROWS GROUPED ARGS...: --json - gives ROWS objects, each
# valid and complete; with GROUPED=yes they also carry their groups (of
# --workers threads).
json() {
	workload=$1 rows=$2 grouped=$3
	shift 3
	if ! "$bench" "$workload" "$@" $short --json - >"$tmp/json" 2>"$tmp/table"; then
		echo "FAIL: percpuref-bench $workload $* --json -: exit status $?"
		fails=$((fails + 1))
		return
	fi
	if "$python" -c '
import json, sys
rows, group, cpus = int(sys.argv[2]), sys.argv[3] == "yes", int(sys.argv[4])
need = {"workload": str, "variant": str, "threads": int, "ops_per_sec": (int, float),
        "ns_per_op": (int, float, type(None)), "efficiency": (int, float, type(None)),
        "oversubscribed": bool, "processes": bool, "config": str, "fast_path": str,
        "library_cpus": (str, type(None)), "versus": (dict, type(None)),
        "baseline_threads": (int, type(None))}
if group:
    need.update({"group": str, "groups": int,
                 "ops_per_sec_per_group": (int, float, type(None))})
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == rows, f"{len(lines)} lines, want {rows}"
for n, line in enumerate(lines, 1):
    obj = json.loads(line)
    for key, kind in need.items():
        assert isinstance(obj.get(key), kind), f"line {n}: {key} = {obj.get(key)!r}"
    # A point whose threads finished nothing (a starved run on a loaded
    # machine) has no time per operation, and only such a point.
    assert (obj["ns_per_op"] is None) == (obj["ops_per_sec"] == 0), f"line {n}: ns_per_op"
    assert obj["oversubscribed"] == (obj["threads"] > cpus), f"line {n}: oversubscribed"
    assert obj["processes"] == ("--processes" in sys.argv[5:]), f"line {n}: processes"
    assert obj["config"].endswith("C%dT" % obj["threads"]), "line %d: config" % n
    if group:
        size = obj["params"]["workers"]
        assert obj["groups"] == -(-obj["threads"] // size), f"line {n}: groups"
        # Null exactly where ns_per_op is (the table shows "-" for both).
        per = obj["ops_per_sec"] / obj["groups"] or None
        got = obj["ops_per_sec_per_group"]
        assert (got is None) == (per is None), f"line {n}: per group {got!r}"
        assert got is None or abs(got - per) <= 1e-5 * per, f"line {n}: per group"
' "$tmp/json" "$rows" "$grouped" "$cpus" "$@"; then
		echo "ok: percpuref-bench $workload $* --json -"
	else
		echo "FAIL: percpuref-bench $workload $* --json -: bad JSON"
		fails=$((fails + 1))
	fi
	if ! grep -q "^$workload: " "$tmp/table"; then
		echo "FAIL: percpuref-bench $workload $* --json -: no table on stderr"
		fails=$((fails + 1))
	fi
}

# micro: rows 1 (added for efficiency) and 2, two variants.
json micro 4 no --threads 2 --oversubscribe --variants private,kref
# signal1: 3 threads of 2 workers make 2 containers, the last one short.
json signal1 10 yes --threads 1,3 --workers 2
json signal1 2 yes --threads "$over" --variants global
# --processes runs threads in fork children, which a ThreadSanitizer
# build refuses (usage error, said so): its tests are skipped there.
if "$bench" micro --processes --threads 1 --variants private $short >/dev/null 2>"$tmp/err"; then
	processes=yes
elif grep -q 'not in a ThreadSanitizer build' "$tmp/err"; then
	processes=no
	echo "ok: --processes refused in a ThreadSanitizer build # skip its runs"
else
	processes=no
	echo "FAIL: --processes: $(head -1 "$tmp/err")"
	fails=$((fails + 1))
fi
if [ "$processes" = yes ]; then
# --processes: the same rows, each a set of one-thread processes.
json micro 4 no --threads 2 --oversubscribe --processes --variants private,kref

# A --processes child that dies fails the run (exit 1, the CPU named) and
# takes its siblings down: none is left waiting at the barrier or running.
"$bench" micro --processes --threads 2 --baseline 2 --oversubscribe --variants private --duration 30 \
	>"$tmp/out" 2>"$tmp/err" &
parent=$!
# still_alive PID...: those of the PIDs still running, each after a space.
still_alive() {
	for pid in "$@"; do
		kill -0 "$pid" 2>/dev/null && printf ' %s' "$pid"
	done
}
# Sets $children to the two processes $1 forks, within 5 s.
wait_for_two_children() {
	children=""
	for _ in $(seq 100); do
		children=$(children_of "$1" | tr '\n' ' ')
		[ "$(echo $children | wc -w)" -eq 2 ] && return
		sleep 0.05
	done
}
# Sets $children to the two processes $1 forks, then waits (5 s at most
# each) until each has started its worker, its one pinned thread.
two_children_started() {
	wait_for_two_children "$1"
	for child in $children; do
		pinned_threads "$child" 1
	done
}
wait_for_two_children "$parent"
kill -KILL $(echo $children | cut -d' ' -f1) 2>/dev/null
wait "$parent"
status=$?
alive=$(still_alive $children)
if [ "$status" -eq 1 ] && grep -q -- '--processes: the process on CPU .* failed (signal 9)' "$tmp/err" &&
   [ -n "$children" ] && [ -z "$alive" ]; then
	echo "ok: a --processes child killed: exit 1, siblings gone"
else
	echo "FAIL: a --processes child killed: exit $status, children $children, alive:$alive"
	sed 's/^/  stderr: /' "$tmp/err" | head -5
	[ -n "$alive" ] && kill -KILL $alive
	fails=$((fails + 1))
fi

# The parent killed outright: its children go with it (they would have
# run out their windows, or waited at the barrier for ever).
"$bench" micro --processes --threads 2 --baseline 2 --oversubscribe --variants private --duration 30 \
	>/dev/null 2>&1 &
parent=$!
wait_for_two_children "$parent"
kill -KILL "$parent"
wait "$parent" 2>/dev/null
for _ in $(seq 40); do
	alive=$(still_alive $children)
	[ -z "$alive" ] && break
	sleep 0.05
done
if [ -n "$children" ] && [ -z "$alive" ]; then
	echo "ok: --processes parent killed: its children went with it"
else
	echo "FAIL: --processes parent killed: children $children, alive:$alive"
	[ -n "$alive" ] && kill -KILL $alive
	fails=$((fails + 1))
fi

# A --processes child stopped (SIGSTOP) fails the run too, its CPU and pid
# named, and leaves no process behind: its siblings waited at the barrier
# for it, and the parent for it, until something continued it (and a
# window stretched by the stop was then reported as measured).  The
# parent has 10 s to end by itself; then it and the children are killed.
"$bench" micro --processes --threads 2 --baseline 2 --oversubscribe --variants private --duration 30 \
	>"$tmp/out" 2>"$tmp/err" &
parent=$!
wait_for_two_children "$parent"
stopped=$(echo $children | cut -d' ' -f1)
kill -STOP "$stopped" 2>/dev/null
for _ in $(seq 200); do
	running "$parent" || break
	sleep 0.05
done
hung=no
if running "$parent"; then
	hung=yes
	kill -KILL "$parent" $children
fi
wait "$parent"
status=$?
alive=$(still_alive $children)
if [ "$hung" = no ] && [ "$status" -eq 1 ] && [ -n "$children" ] && [ -z "$alive" ] &&
   grep -q -- "--processes: the process on CPU [0-9]* (pid $stopped) was stopped (signal [0-9]*)" \
	"$tmp/err"; then
	echo "ok: a --processes child stopped: exit 1, named, siblings gone"
else
	echo "FAIL: a --processes child stopped: hung $hung, exit $status, children $children," \
	     "alive:$alive"
	sed 's/^/  stderr: /' "$tmp/err" | head -5
	[ -n "$alive" ] && kill -KILL $alive
	fails=$((fails + 1))
fi
# ... but a stop of the whole job (Ctrl-Z, then fg) is no failure, as it is
# none for a run of threads: the parent, stopped with its children, may
# still be handed a child's stop once it is continued.  The pause comes
# 0.5 s after the children started (in their windows, 0.2 to 1.2 s on)
# and lasts 3 s, against a limit of 1.2 x 1 + 1.5 s from the parent's last
# fork (a tighter limit, which shows a pause counted as time awake, fails
# here on a loaded machine for want of CPU: left to manual runs).
start_bench micro --processes --threads 2 --baseline 2 --oversubscribe --variants private \
	--duration 1 --hang-limit 1.5
two_children_started "$run"	# their windows open 0.2 s on
sleep 0.5
kill -STOP -"$parent"
sleep 3
kill -CONT -"$parent"
wait "$parent"
status=$?
want='percpuref-bench: warning: micro private, 2 processes: the run was stopped and continued'
want="$want during this point's window; its time per operation counts the pause"
ended_saying "a --processes job stopped and continued" "$status" 0 "$want"
# The whole job given no CPU for 3 s (frozen: no SIGCONT) is no failure
# either: a gap the watchdog sleeps through counts as one second (the
# limit is 1.2 x 1 + 2 s here, which the 3 s would pass uncounted), and
# the windows get the warning.
what="a --processes job given no CPU"
start_bench micro --processes --threads 2 --baseline 2 --oversubscribe --variants private \
	--duration 1 --hang-limit 2
two_children_started "$run"
sleep 0.5
if frozen $(tasks_of "$run" $children); then
	sleep 3
	thaw
	wait "$parent"
	status=$?
	want='percpuref-bench: warning: micro private, 2 processes: the window lasted [0-9.]* s'
	want="$want instead of 1 s (the run got no CPU); its time per operation counts that"
	ended_saying "$what" "$status" 0 "$want"
else
	not_frozen
fi

# A --processes child that never ends (frozen, past the barrier: its
# sibling runs its window out) fails the run after its window and
# --hang-limit, named, and its sibling is gone too.
what="a --processes child that never ends"
start_bench micro --processes --threads 2 --baseline 2 --oversubscribe --variants private \
	--duration 2 --hang-limit 2
two_children_started "$run"
hung=$(echo $children | cut -d' ' -f1)	# the first forked
sleep 0.5
gone=no
if [ -n "$hung" ] && frozen $(tasks_of "$hung"); then
	wait "$parent"
	status=$?
	thaw
	alive=$(still_alive $children)
	# 2 of 2 if it was frozen before the barrier its sibling waits at.
	want="percpuref-bench: --processes: [12] of 2 processes (the first on CPU [0-9]*, pid $hung)"
	want="$want had not ended 2 s after their windows would have closed (--hang-limit); killed"
	if [ -z "$alive" ]; then
		ended_saying "$what" "$status" 1 "$want"
	else
		echo "FAIL: $what: alive:$alive"
		kill -KILL $alive
		fails=$((fails + 1))
	fi
else
	not_frozen
fi

# A child the bench did not fork (inherited across an exec) is not taken
# for one of its processes: every row has a real window and throughput.
if sh -c '(sleep 0.05) & exec "$0" micro --processes --threads 1,2 --oversubscribe \
		--variants private --duration 0.2 --json -' "$bench" >"$tmp/json" 2>/dev/null &&
   "$python" -c '
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 2, rows
for row in rows:
    assert row["ops_per_sec"] > 0 and row["ns_per_op"] is not None, row
    assert all(s["seconds"] >= 0.2 for s in row["samples"]), row["samples"]
' "$tmp/json"; then
	echo "ok: --processes with a foreign child: rows intact"
else
	echo "FAIL: --processes with a foreign child:"
	sed 's/^/  /' "$tmp/json" | head -4
	fails=$((fails + 1))
fi
fi

# labels --churn: every row carries the churn metrics, with their units,
# and the table on stderr is followed by the metrics table.
if "$bench" labels --threads 1 --duration 0.05 --variants kref --churn 100 --json - \
	>"$tmp/json" 2>"$tmp/table" &&
   "$python" -c '
import json, math, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, f"{len(lines)} lines, want 1"
obj = json.loads(lines[0])
metrics, units = obj.get("metrics"), obj.get("metric_units")
assert isinstance(metrics, dict) and isinstance(units, dict), "no metrics object"
for key in ("repl_rate", "alive_peak", "stale_peak", "stale_end", "rss_peak", "pcpu_peak",
            "released", "release_mean", "release_max"):
    assert key in metrics, f"metrics: no {key}"
    value = metrics[key]
    assert value is None or isinstance(value, (int, float)), f"{key} = {value!r}"
    assert key in units, f"metric_units: no {key}"
assert metrics["repl_rate"] > 0 and metrics["rss_peak"] > 0, metrics
assert units["rss_peak"] == "KiB" and units["release_mean"] == "ms", units
assert obj["samples"][0]["metrics"] == metrics, "sample metrics"
' "$tmp/json" && grep -q '^labels metrics: ' "$tmp/table" &&
   grep -q '^ *1  kref ' "$tmp/table"; then
	echo "ok: percpuref-bench labels --churn 100 --json -: metrics"
else
	echo "FAIL: percpuref-bench labels --churn 100 --json -: no metrics"
	sed 's/^/  /' "$tmp/json" "$tmp/table" | head -20
	fails=$((fails + 1))
fi
# Every row's column bars stand where the header's do: managed-latency's
# 20 ms a release, 20005389.53 ns, passed its 10-wide column, a 150 ms scan
# (a loaded machine) the 8-wide ns/scan one, and 1024 threads' 54914% the
# 5-wide eff one.  lined_up WHAT FILE: FILE holds a table on its own.
lined_up() {
	if "$python" -c '
import sys
lines = open(sys.argv[1]).read().splitlines()
head = [l for l in lines if l.startswith(("threads config", "containers "))][0]
rows = [l for l in lines if l.split("|")[0].strip()[:1].isdigit() and "|" in l]
bars = lambda l: [i for i, c in enumerate(l) if c == "|"]
assert rows, lines
for row in rows:
    assert bars(row) == bars(head), (head, row)
' "$2"; then
		echo "ok: $1: the table's columns line up"
	else
		echo "FAIL: $1: a figure passes its column"
		sed 's/^/  /' "$2" | head -14
		fails=$((fails + 1))
	fi
}
# A rate below one million a second reads as its value in the table's
# M<op>s/s column, not 0.0 (managed-scan's 12,000 scans/s did).
# Exit 3: no scan completed in the window (a loaded machine), not checked.
rc=0
"$bench" managed-scan --variants filtered-1k --duration 0.2 >"$tmp/table" 2>/dev/null &&
"$python" -c '
import sys
row = [l for l in open(sys.argv[1]) if l.lstrip().startswith("1 ")][0]
ns, rate = row.split("|")[1].split()
if ns == "-":
    sys.exit(3)
assert float(rate) > 0, row
assert abs(1e3 / float(ns) - float(rate)) <= 0.01 * float(rate), row
' "$tmp/table" || rc=$?
lined_up "managed-scan" "$tmp/table"
case $rc in
0) echo "ok: managed-scan: a rate below 1 M/s printed with its digits" ;;
3) echo "ok: managed-scan: no scan completed in the window (a loaded machine): rate column not checked" ;;
*)
	echo "FAIL: managed-scan: rate column"
	sed 's/^/  /' "$tmp/table" | head -12
	fails=$((fails + 1))
	;;
esac
"$bench" managed-latency --threads 1 --duration 0.1 --variants faithful >"$tmp/table" 2>/dev/null
lined_up "managed-latency" "$tmp/table"
"$bench" signal1 --threads 1,1024 --oversubscribe --baseline 1024 --variants global \
	--duration 0.05 >"$tmp/table" 2>/dev/null
lined_up "signal1 at 1 and 1024 threads, baseline 1024" "$tmp/table"
# A worker kept off its CPU for part of the window (here by a busy loop
# pinned to that CPU; in managed-hot, by the reclaimer) is said on standard
# error, as its time per operation counts that; a workload whose threads
# wait by design (managed-latency sleeps) says nothing of it.
cpu=$("$bench" --topology | sed -n 's/^placement: \([0-9]*\).*/\1/p')
taskset -c "$cpu" sh -c 'while :; do :; done' &
hog=$!
"$bench" micro --threads 1 --variants private --duration 0.3 >/dev/null 2>"$tmp/err"
# (--processes: not in a ThreadSanitizer build, see above.)
[ "$processes" = no ] ||
	"$bench" micro --processes --threads 1 --variants private --duration 0.3 >/dev/null 2>>"$tmp/err"
kill "$hog"
wait "$hog" 2>/dev/null
"$bench" managed-latency --threads 1 --variants filtered --duration 0.1 >/dev/null 2>"$tmp/err2"
if grep -q "^percpuref-bench: warning: micro private, 1 thread: worker 0 (CPU $cpu) ran [0-9]*% of the window" \
	"$tmp/err" &&
   { [ "$processes" = no ] ||
     grep -q "^percpuref-bench: warning: micro private, 1 process: process 0 (CPU $cpu) ran [0-9]*% of the window" \
	"$tmp/err"; } && ! grep -q 'of the window' "$tmp/err2"; then
	echo "ok: a worker kept off its CPU: warned (threads; --processes: $processes); managed-latency's sleeps: not"
else
	echo "FAIL: starved worker warning"
	sed 's/^/  /' "$tmp/err" "$tmp/err2" | head -12
	fails=$((fails + 1))
fi
# managed-hot: the reclaimer's figures over the measured window
# (window_open and window_close), whose length is the sample's (from setup
# to teardown it was longer by the warm-up, a fifth of it, and more): the
# scanning variant scanned and took CPU there, switching nothing.
if "$bench" managed-hot --threads 1 --duration 0.3 --variants idle,scan-filtered --json - \
	>"$tmp/json" 2>"$tmp/table" &&
   "$python" -c '
import json, os, sys
rows = {o["variant"]: o for o in map(json.loads, open(sys.argv[1]).read().splitlines())}
for row in rows.values():
    window, seconds = row["metrics"]["window"], row["samples"][0]["seconds"]
    assert abs(window - seconds) < 0.03, (row["variant"], window, seconds)
idle, scan = rows["idle"]["metrics"], rows["scan-filtered"]["metrics"]
assert rows["scan-filtered"]["metric_units"]["reclaimer_cpu"] == "%", rows["scan-filtered"]
assert idle["scan_rate"] == 0, idle
assert scan["scan_rate"] > 0, scan
# Not measured (null) only where /proc cannot name the reclaimer thread.
assert scan["reclaimer_cpu"] > 0 if os.path.isdir("/proc/self/task") \
    else scan["reclaimer_cpu"] is None, scan
assert scan["switch_rate"] == 0 and scan["fence_rate"] == 0, scan
' "$tmp/json"; then
	echo "ok: managed-hot: the reclaimer scanned in the window, which is the sample's, switched nothing"
else
	echo "FAIL: managed-hot window metrics"
	sed 's/^/  /' "$tmp/json" "$tmp/table" | head -20
	fails=$((fails + 1))
fi
# switch-storm measures the CPU a cycle costs on its thread and on the
# library's callback thread (found by name): both measured, both positive;
# and no wait needed a barrier (the callback thread started).
if "$bench" switch-storm --threads 1 --duration 0.05 --batch 8 --variants kill --json - \
	>"$tmp/json" 2>"$tmp/table" &&
   "$python" -c '
import json, sys
m = json.loads(open(sys.argv[1]).read())["metrics"]
assert m["worker_cpu"] and m["worker_cpu"] > 0, m
assert m["callback_cpu"] and m["callback_cpu"] > 0, m
assert 0 < m["offload_bound"] < 100, m
assert m["barrier_waits"] == 0, m
' "$tmp/json"; then
	echo "ok: switch-storm --json -: worker and callback CPU per cycle"
else
	echo "FAIL: switch-storm --json -: CPU per cycle not measured"
	sed 's/^/  /' "$tmp/json" | head -5
	fails=$((fails + 1))
fi
# A workload that reports none has an empty object, and no metrics table.
"$bench" micro --threads 1 --variants private $short --json - >"$tmp/json" 2>"$tmp/table"
if "$python" -c '
import json, sys
obj = json.loads(open(sys.argv[1]).read())
assert obj["metrics"] == {} and obj["metric_units"] == {}
' "$tmp/json" && ! grep -q 'metrics:' "$tmp/table"; then
	echo "ok: micro --json -: empty metrics"
else
	echo "FAIL: micro --json -: metrics not empty, or a metrics table"
	fails=$((fails + 1))
fi

# --version names the version and the fast path; so do the table and the JSON.
if "$bench" --version | grep -q '^percpuref-bench [0-9][0-9.]* (fast path: [a-z-]*)$'; then
	echo "ok: --version"
else
	echo "FAIL: --version: $("$bench" --version)"
	fails=$((fails + 1))
fi

# --baseline 2, a row --threads leaves out (so it is added): the two-thread
# row is 100%, the others relative to its per-thread throughput; the table
# says so and names rows xCyT.
if [ "$cpus" -ge 2 ] &&
   "$bench" micro --threads 1 --baseline 2 --variants private,kref $short --json - \
	>"$tmp/json" 2>"$tmp/table"; then
	if "$python" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert sorted(r["threads"] for r in rows) == [1, 1, 2, 2], "rows: 1 and the baseline, added"
by = {(r["variant"], r["threads"]): r for r in rows}
for v in ("private", "kref"):
    base, one = by[(v, 2)], by[(v, 1)]
    assert base["baseline_threads"] == 2 and abs(base["efficiency"] - 1) < 1e-9, base
    want = one["ops_per_sec"] / (base["ops_per_sec"] / 2)
    assert abs(one["efficiency"] - want) <= 1e-4 * want, (one["efficiency"], want)
    assert base["config"] == "2C2T" or base["config"] == "1C2T", base["config"]
' "$tmp/json" && grep -q '^fast path: ' "$tmp/table" &&
	   grep -q 'the 2-thread row is 100%' "$tmp/table" &&
	   grep -q '^threads config ' "$tmp/table"; then
		echo "ok: --baseline 2"
	else
		echo "FAIL: --baseline 2: efficiency or table header"
		sed 's/^/  /' "$tmp/json" "$tmp/table" | head -20
		fails=$((fails + 1))
	fi
fi

# --versus private: each other point's ratio is recomputed here from the
# samples, round by round and row by row (median, lowest, highest,
# rounds: a pairing with another row's reference would show); the
# reference has none, and the table prints the medians.
rows=1
[ "$cpus" -ge 2 ] && rows=1,2
if "$bench" micro --threads "$rows" --variants kref,private,percpu --versus private --repeat 4 \
	$short --json - >"$tmp/json" 2>"$tmp/table"; then
	if "$python" -c '
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["variant"], r["threads"]): r for r in rows}
threads = sorted({r["threads"] for r in rows})
assert len(threads) == len(sys.argv[3].split(",")), threads
table = open(sys.argv[2]).read().split("versus private: ")[1].splitlines()
assert table[1].split() == ["threads", "kref", "percpu"], table[1]
counted = 0
for n, line in zip(threads, table[2:]):
    assert by[("private", n)]["versus"] is None, by[("private", n)]["versus"]
    lead, rest = line.split(None, 1)
    assert lead == str(n), (n, line)
    # Each cell: "median (lowest-highest)", or "-" where no round counted.
    cells = re.findall(r"[0-9.]+ \([^)]*\)|(?<!\S)-(?!\S)", rest)
    assert len(cells) == 2, (n, line)
    for v, cell in zip(("kref", "percpu"), (c.split()[0] for c in cells)):
        # A repetition where either completed no pair is left out (a
        # loaded machine, a sanitizer build: it happens), and counted so.
        pairs = [(a, b) for a, b in zip(by[(v, n)]["samples"], by[("private", n)]["samples"])
                 if a["ops"] and b["ops"]]
        assert len(by[(v, n)]["samples"]) == 4, by[(v, n)]["samples"]
        ratios = sorted(a["ops"] / a["seconds"] / (b["ops"] / b["seconds"]) for a, b in pairs)
        got = by[(v, n)]["versus"]
        assert got["variant"] == "private" and got["rounds"] == len(ratios), got
        counted += len(ratios)
        if not ratios:
            assert cell == "-", (v, n, line)
            continue
        for key, want in (("median", statistics.median(ratios)), ("low", ratios[0]),
                          ("high", ratios[-1])):
            assert abs(got[key] - want) <= 1e-5 * want, (v, n, key, got[key], want)
        # Printed to 3 decimals from the full figure; the JSON has 6 digits.
        assert abs(float(cell) - got["median"]) <= 0.0005 + 1e-5 * got["median"], (v, n, cell)
assert counted, "no round counted in the whole table"
' "$tmp/json" "$tmp/table" "$rows"; then
		echo "ok: --versus private, rows $rows, 4 rounds"
	else
		echo "FAIL: --versus private: ratios or table"
		sed 's/^/  /' "$tmp/table" | head -20
		fails=$((fails + 1))
	fi
else
	echo "FAIL: --versus private: exit status $?"
	fails=$((fails + 1))
fi
# A round where a point completed nothing does not count: managed-latency
# releases nothing in a 1 ms window: before each put its thread sleeps a
# random part of the 60 s scan interval (seconds, rand() unseeded), and
# a put's release waits for a scan.
if "$bench" managed-latency --threads 1 --variants faithful,filtered --versus faithful \
	--repeat 2 --duration 0.001 --interval-ms 60000 --json - >"$tmp/json" 2>"$tmp/table" &&
   "$python" -c '
import json, sys
rows = {r["variant"]: r for r in map(json.loads, open(sys.argv[1]))}
assert all(s["ops"] == 0 for r in rows.values() for s in r["samples"]), "a release happened"
assert rows["filtered"]["versus"] == {"variant": "faithful", "median": None, "low": None,
                                      "high": None, "rounds": 0}, rows["filtered"]["versus"]
' "$tmp/json" && grep -q '^1 point had repetitions where it or faithful completed no release' \
	"$tmp/table"; then
	echo "ok: --versus leaves out empty rounds"
else
	echo "FAIL: --versus with empty rounds"
	sed 's/^/  /' "$tmp/table" | head -20
	fails=$((fails + 1))
fi

# A workload with groups (signal1's containers) leads the versus table's
# rows with the group count, as its main table does (threads alone were
# printed there): 1 and 4 threads of 2 workers are 1 and 2 containers.
if "$bench" signal1 --threads 1,4 --workers 2 --variants global,cached --versus global \
	--oversubscribe $short >"$tmp/table" 2>&1 &&
   grep -A3 '^versus global:' "$tmp/table" | sed -n 2,4p >"$tmp/versus" &&
   grep -Eq '^containers +threads +cached$' "$tmp/versus" &&
   grep -Eq '^ +1 +1 +[0-9.]+$' "$tmp/versus" && grep -Eq '^ +2!? +4 +[0-9.]+$' "$tmp/versus"; then
	echo "ok: signal1's versus rows lead with their containers"
else
	echo "FAIL: signal1 --versus table"
	sed 's/^/  /' "$tmp/table" | tail -6
	fails=$((fails + 1))
fi

# managed-scan measures one scan at a time: at two threads the flushes
# shared scans and counted as scans that never ran.
expect 2 managed-scan --threads 1,2 --oversubscribe --variants filtered-1k $short
grep -q 'one thread only' "$tmp/err" ||
	{ echo "FAIL: managed-scan --threads 1,2: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }

# --dry-run: everything checked as a run checks it, the plan printed,
# nothing measured and no --json file made.
expect 0 micro --dry-run --threads 1 --variants private,kref --repeat 2 --json "$tmp/dry.json"
if grep -qx 'micro: 1 thread row (1) x 2 variants (private,kref) x 2 repetitions: 4 points, .*' \
	"$tmp/out" && [ ! -e "$tmp/dry.json" ]; then
	echo "ok: --dry-run printed the plan and wrote no file"
else
	echo "FAIL: --dry-run: $(head -1 "$tmp/out")"
	fails=$((fails + 1))
fi
expect 2 micro --dry-run --threads 0
expect 2 managed-scan --dry-run --threads 2 --oversubscribe
expect 1 micro --dry-run --json "$tmp/nosuch/dry.json"
mkdir "$tmp/dir.json"
expect 1 micro --dry-run --json "$tmp/dir.json"
expect 1 micro --threads 1 --variants private $short --json "$tmp/dir.json"
# ... and what the run's own open refuses: a path through a file, a
# dangling link into no folder, a loop of links (--dry-run passed them).
: >"$tmp/file"
ln -s "$tmp/nosuch/y" "$tmp/dangling"
ln -s "$tmp/loop" "$tmp/loop"
for path in "$tmp/file/x" "$tmp/dangling" "$tmp/loop"; do
	expect 1 micro --dry-run --json "$path"
	expect 1 micro --threads 1 --variants private $short --json "$path"
done

# A FIFO with no reader: a clear error at once, where the open waited for
# a reader, saying nothing (until ctest's timeout).
if mkfifo "$tmp/fifo" 2>/dev/null; then
	expect 1 micro --threads 1 --variants private $short --json "$tmp/fifo"
	grep -q 'a FIFO with no reader' "$tmp/err" ||
		{ echo "FAIL: FIFO: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
fi

# The flagged table row and its footnote.
"$bench" signal1 --threads "$over" --variants cached $short >"$tmp/out" 2>&1
if grep -q "^ *$over! " "$tmp/out" && grep -q '^! oversubscribed' "$tmp/out"; then
	echo "ok: oversubscribed row flagged"
else
	echo "FAIL: oversubscribed row not flagged:"
	cat "$tmp/out"
	fails=$((fails + 1))
fi

finish

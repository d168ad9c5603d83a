#!/bin/sh
# SPDX-License-Identifier: MIT
# py_tools.sh BENCH - bad input to bench/plot.py, bench/report.py and
# scripts/fast_paths.py: a message and exit status 2 (1 for a closed pipe),
# never a Python traceback; and a good input still works.  Each case below
# once ended in a traceback (an adversarial review), or, for report.py given
# another workload's file, in a silently wrong table.
. "$(dirname -- "$0")/lib/preamble.sh"
here=$(dirname -- "$0")
root=$here/../..

# expect STATUS TOOL ARGS...: want STATUS and no traceback on stderr.
expect() {
	want=$1
	shift
	"$python" "$@" >"$tmp/out" 2>"$tmp/err"
	got=$?
	if [ "$got" -ne "$want" ] || grep -q '^Traceback' "$tmp/err"; then
		echo "FAIL: $*: exit $got, want $want (no traceback)"
		sed 's/^/  stderr: /' "$tmp/err" | tail -3
		fails=$((fails + 1))
	else
		echo "ok: $* -> $got: $(head -1 "$tmp/err")"
	fi
}

# Runs of 0.1 s: in one of 0.02 s on a loaded machine the private variant
# completed no pair (a flake hunt), and the tables below need figures.
short="--duration 0.1 --threads 1"
"$bench" micro $short --variants private,kref --json "$tmp/micro.json" >/dev/null ||
	{ echo "FAIL: percpuref-bench micro"; exit 1; }
"$bench" labels $short --variants off,kref --json "$tmp/labels.json" >/dev/null ||
	{ echo "FAIL: percpuref-bench labels"; exit 1; }
plot=$root/bench/plot.py
report=$root/bench/report.py

# plot.py
expect 0 "$plot" "$tmp/micro.json" -o "$tmp/micro.png"
expect 2 "$plot" /bin/sh -o "$tmp/x.png"			# not UTF-8
echo '[]' >"$tmp/empty.json"
expect 2 "$plot" "$tmp/empty.json" -o "$tmp/x.png"		# wrote nothing, exit 0
sed 's/"ops_per_sec":[^,]*/"ops_per_sec":NaN/' "$tmp/micro.json" >"$tmp/nan.json"
expect 2 "$plot" "$tmp/nan.json" -o "$tmp/x.png"
expect 2 "$plot" "$tmp/micro.json" -o "$tmp/x.txt"		# after drawing
# A python3 without matplotlib (one earlier on PATH than Debian's) said so
# in a traceback; a module of that name that fails to import stands in.
mkdir "$tmp/no-matplotlib"
echo 'raise ImportError("No module named matplotlib")' >"$tmp/no-matplotlib/matplotlib.py"
PYTHONPATH=$tmp/no-matplotlib
export PYTHONPATH
expect 2 "$plot" "$tmp/micro.json" -o "$tmp/x.png"
unset PYTHONPATH
# -o is the name written: "" wrote ".png" in the current folder, and a name
# without an extension got ".png" from matplotlib, both said "wrote" the
# name given, exit 0.
expect 2 "$plot" "$tmp/micro.json" -o ""
# A repeated option is refused, as percpuref-bench refuses one: the last
# was taken without a word.
# expect_twice TOOL ARGS...: exit 2, saying which option came twice.
expect_twice() {
	expect 2 "$@"
	grep -q 'given twice$' "$tmp/err" || {
		echo "FAIL: $*: not refused as an option given twice"
		fails=$((fails + 1))
	}
}
expect_twice "$plot" "$tmp/micro.json" -o "$tmp/a.png" -o "$tmp/b.png"
expect 2 "$plot" "$tmp/micro.json" -o "$tmp/noext"
expect 2 "$plot" "$tmp/micro.json" "$tmp/labels.json" -o "$tmp/noext"
printf '{"schema":"percpuref-reference/1","workload":"micro","source":"s",' >"$tmp/ref.json"
printf '"columns":[{"key":"k","label":"l"}],"rows":[{"threads":1}]}\n' >>"$tmp/ref.json"
expect 2 "$plot" "$tmp/micro.json" -o "$tmp/x.png" --reference "$tmp/ref.json"
expect 2 "$plot" "$tmp/micro.json" -o "$tmp/x.png" --reference "$root/bench/reference/labels.json"

# report.py
mkdir "$tmp/r"
cp "$tmp/labels.json" "$tmp/r/labels.json"
expect 0 "$report" --results "$tmp/r"
cp "$tmp/micro.json" "$tmp/r/signal1.json"			# KeyError
expect 2 "$report" --results "$tmp/r"
# signal1's own name, but no "groups": what the table needs is missing.
sed 's/"workload":"labels"/"workload":"signal1"/' "$tmp/labels.json" >"$tmp/r/signal1.json"
expect 2 "$report" --results "$tmp/r"
rm "$tmp/r/signal1.json"
cp "$tmp/micro.json" "$tmp/r/labels.json"			# a wrong table, exit 0
expect 2 "$report" --results "$tmp/r"
cp "$tmp/labels.json" "$tmp/r/labels.json"
cp /bin/sh "$tmp/r/creds.json"
expect 2 "$report" --results "$tmp/r"
rm "$tmp/r/creds.json"
mkdir "$tmp/refs"
printf '{"schema":"percpuref-reference/1"}\n' >"$tmp/refs/labels.json"
cp "$root/bench/reference/creds.json" "$root/bench/reference/signal1.json" "$tmp/refs/"
cp "$tmp/labels.json" "$tmp/r/labels.json"
expect 2 "$report" --results "$tmp/r" --reference-dir "$tmp/refs"
# Two runs in one file (concatenated, as docs/bench.md allows for plotting):
# the table mixed them, the last run's figure per point under the first
# run's machine and baseline, exit 0.
sed 's/"started":"[^"]*"/"started":"2000-01-01T00:00:00Z"/' "$tmp/labels.json" >"$tmp/other.json"
cat "$tmp/labels.json" "$tmp/other.json" >"$tmp/r/labels.json"
expect 2 "$report" --results "$tmp/r"
# Two runs that started within one second are two runs: "started" has
# microseconds (to the second, a threads run and a --processes run made
# back to back were one series, the first's rows replaced by the second's).
"$bench" labels $short --variants off --json "$tmp/one.json" >/dev/null
"$bench" labels $short --variants off --json "$tmp/two.json" >/dev/null
cat "$tmp/one.json" "$tmp/two.json" >"$tmp/r/labels.json"
expect 2 "$report" --results "$tmp/r"
grep -q 'holds 2 runs' "$tmp/err" ||
	{ echo "FAIL: two runs in one second: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
# A --processes run beside the reports' shared-object figures: refused
# (report.py), labelled (plot.py).
if "$bench" labels $short --variants off --processes --json "$tmp/r/labels.json" >/dev/null; then
	expect 2 "$report" --results "$tmp/r"
	grep -q 'a --processes run' "$tmp/err" ||
		{ echo "FAIL: report.py --processes: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
fi
# A reference whose figures are read relative to a first one of 0, or
# whose rows' thread counts are not counts: a ZeroDivisionError, a
# TypeError.
"$bench" signal1 --threads 1 --duration 0.1 --variants global --json "$tmp/signal1.json" \
	>/dev/null || { echo "FAIL: percpuref-bench signal1"; exit 1; }
sed '0,/"before": *[0-9.]*/s//"before": 0/' "$root/bench/reference/signal1.json" \
	>"$tmp/refs/signal1.json"
grep -q '"before": 0' "$tmp/refs/signal1.json" ||
	{ echo "FAIL: py_tools.sh: signal1.json's column names changed"; fails=$((fails + 1)); }
expect 2 "$plot" "$tmp/signal1.json" -o "$tmp/x.png" --reference "$tmp/refs/signal1.json"
cp "$tmp/signal1.json" "$tmp/r/signal1.json"
cp "$tmp/labels.json" "$tmp/r/labels.json"
cp "$root/bench/reference/labels.json" "$tmp/refs/"
expect 2 "$report" --results "$tmp/r" --reference-dir "$tmp/refs"
grep -q 'signal1.json: column "before"' "$tmp/err" ||
	{ echo "FAIL: a first figure of 0: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
rm "$tmp/r/signal1.json"
# ... and a 0 in the first row that has a thread count, after one without
# (the check looked at the first figure of any row).
printf '{"schema":"percpuref-reference/1","workload":"signal1","source":"s","metric":"m",' \
	>"$tmp/refs/signal1.json"
printf '"columns":[{"key":"a","label":"l"}],"rows":[{"values":{"a":5}},' >>"$tmp/refs/signal1.json"
printf '{"groups":1,"values":{"a":0}},{"groups":2,"values":{"a":3}}]}\n' >>"$tmp/refs/signal1.json"
expect 2 "$plot" "$tmp/signal1.json" -o "$tmp/x.png" --reference "$tmp/refs/signal1.json"
for threads in 0 '"8"' '[8]' true; do
	sed "s/\"threads\": *[0-9]*/\"threads\": $threads/" "$root/bench/reference/labels.json" \
		>"$tmp/refs/labels.json"
	expect 2 "$plot" "$tmp/labels.json" -o "$tmp/x.png" --reference "$tmp/refs/labels.json"
done
# A signal1 record whose groups or workers is no positive count (a file
# edited by hand): the rows it made were left out of the table unsaid.
for change in 's/"groups":[0-9]*/"groups":0/' 's/"workers":[0-9]*/"workers":"x"/' \
	's/"params":{[^}]*}/"params":[1]/'; do
	sed "$change" "$tmp/signal1.json" >"$tmp/r/signal1.json"
	if cmp -s "$tmp/signal1.json" "$tmp/r/signal1.json"; then
		echo "FAIL: py_tools.sh: '$change' changed nothing in signal1.json"
		fails=$((fails + 1))
	fi
	expect 2 "$report" --results "$tmp/r"
	grep -q 'must be positive counts\|params is not an object' "$tmp/err" ||
		{ echo "FAIL: $change: $(head -1 "$tmp/err")"; fails=$((fails + 1)); }
done
rm "$tmp/r/signal1.json"
# Only oversubscribed rows: no row within the CPUs to compare (max() of
# nothing).
cpus=$("$bench" --topology | sed -n 's/^machine: .*; \([0-9]*\) of .*/\1/p')
over=$((cpus + 1))
"$bench" labels --threads "$over" --baseline "$over" --oversubscribe --variants off,kref \
	--duration 0.1 --json "$tmp/r/labels.json" >/dev/null
expect 0 "$report" --results "$tmp/r"
# A --results folder that is not there (a typo): its three cases were
# reported as not run, exit 0 with -o elsewhere, else exit 1 naming
# report.md.
expect 2 "$report" --results "$tmp/nosuch" -o "$tmp/nosuch.md"
expect 2 "$report" --results "$tmp/nosuch"
expect_twice "$report" --results "$tmp/r" --results "$tmp/r"
expect_twice "$report" --results "$tmp/r" -o "$tmp/a.md" --output "$tmp/b.md"
expect_twice "$report" --results "$tmp/r" --reference-dir "$tmp/refs" --reference-dir "$tmp/refs"
expect 2 "$report" --results "$tmp/r/labels.json" -o "$tmp/nosuch.md"
# A closed pipe: exit 1, no traceback.
"$python" "$report" --results "$tmp/r" 2>"$tmp/err" | head -c 1 >/dev/null
if grep -q '^Traceback' "$tmp/err"; then
	echo "FAIL: report.py | head: traceback"
	fails=$((fails + 1))
else
	echo "ok: report.py | head: no traceback"
fi

# A machine with no L3 or package data says so, as the harness does (it
# read "1 none domain(s)").
sed 's/"domain_source":"[^"]*"/"domain_source":"none"/; s/"l3_domains":[0-9]*/"l3_domains":1/' \
	"$tmp/labels.json" >"$tmp/r/labels.json"
expect 0 "$report" --results "$tmp/r"
if grep -qF "1 domain (no L3 or package data)" "$tmp/r/report.md" &&
	! grep -q "none domain" "$tmp/r/report.md"; then
	echo "ok: report.py: a machine without domain data"
else
	echo "FAIL: report.py: want \"1 domain (no L3 or package data)\", got:"
	grep "^Machine" "$tmp/r/report.md" | sed 's/^/  /'
	fails=$((fails + 1))
fi

# A field of the right name and the wrong kind or size, in a record that
# parses: a traceback from either tool (an adversarial review).
for change in 's/"machine":{[^}]*}/"machine":"x"/' 's/"started":"[^"]*"/"started":[1]/' \
	's/"cpus":\([0-9]*\),"l3_domains"/"cpus":"\1","l3_domains"/' \
	's/"threads":1,/"threads":1'"$(printf '%0400d' 0)"',/' \
	's/"threads":1,/"threads":18446744073709551616,/' \
	's/"ops_per_sec":[^,]*/"ops_per_sec":1'"$(printf '%0400d' 0)"'/' \
	's/"efficiency":[^,]*/"efficiency":1e308/' 's/"ns_per_op":\([^,]*\)/"ns_per_op":"\1"/'; do
	sed "$change" "$tmp/labels.json" >"$tmp/r/labels.json"
	if cmp -s "$tmp/labels.json" "$tmp/r/labels.json"; then
		echo "FAIL: py_tools.sh: '$change' changed nothing"
		fails=$((fails + 1))
	fi
	expect 2 "$plot" "$tmp/r/labels.json" -o "$tmp/x.png"
	expect 2 "$report" --results "$tmp/r"
done
cp "$tmp/labels.json" "$tmp/r/labels.json"

# signal1 with two workers a container: the one-container row reads 100%
# (it read 50%, every row off by the workers), from the row of a whole
# container (not the harness's one-thread baseline); plot.py refuses to
# set the report's per-container curve beside per-thread points.
"$bench" signal1 --workers 2 --threads 2,4 --duration 0.1 --variants global,cached \
	--json "$tmp/r/signal1.json" >/dev/null || { echo "FAIL: percpuref-bench signal1"; exit 1; }
expect 0 "$report" --results "$tmp/r"
row=$(grep '^| 1 ' "$tmp/r/report.md" | head -1)
here=$(echo "$row" | awk -F'|' '{ print $4 "|" $7 }')
if [ "$(echo "$here" | grep -o '(100%)' | wc -l)" -eq 2 ]; then
	echo "ok: report.py: signal1 --workers 2: one container reads 100%"
else
	echo "FAIL: report.py: signal1 --workers 2, one container: $row"
	fails=$((fails + 1))
fi
grep -q '^Parameters of this run: workers=2' "$tmp/r/report.md" ||
	{ echo "FAIL: report.py: no parameters line"; fails=$((fails + 1)); }
expect 2 "$plot" "$tmp/r/signal1.json" -o "$tmp/x.png" \
	--reference "$root/bench/reference/signal1.json"
rm "$tmp/r/signal1.json"

# creds: the report's "at NT" figures come from the largest row within the
# CPUs, not from an oversubscribed one.
"$bench" creds --threads "1,$over" --oversubscribe --duration 0.1 \
	--json "$tmp/r/creds.json" >/dev/null || { echo "FAIL: percpuref-bench creds"; exit 1; }
expect 0 "$report" --results "$tmp/r"
if grep -q "at ${over}T" "$tmp/r/report.md"; then
	echo "FAIL: report.py: creds figures at the oversubscribed ${over}T row"
	fails=$((fails + 1))
else
	echo "ok: report.py: creds figures within the CPUs"
fi
rm "$tmp/r/creds.json"

# fast_paths.py: a number that int() takes and a user would not mean.
expect 2 "$root/scripts/fast_paths.py" "$bench" --repeat 1_0
expect 2 "$root/scripts/fast_paths.py" "$bench" --repeat " 1"

finish

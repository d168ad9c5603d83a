#!/bin/sh
# SPDX-License-Identifier: MIT
# topology.sh BENCH - thread placement on made-up machines: topology.c reads
# a fake sysfs CPU tree from PERCPUREF_BENCH_SYSFS, and `percpuref-bench
# --topology` prints the order the harness would place threads in, with
# '|' between domains.  The rule (docs/bench.md): fill one L3 domain before
# the next; inside a domain, one CPU per core before any SMT sibling.
. "$(dirname -- "$0")/lib/preamble.sh"

# cpu DIR N SIBLINGS PACKAGE [L3]: CPU N of the fake tree DIR.
cpu() {
	d=$1/cpu$2
	mkdir -p "$d/topology"
	echo "$3" >"$d/topology/thread_siblings_list"
	echo "$4" >"$d/topology/package_cpus_list"
	[ $# -ge 5 ] || return 0
	for i in 0 1 2 3; do
		mkdir -p "$d/cache/index$i"
	done
	echo 1 >"$d/cache/index0/level"
	echo "$3" >"$d/cache/index0/shared_cpu_list"
	echo 1 >"$d/cache/index1/level"
	echo "$3" >"$d/cache/index1/shared_cpu_list"
	echo 2 >"$d/cache/index2/level"
	echo "$3" >"$d/cache/index2/shared_cpu_list"
	echo 3 >"$d/cache/index3/level"
	echo "$5" >"$d/cache/index3/shared_cpu_list"
}

# check DIR MACHINE PLACEMENT: --topology on DIR says both.
check() {
	out=$(PERCPUREF_BENCH_SYSFS=$1 "$bench" --topology)
	if echo "$out" | grep -qF "$2" && echo "$out" | grep -qx "placement: $3"; then
		echo "ok: $1: $3"
	else
		echo "FAIL: $1: want \"$2\" and \"placement: $3\", got:"
		echo "$out" | sed 's/^/  /'
		fails=$((fails + 1))
	fi
}

# Two L3 domains x two cores x two SMT threads, numbered as Linux does on
# x86: core c has CPUs c and c+4; cores 0-1 share one L3, cores 2-3 another.
l3=$tmp/l3
for c in 0 1 2 3; do
	if [ $c -lt 2 ]; then cache="0-1,4-5"; else cache="2-3,6-7"; fi
	cpu "$l3" $c "$c,$((c + 4))" 0-7 "$cache"
	cpu "$l3" $((c + 4)) "$c,$((c + 4))" 0-7 "$cache"
done
echo 0-7 >"$l3/online"
check "$l3" "8 of 8 online CPUs usable, 2 L3 domains, SMT" "0 1 4 5 | 2 3 6 7"

# The same with CPU 3 offline: its sibling 7 is then core 3's first CPU,
# so it comes before CPU 6, the second thread of core 2.
cp -R "$l3" "$tmp/offline"
echo 0-2,4-7 >"$tmp/offline/online"
check "$tmp/offline" "7 of 7 online CPUs usable, 2 L3 domains, SMT" "0 1 4 5 | 2 7 6"

# No cache data: one domain per package (even CPUs, odd CPUs), no SMT.
pkg=$tmp/package
for c in 0 1 2 3 4 5 6 7; do
	cpu "$pkg" $c $c "$((c % 2)),$((c % 2 + 2)),$((c % 2 + 4)),$((c % 2 + 6))"
done
echo 0-7 >"$pkg/online"
check "$pkg" "8 of 8 online CPUs usable, 2 package domains, no SMT siblings" \
	"0 2 4 6 | 1 3 5 7"

# No cache or package data at all: one domain, said as such (it read
# "1 none domain").
flat=$tmp/flat
for c in 0 1; do
	mkdir -p "$flat/cpu$c"
done
echo 0-1 >"$flat/online"
check "$flat" "2 of 2 online CPUs usable, 1 domain (no L3 or package data)" "0 1"

# --baseline domain: the first domain's CPUs (4 on the two-L3 machine), the
# reports' 8C16T = 100%; one thread where there is a single domain.
for case in "$l3 1,4" "$flat 1"; do
	dir=${case% *} want=${case#* }
	rows=$(PERCPUREF_BENCH_SYSFS=$dir "$bench" labels --baseline domain --threads 1 \
		--dry-run | sed -n 's/.*rows\{0,1\} (\([0-9,]*\)).*/\1/p')
	if [ "$rows" = "$want" ]; then
		echo "ok: $dir: --baseline domain rows $rows"
	else
		echo "FAIL: $dir: --baseline domain rows \"$rows\", want $want"
		fails=$((fails + 1))
	fi
done

# A fake tree whose online list is missing, malformed or empty is refused:
# it fell back to the real machine's CPUs without a word ("0-" was CPU 0,
# "1-0" and an empty line "no usable CPU"), and one naming a CPU a
# cpu_set_t cannot hold ("0-1024" read as 1024 CPUs).
bad=$tmp/bad
cp -R "$flat" "$bad"
for list in "0-x" "0-" "1-0" "" "x" "0,,1" "-1" "0-1024" "99999999999999999999" missing; do
	if [ "$list" = missing ]; then
		rm -f "$bad/online"
	else
		printf '%s\n' "$list" >"$bad/online"
	fi
	if out=$(PERCPUREF_BENCH_SYSFS=$bad "$bench" --topology 2>&1); then
		echo "FAIL: online \"$list\" accepted:"
		echo "$out" | sed 's/^/  /'
		fails=$((fails + 1))
	elif echo "$out" | grep -qF "PERCPUREF_BENCH_SYSFS: $bad/online"; then
		echo "ok: online \"$list\" refused"
	else
		echo "FAIL: online \"$list\": want an error naming $bad/online, got:"
		echo "$out" | sed 's/^/  /'
		fails=$((fails + 1))
	fi
done

# The real sysfs lying: an online list (a container's virtual one, a
# bind mount here) with none of the CPUs this process may run on.  The
# process runs on its mask's CPUs, so the mask stands in, with a warning;
# it died with "no usable CPU".  Needs a mount namespace.
echo 1023 >"$tmp/online-none"
if out=$(unshare -m sh -c 'mount --bind "$1" /sys/devices/system/cpu/online &&
			    exec "$2" --topology' sh "$tmp/online-none" "$bench" 2>&1); then
	if echo "$out" | grep -qF "/sys/devices/system/cpu/online lists none of the" &&
	   echo "$out" | grep -q "^fast path"; then
		echo "ok: an online list without this process's CPUs: the mask used, with a warning"
	else
		echo "FAIL: an online list without this process's CPUs: no warning or no topology:"
		echo "$out" | sed 's/^/  /'
		fails=$((fails + 1))
	fi
elif echo "$out" | grep -q "^unshare:\|^mount:"; then
	echo "ok: an online list without this process's CPUs # skip: no mount namespace"
else
	echo "FAIL: an online list without this process's CPUs refused:"
	echo "$out" | sed 's/^/  /'
	fails=$((fails + 1))
fi

finish

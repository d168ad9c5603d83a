#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Packs built benchmarks into a folder that runs on another x86-64 Linux
# machine with no compiler, no liburcu and no network (a lent many-core
# machine, a production host): the benchmark binaries, the shared libraries
# they need besides the C and C++ runtimes (liburcu-bp), and run.sh.
#
#   scripts/bundle.sh BUILD_DIR [BUNDLE_DIR]    (default build/bundle)
#
# BUILD_DIR is a Release build with the benchmarks built, e.g.
#   cmake -S . -B build/rel -DCMAKE_BUILD_TYPE=Release && cmake --build build/rel
# Then, on the other machine (glibc and libstdc++ as new as the build
# machine's or newer):
#   BUNDLE_DIR/run.sh [--quick] [--threads LIST] [--out DIR] [WORKLOAD...]
# which prints every table and writes DIR/WORKLOAD.txt and .json.
# BUNDLE_DIR may be new, empty or an earlier bundle, whose bin/, lib/ and
# run.sh are replaced (results kept beside them stay); anything else is
# refused.
set -euo pipefail

usage() {
	echo "usage: scripts/bundle.sh BUILD_DIR [BUNDLE_DIR]" >&2
	exit 2
}
(($# == 1 || $# == 2)) || usage
build=$1
bundle=${2-build/bundle}
# An empty name (an unset variable) is a mistake, not the default: an
# empty BUNDLE_DIR packed into build/bundle, wherever the caller stood.
[[ -n $build && -n $bundle ]] || usage
[[ $bundle == /* ]] || bundle=./$bundle	# a name starting with '-' is no option
binaries=(bench/percpuref-bench bench/percpuref-anatomy)
for binary in "${binaries[@]}"; do
	if [[ ! -x $build/$binary ]]; then
		echo "bundle.sh: $build/$binary is missing: build the benchmarks first" >&2
		exit 1
	fi
done

# Replaces an earlier bundle's parts, never anything else (a mistyped
# build folder): the folder must be new, empty, or carry run.sh's marker.
marker="# Runs the packed percpuref benchmarks"
if [[ -e $bundle || -L $bundle ]]; then
	if [[ ! -d $bundle || ! -r $bundle ]] ||
		{ [[ -n $(ls -A -- "$bundle") ]] && ! grep -qs "^$marker" "$bundle/run.sh"; }; then
		echo "bundle.sh: $bundle exists and is not a bundle; not replacing it" >&2
		exit 1
	fi
fi
rm -rf -- "$bundle/bin" "$bundle/lib" "$bundle/run.sh"
mkdir -p -- "$bundle/bin" "$bundle/lib"
# The marker first, so that a run that fails below can be repeated.
echo "$marker (unfinished: run scripts/bundle.sh again)" >"$bundle/run.sh"
for binary in "${binaries[@]}"; do
	cp -- "$build/$binary" "$bundle/bin/"
done
# Every library the binaries load that is not part of the C or C++ runtime
# (which the other machine has, newer) goes along, under its soname.
for binary in "$bundle"/bin/*; do
	if ! ldd "$binary" >"$bundle/lib/.ldd" 2>&1; then
		echo "bundle.sh: ldd cannot read $binary (another architecture?):" >&2
		cat "$bundle/lib/.ldd" >&2
		exit 1
	fi
	if grep -q "not found" "$bundle/lib/.ldd"; then
		echo "bundle.sh: a library $binary needs was not found:" >&2
		grep "not found" "$bundle/lib/.ldd" >&2
		exit 1
	fi
	awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' "$bundle/lib/.ldd"
done | sort -u | while read -r soname path; do
	case $soname in
	ld-linux* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | libdl.so.* | \
		librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libnss_* | \
		libstdc++.so.* | libgcc_s.so.*) ;;
	*) cp -L -- "$path" "$bundle/lib/$soname" ;;
	esac
done
rm -f -- "$bundle/lib/.ldd"

cat >"$bundle/run.sh" <<'RUN'
#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs the packed percpuref benchmarks here (written by scripts/bundle.sh).
#
#   run.sh [--quick] [--threads LIST] [--out DIR] [WORKLOAD...]
#
# WORKLOAD: any percpuref-bench workload, anatomy, or switch-storm-in-flight
# (switch-storm --in-flight 16: threads that do not wait for each batch's
# releases); default: the scaling workloads (micro, managed-hot,
# managed-scan, switch-storm, switch-storm-in-flight, fence-cost, anatomy)
# and the three seed cases (labels, creds, signal1).  Each point
# is the median of 3 interleaved runs of 0.5 s (--quick: one run of 0.2 s,
# and a short anatomy); managed-hot also gets --versus idle.  --threads is
# passed to every percpuref-bench workload
# but managed-scan (default: each workload's, 1, 2, 4, ... all CPUs;
# anatomy and managed-scan run one).
# Tables go to standard output and DIR/WORKLOAD.txt, JSON Lines to
# DIR/WORKLOAD.json (DIR: default results-HOSTNAME).
set -euo pipefail
here=$(dirname -- "$(readlink -f -- "$0")")
export LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bench=$here/bin/percpuref-bench
repeat=3 duration=0.5 out=results-$(uname -n) threads=() anatomy=()
workloads=() given=()
while (($#)); do
	case $1 in
	--quick) repeat=1 duration=0.2 anatomy=(--pairs 2000000 --rounds 2) ;;
	--threads | --out)
		if (($# < 2)); then
			echo "run.sh: $1 needs a value" >&2
			exit 2
		fi
		# Refused twice, as percpuref-bench refuses a repeated flag.
		if [[ " ${given[*]} " == *" $1 "* ]]; then
			echo "run.sh: $1 given twice" >&2
			exit 2
		fi
		given+=("$1")
		if [[ $1 == --out ]]; then out=$2; else threads=(--threads "$2"); fi
		shift
		;;
	-h | --help)
		awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"
		exit 0
		;;
	-*)
		echo "run.sh: unknown option $1 (see run.sh --help)" >&2
		exit 2
		;;
	*) workloads+=("$1") ;;
	esac
	shift
done
# An empty name was refused by mkdir; "./" would write into the current folder.
if [[ -z $out ]]; then
	echo "run.sh: --out needs a folder name" >&2
	exit 2
fi
# A name starting with '-' is no option (tee took --out -res for its own).
[[ $out != -* ]] || out=./$out
((${#workloads[@]})) ||
	workloads=(micro managed-hot managed-scan switch-storm switch-storm-in-flight fence-cost anatomy
		labels creds signal1)
known=$("$bench" --help |
	awk '/^workloads:/ { on = 1; next } on && !/^  [a-z]/ { exit } on { print $1 }')
for w in "${workloads[@]}"; do
	if [[ $w != anatomy && $w != switch-storm-in-flight ]] && ! grep -qxF -- "$w" <<<"$known"; then
		echo "run.sh: unknown workload $w; workloads: anatomy switch-storm-in-flight" \
			"$(echo $known)" >&2
		exit 2
	fi
done

# args_for WORKLOAD: the arguments its run gets, in the array args.
# managed-scan measures one scan at a time, and runs one thread whatever
# --threads says.  managed-hot's figure is the hot ref's share of idle
# throughput: --versus idle, each repetition's scan over idle's in the
# same sweep of its row.
args_for() {
	args=(--repeat "$repeat" --duration "$duration")
	[[ $1 == managed-scan ]] || args+=("${threads[@]}")
	[[ $1 == managed-hot ]] && args+=(--versus idle)
	# As scripts/bench.sh: the reports' 100% is their first L3 domain.
	[[ $1 == labels ]] && args+=(--baseline domain)
	if [[ $1 == switch-storm-in-flight ]]; then
		args=(switch-storm --in-flight 16 "${args[@]}")
	else
		args=("$1" "${args[@]}")
	fi
}

# Every workload's arguments are checked (percpuref-bench --dry-run: a bad
# --threads, or one that signal1's limit on pending signals refuses) before
# machine.txt and the first table are overwritten: a bad --threads failed
# in the first workload, with both already lost.
for w in "${workloads[@]}"; do
	[[ $w == anatomy ]] && continue
	args_for "$w"
	if ! "$bench" "${args[@]}" --dry-run >/dev/null; then
		echo "run.sh: $w: bad arguments (see above)" >&2
		exit 2
	fi
done
if ! mkdir -p -- "$out" 2>/dev/null || [[ ! -w $out ]]; then
	echo "run.sh: --out $out is not a folder this user can write" >&2
	exit 2
fi
{
	echo "date: $(date -u +%FT%TZ)"
	echo "kernel: $(uname -r)"
	"$bench" --version
	"$bench" --topology
} | tee "$out/machine.txt"
for w in "${workloads[@]}"; do
	echo
	if [[ $w == anatomy ]]; then
		"$here/bin/percpuref-anatomy" "${anatomy[@]}" | tee "$out/anatomy.txt"
	else
		args_for "$w"
		"$bench" "${args[@]}" --json "$out/$w.json" | tee "$out/$w.txt"
	fi
done
RUN
chmod +x "$bundle/run.sh"
echo "bundle.sh: $bundle ($(du -sh "$bundle" | cut -f1)): run $bundle/run.sh there"

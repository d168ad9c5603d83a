#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The main job: installs dependencies, builds, runs the three cases (labels,
# creds, signal1) with every variant, prints their tables and the "seed vs
# measured" tables (the reports' published numbers beside ours), and writes
# results/report.md with one PNG per case (published curves dashed).
#
#   scripts/bench.sh [--quick | --full]
#
# Default: medians of 3 interleaved runs per point, about 2 minutes on 2
# CPUs.  --quick: one run per point (under a minute), for a first look.
# --full: best of 5 runs of 1 s (about 10 minutes on 2 CPUs, more with
# more CPUs): what the machine can do when nothing else runs.
set -euo pipefail
cd "$(dirname "$0")/.."

repeat=3 stat=median scale=1
usage() { echo "usage: scripts/bench.sh [--quick | --full]" >&2; exit 2; }
(($# <= 1)) || usage
case "${1:-}" in
"") ;;
--quick) repeat=1 ;;
--full) repeat=5 stat=best scale=2 ;;
*) usage ;;
esac
scripts/deps.sh

dir=build/bench
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$dir" -j "$(nproc)" --target percpuref-bench
bench=$dir/bench/percpuref-bench
mkdir -p results

run() {
	local workload=$1 duration=$2
	shift 2
	"$bench" "$workload" --repeat "$repeat" --stat "$stat" \
		--duration "$(awk -v d="$duration" -v s="$scale" 'BEGIN { print d * s }')" \
		--json "results/$workload.json" "$@"
	echo
}
# The reports' 100% is their first full L3 domain (8C16T); with a single
# domain no row crosses one, so one thread (--baseline domain).
run labels 0.5 --baseline domain
run creds 0.3
run signal1 0.25

for workload in labels creds signal1; do
	/usr/bin/python3 bench/plot.py "results/$workload.json" -o "results/$workload.png" \
		--reference "bench/reference/$workload.json"
done
/usr/bin/python3 bench/report.py --results results

#!/usr/bin/env bash
# The main job: installs dependencies, builds, runs the AppArmor-label
# scaling benchmark (every refcount strategy side by side), prints its table,
# writes results/labels.json and plots it to results/labels.png.
# Extra arguments go to the benchmark (see: build/bench/bench/percpuref-bench --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

dir=build/bench
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$dir" -j "$(nproc)" --target percpuref-bench
mkdir -p results
# Each point is the median of 3 interleaved runs: single half-second samples
# on a shared 2-vCPU guest swing by several points.
"$dir/bench/percpuref-bench" labels --repeat 3 --json results/labels.json "$@"
/usr/bin/python3 bench/plot.py results/labels.json -o results/labels.png
echo "plot written to results/labels.png"

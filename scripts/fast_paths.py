#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Compares the three per-CPU fast paths in one table.

The fast path is chosen once per process, so each path needs its own run of
`percpuref-bench micro`: as is (glibc's rseq areas), with
GLIBC_TUNABLES=glibc.pthread.rseq=0 (the library's own areas) and with
PERCPUREF_NO_RSEQ=1 (the fallback readers).  The runs are interleaved,
REPEAT rounds of one run per path, so load that drifts over the minutes
spreads over all three; every figure is the median of its rounds.  Each
run checks with --topology that it got the path it asked for.

usage: fast_paths.py BENCH [--repeat N] [--threads LIST] [--duration S]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

PATHS = [
    ("rseq-glibc", {}),
    ("rseq-own", {"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}),
    ("fallback", {"PERCPUREF_NO_RSEQ": "1"}),
]


def run(bench, env_extra, args):
    env = dict(os.environ, **env_extra)
    try:
        out = subprocess.run([bench] + args, env=env, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"fast_paths: {bench}: {e.strerror}")
    if out.returncode != 0:
        # The bench's own message says what was wrong with the arguments.
        sys.stderr.write(out.stderr)
        sys.exit(f"fast_paths: {bench} {' '.join(args)}: exit status {out.returncode}")
    return out.stdout


def positive(text):
    # Digits only: int() also takes " 1" and "1_0" (ten).
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"want a whole number, 1 or more, got {text!r}")
    return int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench")
    ap.add_argument("--repeat", type=positive, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--duration", default="0.5")
    a = ap.parse_args()

    for path, env in PATHS:
        got = [l for l in run(a.bench, env, ["--topology"]).splitlines()
               if l.startswith("fast path: ")]
        if got != ["fast path: " + path]:
            sys.exit(f"fast_paths: asked for {path}, the library reports {got}")

    ns = {}  # (row, threads) -> [ns per pair, one per round]
    for _ in range(a.repeat):
        for path, env in PATHS:
            variants = "private,kref,percpu" if path == "rseq-glibc" else "percpu"
            out = run(a.bench, env, ["micro", "--threads", a.threads, "--variants", variants,
                                     "--duration", a.duration, "--json", "-"])
            for line in out.splitlines():
                r = json.loads(line)
                row = f"percpu {path}" if r["variant"] == "percpu" else r["variant"]
                if r["ns_per_op"] is None:
                    sys.exit(f"fast_paths: {path}: {r['variant']} at {r['threads']} threads "
                             "finished no pair; give it a longer --duration")
                ns.setdefault((row, r["threads"]), []).append(r["ns_per_op"])

    threads = sorted({t for _, t in ns})
    med = {k: statistics.median(v) for k, v in ns.items()}
    rows = ["private", "kref"] + [f"percpu {p}" for p, _ in PATHS]
    print(f"micro, ns per get+put pair, median of {a.repeat} interleaved runs per path")
    head = "".join(f"{t:>9} thr" for t in threads) + f"  eff at {threads[-1]}"
    print(f"{'':22}{head}")
    for row in rows:
        cells = "".join(f"{med[(row, t)]:13.2f}" for t in threads)
        # efficiency: throughput(N) / (N x throughput(1)) = ns(1) / ns(N)
        eff = med[(row, threads[0])] / med[(row, threads[-1])]
        print(f"{row:22}{cells}{eff:10.0%}")
    t1 = threads[0]
    print(f"own / glibc rseq pair at {t1} thread: "
          f"{med[('percpu rseq-own', t1)] / med[('percpu rseq-glibc', t1)]:.2f}")
    print(f"fallback / kref pair at {t1} thread: "
          f"{med[('percpu fallback', t1)] / med[('kref', t1)]:.2f}")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        # "| head": quiet, and no second error when stdout is flushed.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)

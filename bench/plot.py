#!/usr/bin/python3
"""Plot percpuref-bench JSON: scaling efficiency against threads.

    bench/plot.py results.json [more.json ...] [-o out.png] [--throughput]

Reads the JSON Lines that `percpuref-bench --json` writes (a JSON array of
the same objects, or "-" for stdin, works too), from any workload, and draws
one PNG per workload: efficiency (throughput(N) / (N x throughput(1))) in
percent against the thread count, one line per variant, on an axis zoomed
to the data with a reference line at 100%.  --throughput adds a
second panel with the aggregate throughput.  Workloads whose rows carry no
efficiency get the throughput panel only.

Output names: with one workload, -o names the file (default
<workload>.png); with several, the workload is appended to the stem
(out-micro.png, out-labels.png).  When the input holds several runs (files
concatenated from different runs or machines), each run is its own line,
labelled with its start time and host.

Runs with /usr/bin/python3 and Debian's python3-matplotlib (Agg backend, no
display needed).  Bad input: a message naming the file and line on stderr,
exit status 2.
"""

import argparse
import json
import os
import sys
from collections import OrderedDict

REQUIRED = {"workload": str, "variant": str, "threads": int, "ops_per_sec": (int, float)}


class InputError(Exception):
    pass


def check_record(rec, where):
    if not isinstance(rec, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for key, kind in REQUIRED.items():
        if key not in rec:
            raise InputError(f"{where}: missing field \"{key}\" (not percpuref-bench JSON?)")
        if not isinstance(rec[key], kind) or isinstance(rec[key], bool):
            raise InputError(f"{where}: field \"{key}\" has the wrong type: {rec[key]!r}")
    if rec["threads"] < 1:
        raise InputError(f"{where}: threads must be positive, got {rec['threads']}")
    eff = rec.get("efficiency")
    if eff is not None and (not isinstance(eff, (int, float)) or isinstance(eff, bool)):
        raise InputError(f"{where}: field \"efficiency\" must be a number or null: {eff!r}")
    return rec


def read_records(path):
    """All measurement objects of one file: JSON Lines, or one JSON array."""
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}")
    name = "<stdin>" if path == "-" else path
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{name}:{e.lineno}: not valid JSON: {e.msg}")
        return [check_record(r, f"{name}: element {i}") for i, r in enumerate(data)]
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{name}:{lineno}: not valid JSON: {e.msg}")
        records.append(check_record(rec, f"{name}:{lineno}"))
    if not records:
        raise InputError(f"{name}: no measurements in it")
    return records


def run_id(rec):
    machine = rec.get("machine") or {}
    return (rec.get("started", ""), machine.get("hostname", ""))


def group(records):
    """{workload: {(variant, run): {threads: record}}}, in input order."""
    out = OrderedDict()
    for rec in records:
        series = out.setdefault(rec["workload"], OrderedDict())
        series.setdefault((rec["variant"], run_id(rec)), {})[rec["threads"]] = rec
    return out


def output_path(base, workload, several):
    if base is None:
        return f"{workload}.png"
    if not several:
        return base
    stem, ext = os.path.splitext(base)
    return f"{stem}-{workload}{ext or '.png'}"


def subtitle(records):
    machine = records[0].get("machine") or {}
    parts = [machine.get("model", "")]
    if "cpus" in machine:
        domains = machine.get("l3_domains")
        if domains:
            parts.append(f"{machine['cpus']} CPUs, {domains} {machine.get('domain_source', 'L3')} "
                         f"domain{'s' if domains != 1 else ''}")
        else:
            parts.append(f"{machine['cpus']} CPUs")
    if records[0].get("duration_s") is not None:
        parts.append(f"{records[0]['duration_s']} s x {records[0].get('repeat', 1)} "
                     f"({records[0].get('stat', 'median')})")
    return "; ".join(p for p in parts if p)


def setup_threads_axis(ax, threads):
    lo, hi = min(threads), max(threads)
    if hi / lo >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(threads))
    ax.set_xticklabels([str(t) for t in sorted(threads)])
    ax.minorticks_off()
    ax.set_xlabel("threads (one per CPU, filling one L3 domain first)")
    ax.grid(True, alpha=0.3)


def efficiency_limits(records):
    """The efficiency axis, in percent, zoomed to the data: from a little
    below the lowest point to a little above the highest or 100%, whichever
    is higher, so the 100% line is always in view.  Variants that scale
    within a few percent of each other stay apart instead of being squeezed
    against the 100% line of a 0-based axis."""
    ys = [100 * rec["efficiency"] for rec in records if rec.get("efficiency") is not None]
    lo, hi = min(ys), max(100.0, max(ys))
    pad = max(0.05 * (hi - lo), 1.0)
    return max(0.0, lo - pad), hi + pad


def plot_workload(plt, workload, series, path, throughput):
    runs = {run for (_, run) in series}
    records = [rec for points in series.values() for rec in points.values()]
    threads = sorted({rec["threads"] for rec in records})
    has_eff = any(rec.get("efficiency") is not None for rec in records)
    panels = (["efficiency"] if has_eff else []) + (["throughput"] if throughput or not has_eff else [])
    op = records[0].get("op", "op")

    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 4.5 * len(panels)), squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        for (variant, run), points in series.items():
            xs = sorted(points)
            label = variant if len(runs) == 1 else f"{variant} ({run[0]} {run[1]})".strip()
            if panel == "efficiency":
                ys = [points[t].get("efficiency") for t in xs]
                ys = [None if y is None else 100 * y for y in ys]
            else:
                ys = [points[t]["ops_per_sec"] / 1e6 for t in xs]
            ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=label)
        setup_threads_axis(ax, threads)
        cpus = (records[0].get("machine") or {}).get("cpus")
        if cpus and max(threads) > cpus:
            ax.axvline(cpus, color="grey", linestyle=":", label="usable CPUs")
        if panel == "efficiency":
            ax.axhline(100, color="black", linewidth=0.8)
            ax.set_ylabel("scaling efficiency, %\nthroughput(N) / (N x throughput(1))")
            ax.set_ylim(*efficiency_limits(records))
        else:
            ax.set_ylabel(f"M{op}s/s (all threads)")
            rates = [rec["ops_per_sec"] for rec in records if rec["ops_per_sec"] > 0]
            # Variants can differ by orders of magnitude (a private counter
            # next to a contended atomic): a log scale keeps both readable.
            if rates and max(rates) / min(rates) > 20:
                ax.set_yscale("log")
            else:
                ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    axes[0, 0].set_title(f"{workload}\n{subtitle(records)}", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    parser = argparse.ArgumentParser(
        description="Plot percpuref-bench JSON: scaling efficiency against threads, "
                    "one PNG per workload.")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="JSON Lines from percpuref-bench --json ('-' for stdin)")
    parser.add_argument("-o", "--output", metavar="OUT.png",
                        help="output PNG (default: <workload>.png; several workloads: "
                             "OUT-<workload>.png)")
    parser.add_argument("--throughput", action="store_true",
                        help="add a throughput panel below the efficiency panel")
    args = parser.parse_args(argv)

    try:
        records = [rec for path in args.files for rec in read_records(path)]
    except InputError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = group(records)
    for workload, series in workloads.items():
        path = output_path(args.output, workload, len(workloads) > 1)
        try:
            plot_workload(plt, workload, series, path, args.throughput)
        except OSError as e:
            print(f"plot.py: {path}: {e.strerror}", file=sys.stderr)
            return 1
        print(f"plot.py: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

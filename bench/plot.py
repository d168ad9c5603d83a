#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Plot percpuref-bench JSON: scaling efficiency against threads.

    bench/plot.py results.json [more.json ...] [-o out.png] [--throughput]
                  [--reference bench/reference/labels.json ...]

Reads the JSON Lines that `percpuref-bench --json` writes (a JSON array of
the same objects, or "-" for stdin, works too), from any workload, and draws
one PNG per workload: efficiency (throughput(N) / (N x throughput(1))) in
percent against the thread count, one line per variant, on an axis zoomed
to the data with a reference line at 100%.  --throughput adds a
second panel with the aggregate throughput.  Workloads whose rows carry no
efficiency get the throughput panel only.

--reference FILE (repeatable) overlays a report's published curve on the
efficiency panel of the workload it names (bench/reference/*.json): dashed,
in the colour of the variant that models each published column, with a
note under the plot naming both machines, because they differ: compare
the shapes, not the values.  Published columns of a group workload
(signal1's per-container throughput) are drawn relative to their first
row, as our efficiency is.

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
import math
import os
import sys
from collections import OrderedDict

MARKERS = ("o", "s", "^", "D", "v", "P", "*", "X", "<", ">", "h")
REQUIRED = {"workload": str, "variant": str, "threads": int, "ops_per_sec": (int, float)}
REFERENCE_REQUIRED = {"workload": str, "source": str}


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
    # percpuref-bench runs 1..65536 (BENCH_MAX_THREADS); 2**64 and more
    # reached matplotlib's log axis as Python ints, a TypeError traceback.
    if not 1 <= rec["threads"] <= 65536:
        raise InputError(f"{where}: threads must be 1..65536, got {str(rec['threads'])[:40]}")
    eff = rec.get("efficiency")
    if eff is not None and (not isinstance(eff, (int, float)) or isinstance(eff, bool)):
        raise InputError(f"{where}: field \"efficiency\" must be a number or null: {eff!r}")
    ns = rec.get("ns_per_op")
    if ns is not None and (not isinstance(ns, (int, float)) or isinstance(ns, bool)):
        raise InputError(f"{where}: field \"ns_per_op\" must be a number or null: {ns!r}")
    # Python's json takes NaN and Infinity, which percpuref-bench never
    # writes (null instead), and integers no float holds; an axis cannot be
    # scaled to them, nor to a figure that overflows once in percent.
    for key, scale in (("threads", 1), ("ops_per_sec", 1), ("efficiency", 100),
                       ("ns_per_op", 1)):
        try:
            finite = rec.get(key) is None or math.isfinite(float(rec[key]) * scale)
        except OverflowError:
            finite = False
        if not finite:
            raise InputError(f"{where}: field \"{key}\" is out of range: {str(rec[key])[:40]}")
    # What the run's label and the tables read (a string "machine" was an
    # AttributeError, a list "started" a TypeError).
    machine = rec.get("machine")
    if machine is not None and not isinstance(machine, dict):
        raise InputError(f"{where}: field \"machine\" must be an object: {machine!r}")
    for key, value in (("started", rec.get("started")),
                       ("machine.hostname", (machine or {}).get("hostname"))):
        if value is not None and not isinstance(value, str):
            raise InputError(f"{where}: field \"{key}\" must be a string: {value!r}")
    for key in ("cpus", "cpus_online", "l3_domains"):
        value = (machine or {}).get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise InputError(f"{where}: field \"machine.{key}\" must be a whole number: "
                             f"{value!r}")
    return rec


def read_records(path):
    """All measurement objects of one file: JSON Lines, or one JSON array."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text (not percpuref-bench JSON?)")
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise InputError(f"{name}: not valid JSON: {getattr(e, 'msg', 'nested too deep')}")
        if not isinstance(data, list) or not data:
            raise InputError(f"{name}: no measurements in it")
        return [check_record(r, f"{name}: element {i}") for i, r in enumerate(data)]
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise InputError(f"{name}:{lineno}: not valid JSON: "
                             f"{getattr(e, 'msg', 'nested too deep')}")
        records.append(check_record(rec, f"{name}:{lineno}"))
    if not records:
        raise InputError(f"{name}: no measurements in it")
    return records


def reference_x(row):
    """A reference row's x: its thread count, else its group count."""
    return row.get("threads", row.get("groups"))


def read_reference(path):
    """A bench/reference/*.json file: the published rows of one workload."""
    try:
        with open(path, encoding="utf-8") as f:
            ref = json.load(f)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text")
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not valid JSON: {e.msg}")
    except RecursionError:
        raise InputError(f"{path}: not valid JSON: nested too deep")
    if not isinstance(ref, dict) or ref.get("schema") != "percpuref-reference/1":
        raise InputError(f"{path}: not a percpuref-reference/1 file")
    # What every reader of a reference uses (a key missing was a KeyError).
    for key, kind in REFERENCE_REQUIRED.items():
        if not isinstance(ref.get(key), kind):
            raise InputError(f"{path}: field \"{key}\" missing or not a {kind.__name__}")
    # A figures-only reference (creds) has no columns and rows.
    for key in ("columns", "rows"):
        if not isinstance(ref.setdefault(key, []), list):
            raise InputError(f"{path}: field \"{key}\" is not a list")
    for i, col in enumerate(ref["columns"]):
        if not isinstance(col, dict) or not all(isinstance(col.get(k), str)
                                                for k in ("key", "label")):
            raise InputError(f"{path}: column {i} needs \"key\" and \"label\" strings")
    for i, row in enumerate(ref["rows"]):
        if not isinstance(row, dict) or not isinstance(row.get("values"), dict):
            raise InputError(f"{path}: row {i} needs a \"values\" object")
        if any(v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                                  or not math.isfinite(v)) for v in row["values"].values()):
            raise InputError(f"{path}: row {i}: values must be finite numbers or null")
        # The x axis of its curves, and the key the tables match rows on.
        for key in ("threads", "groups"):
            x = row.get(key)
            if x is not None and (not isinstance(x, int) or isinstance(x, bool) or x < 1):
                raise InputError(f"{path}: row {i}: \"{key}\" must be a whole number from 1")
    # Other metrics than efficiency are read relative to each column's
    # first figure.
    if ref.get("metric") != "efficiency":
        first = {}
        for row in ref["rows"]:
            # reference_curves() leaves out a row without its x.
            if reference_x(row) is None:
                continue
            for key, v in row["values"].items():
                if v is not None:
                    first.setdefault(key, v)
        bad = sorted(key for key, v in first.items() if v <= 0)
        if bad:
            raise InputError(f"{path}: column \"{bad[0]}\": its first figure must be above 0, "
                             f"the others being read relative to it")
    return ref


def reference_curves(ref):
    """[(label, variant, xs, ys in percent)] of a reference's curves: its
    efficiency columns against threads, or its per-group columns relative
    to their first row against groups.  A figures-only reference has none."""
    rows = ref.get("rows") or []
    curves = []
    for col in ref.get("columns", []):
        pts = [(reference_x(r), r["values"].get(col["key"])) for r in rows]
        pts = [(x, y) for x, y in pts if x is not None and y is not None]
        if not pts:
            continue
        if ref.get("metric") == "efficiency":
            ys = [100 * y for _, y in pts]
        else:
            ys = [100 * y / pts[0][1] for _, y in pts]
        curves.append((col["label"], col.get("variant"), [x for x, _ in pts], ys))
    return curves


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
    return f"{stem}-{workload}{ext}"


def domains_text(machine):
    """"2 L3 domains", as the harness's machine line says it; "" if unknown."""
    domains = machine.get("l3_domains")
    source = machine.get("domain_source", "L3")
    if not domains:
        return ""
    if source == "none":
        return "1 domain (no L3 or package data)"
    kind = f"{source} " if isinstance(source, str) and source else ""
    return f"{domains} {kind}domain{'s' if domains != 1 else ''}"


def subtitle(records):
    machine = records[0].get("machine") or {}
    parts = [machine.get("model", "")]
    if "cpus" in machine:
        domains = domains_text(machine)
        parts.append(f"{machine['cpus']} CPUs" + (f", {domains}" if domains else ""))
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


def plot_workload(plt, workload, series, path, throughput, refs=()):
    runs = {run for (_, run) in series}
    records = [rec for points in series.values() for rec in points.values()]
    curves = [(ref, c) for ref in refs for c in reference_curves(ref)]
    threads = sorted({rec["threads"] for rec in records} | {x for _, c in curves for x in c[2]})
    has_eff = any(rec.get("efficiency") is not None for rec in records)
    panels = (["efficiency"] if has_eff else []) + (["throughput"] if throughput or not has_eff else [])
    op = records[0].get("op", "op")

    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 5 * len(panels)), squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        colours = {}
        for k, ((variant, run), points) in enumerate(series.items()):
            xs = sorted(points)
            label = variant if len(runs) == 1 else f"{variant} ({run[0]} {run[1]})".strip()
            if any(rec.get("processes") for rec in points.values()):
                label += ", one-thread processes"
            if panel == "efficiency":
                ys = [points[t].get("efficiency") for t in xs]
                ys = [None if y is None else 100 * y for y in ys]
            else:
                ys = [points[t]["ops_per_sec"] / 1e6 for t in xs]
            # Markers differ and shrink line by line, so lines that coincide
            # still show each other's marker.
            line, = ax.plot(xs, [float("nan") if y is None else y for y in ys],
                            marker=MARKERS[k % len(MARKERS)], markersize=max(3, 8 - k // 2),
                            label=label)
            colours.setdefault(variant, line.get_color())
        if panel == "efficiency":
            for ref, (label, variant, xs, ys) in curves:
                ax.plot(xs, ys, linestyle="--", marker="x", color=colours.get(variant, "grey"),
                        label=f"report: {label}")
        setup_threads_axis(ax, threads)
        cpus = (records[0].get("machine") or {}).get("cpus")
        if cpus and max(threads) > cpus:
            ax.axvline(cpus, color="grey", linestyle=":", label="usable CPUs")
            if any(rec.get("oversubscribed") for rec in records):
                ax.axvspan(cpus, max(threads), color="grey", alpha=0.08)
                ax.text(0.99, 0.9, "shaded: more threads than CPUs; they time-share,\n"
                        "so per-thread (per-group) figures fall as CPUs / threads\n"
                        "(report.py's tables give those rows per CPU in use instead)",
                        transform=ax.transAxes, ha="right", va="top", fontsize="x-small")
        if panel == "efficiency":
            ax.axhline(100, color="black", linewidth=0.8)
            ax.set_ylabel("scaling efficiency, %\nthroughput(N) / (N x throughput(1))")
            lo, hi = efficiency_limits(records)
            ref_ys = [y for _, c in curves for y in c[3]]
            if ref_ys:
                lo, hi = min(lo, min(ref_ys) - 2), max(hi, max(ref_ys) + 2)
            ax.set_ylim(max(0.0, lo), hi)
            if any(rec.get("baseline_threads", 1) != 1 for rec in records):
                ax.set_ylabel("scaling efficiency, %\nper-thread throughput / baseline row's")
        else:
            ax.set_ylabel(f"M{op}s/s (all threads)")
            rates = [rec["ops_per_sec"] for rec in records if rec["ops_per_sec"] > 0]
            # Variants can differ by orders of magnitude (a private counter
            # next to a contended atomic): a log scale keeps both readable.
            if rates and max(rates) / min(rates) > 20:
                ax.set_yscale("log")
            else:
                ax.set_ylim(bottom=0)
        ax.legend(fontsize="x-small", ncol=2 if len(series) + len(curves) > 6 else 1)
    axes[0, 0].set_title(f"{workload}\n{subtitle(records)}", fontsize="medium")
    if refs and not curves:
        fig.text(0.01, 0.005, "The report publishes single figures, not curves: "
                 "results/report.md (bench/report.py) sets them beside ours.",
                 fontsize="x-small", va="bottom")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
    elif curves:
        seen = []
        for ref, _ in curves:
            if ref not in seen:
                seen.append(ref)
        note = " ".join(f"Dashed: published by the report, on {ref.get('machine', '?')}; "
                        f"{ref.get('normalisation', 'relative to its first row')}." for ref in seen)
        note += (" Solid: measured here. The machines differ (cores, caches, kernel vs userspace "
                 "model): compare the curves' shapes, not their values.")
        fig.text(0.01, 0.005, note, fontsize="x-small", wrap=True, va="bottom")
        fig.tight_layout(rect=(0, 0.1, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Once(argparse.Action):
    """An option given at most once: a second (-o a.png -o b.png) was taken
    over the first without a word, where percpuref-bench refuses repeats."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) is not None:
            parser.error(f"{option_string} given twice")
        setattr(namespace, self.dest, values)


def main(argv):
    parser = argparse.ArgumentParser(
        description="Plot percpuref-bench JSON: scaling efficiency against threads, "
                    "one PNG per workload.")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="JSON Lines from percpuref-bench --json ('-' for stdin)")
    parser.add_argument("-o", "--output", metavar="OUT.png", action=Once,
                        help="output PNG (default: <workload>.png; several workloads: "
                             "OUT-<workload>.png)")
    parser.add_argument("--throughput", action="store_true",
                        help="add a throughput panel below the efficiency panel")
    parser.add_argument("--reference", action="append", default=[], metavar="REF.json",
                        help="overlay a report's published curves (bench/reference/*.json) "
                             "on the workload it names; repeatable")
    args = parser.parse_args(argv)

    try:
        records = [rec for path in args.files for rec in read_records(path)]
        references = [read_reference(path) for path in args.reference]
    except InputError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    # matplotlib picks the format by the extension, and raised a ValueError
    # for one it lacks ("-o x.txt") after drawing; to a name without one
    # ("", a folder) it added ".png", where "wrote" named the file it meant.
    ext = os.path.splitext(args.output)[1].lower() if args.output is not None else ".png"
    if ext not in (".png", ".svg", ".pdf"):
        print(f"plot.py: -o {args.output}: want a .png, .svg or .pdf name", file=sys.stderr)
        return 2
    for ref in references:
        if ref["workload"] not in {rec["workload"] for rec in records}:
            print(f"plot.py: --reference for {ref['workload']}, which no input measures",
                  file=sys.stderr)
            return 2
        # A report's per-group curve is drawn against groups, ours against
        # threads: with several threads a group (signal1 --workers 2) the
        # one-container point sat at 2 threads beside the report's at 1,
        # each relative to another baseline.
        grouped = [rec for rec in records if rec["workload"] == ref["workload"]
                   and rec.get("groups") is not None and rec["groups"] != rec["threads"]]
        if grouped and any(reference_x(row) is not None and row.get("threads") is None
                           for row in ref["rows"]):
            print(f"plot.py: --reference for {ref['workload']}: its curves are per "
                  f"{ref.get('group', 'group')} against {ref.get('group', 'group')}s, and "
                  f"this run has {grouped[0]['threads']} threads in {grouped[0]['groups']}; "
                  f"overlay a run with one thread a group (--workers 1)", file=sys.stderr)
            return 2

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot.py: {e} (Debian: apt-get install python3-matplotlib; "
              f"scripts/deps.sh installs it)", file=sys.stderr)
        return 2

    workloads = group(records)
    for workload, series in workloads.items():
        path = output_path(args.output, workload, len(workloads) > 1)
        try:
            plot_workload(plt, workload, series, path, args.throughput,
                          [ref for ref in references if ref.get("workload") == workload])
        except OSError as e:
            print(f"plot.py: {path}: {e.strerror}", file=sys.stderr)
            return 1
        print(f"plot.py: wrote {path}")
    return 0


def run(main_fn):
    """Exits with main_fn(argv)'s status; a closed pipe ("| head") is
    exit 1 and Ctrl-C exit 130, without a traceback."""
    try:
        sys.exit(main_fn(sys.argv[1:]))
    except BrokenPipeError:
        # Quiet, and no second error when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    run(main)

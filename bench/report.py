#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Seed vs measured: the reports' published numbers beside this machine's.

    bench/report.py --results DIR [--reference-dir bench/reference] [-o DIR/report.md]

Reads DIR/labels.json, DIR/creds.json and DIR/signal1.json (percpuref-bench
--json output; a missing one is reported as not run) and the published
numbers in bench/reference/*.json, prints one "seed vs measured" table per
case on stdout, and writes a Markdown report: the machine, what differs from
the reports' machines, the three tables, every variant measured, and the
plots (DIR/<case>.png, made by bench/plot.py).

The tables put a published column beside the variant that models it
(bench/reference names it), on the rows this machine can run; published
rows it cannot run (more threads than its CPUs) show "-" for ours, and our
rows the reports did not run show "-" for theirs.  Efficiency is each
side's own normalisation (the report's 8C16T row, our baseline row), which
the table's notes state.  Exit status 2 on unreadable input.
"""

import argparse
import json
import os
import sys

# The readers (and their checks) are plot.py's, beside this file.
from plot import InputError, Once, domains_text, read_records, read_reference, run, run_id

CASES = ("labels", "creds", "signal1")


def load_results(path, case):
    """A case's measurements, or None when the case was not run."""
    if not os.path.exists(path):
        return None
    recs = read_records(path)
    # Another workload's file under this name made a silently wrong table.
    other = next((r["workload"] for r in recs if r["workload"] != case), None)
    if other is not None:
        raise InputError(f"{path}: holds {other} measurements, not {case}")
    # Runs concatenated: one table mixed them, under the first one's machine.
    runs = {run_id(r) for r in recs}
    if len(runs) > 1:
        raise InputError(f"{path}: holds {len(runs)} runs (started, hostname); want one")
    # The reports measured threads sharing one object; processes share none.
    if any(r.get("processes") for r in recs):
        raise InputError(f"{path}: a --processes run, whose processes share no object; "
                         f"the reports measured threads that share one")
    # signal1's rows are whole containers (groups x workers threads): a
    # groups or workers that is no positive count dropped rows unsaid.
    if case == "signal1":
        for r in recs:
            params = r.get("params") or {}
            if not isinstance(params, dict):
                raise InputError(f"{path}: a signal1 record's params is not an object: "
                                 f"{str(params)[:40]}")
            workers = params.get("workers", 1)
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                       for x in (r.get("groups"), workers)):
                raise InputError(f"{path}: a signal1 record's groups ({r.get('groups')!r}) "
                                 f"and params.workers ({workers!r}) must be positive counts")
    return recs


def pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def rate(x):
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.0f}k"
    return f"{x:.0f}"


def table(header, rows):
    """A Markdown table: readable as is on a terminal too."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def by_variant_threads(recs):
    return {(r["variant"], r["threads"]): r for r in recs}


def machine_line(rec):
    m = rec.get("machine") or {}
    return (f"{m.get('model', '?')}: {m.get('cpus', '?')} usable CPUs of {m.get('cpus_online', '?')}, "
            f"{domains_text(m) or '? domains'}, "
            f"{'SMT' if m.get('smt') else 'no SMT'}, kernel {m.get('kernel', '?')}; "
            f"percpuref fast path: {rec.get('fast_path', '?')}, "
            f"fences: {rec.get('fences', '?')}")


def labels_section(recs, ref):
    ours = by_variant_threads(recs)
    cpus = (recs[0].get("machine") or {}).get("cpus", 0)
    configs = {r["threads"]: (r.get("config", "?"), r.get("l3_domains_used", "?")) for r in recs}
    published = {row["threads"]: row for row in ref["rows"]}
    threads = sorted(set(configs) | set(published))
    shown, header = set(), ["row (here / report)", "L3"]
    cols = []
    for col in ref["columns"]:
        header.append(f"{col['short']}: report")
        here = col["variant"] not in shown
        if here:
            header.append(f"{col['variant']}: here")
            shown.add(col["variant"])
        cols.append((col, here))
    rows = []
    for t in threads:
        pub = published.get(t)
        here_cfg, here_l3 = configs.get(t, ("-", "-"))
        name = here_cfg if not pub else pub["config"] if t not in configs else f"{here_cfg} / {pub['config']}"
        l3 = here_l3 if not pub else pub["l3_domains"] if t not in configs else f"{here_l3} / {pub['l3_domains']}"
        row = [name, l3]
        for col, here in cols:
            row.append(pct(pub["values"].get(col["key"])) if pub else "-")
            if here:
                rec = ours.get((col["variant"], t))
                row.append(pct(rec.get("efficiency")) + ("!" if rec["oversubscribed"] else "")
                           if rec else "-")
        rows.append(row)
    base = recs[0].get("baseline_threads", 1)
    legend = "; ".join(f"{c['short']} = {c['label']}, modelled by `{c['variant']}`"
                       for c in ref["columns"])
    out = [table(header, rows), "",
           f"Columns: {legend}.",
           f"Report: {ref['machine']}; efficiency = {ref['normalisation']}.",
           f"Here: {base}-thread row = 100% (per-thread throughput relative to it). "
           f"This machine runs rows up to {cpus} threads; the report's rows need 16 to 192."]
    # The shape, at each side's largest row: how far below "off" each column ends.
    last_pub = published[max(published)]
    # Oversubscribed rows only (--threads above the CPUs): the largest row.
    last_here = max((t for t in configs if t <= cpus), default=max(configs))
    gaps = []
    for col, here in cols:
        if col["variant"] == "off":
            continue
        p = last_pub["values"].get(col["key"])
        off_p = last_pub["values"].get("off")
        h, off_h = ours.get((col["variant"], last_here)), ours.get(("off", last_here))
        gp = f"{100 * (p - off_p):+.0f}" if p is not None else "-"
        gh = (f"{100 * (h['efficiency'] - off_h['efficiency']):+.0f}"
              if here and h and off_h and h.get("efficiency") is not None
              and off_h.get("efficiency") is not None
              else "(see above)" if not here else "-")
        gaps.append([col["short"], gp, gh])
    out += ["", f"Points below `off` at the largest row: report {last_pub['config']}, "
            f"here {configs[last_here][0]}:", "",
            table(["column", f"report {last_pub['config']}", f"here {configs[last_here][0]}"], gaps)]
    return "\n".join(out)


def signal1_section(recs, ref):
    ours = by_variant_threads(recs)
    workers = (recs[0].get("params") or {}).get("workers", 1)
    # Rows of whole containers, as the report's: the harness's one-thread
    # baseline row is a container short of workers when workers > 1.
    groups = {r["groups"]: r["threads"] for r in recs if r["threads"] == r["groups"] * workers}
    published = {row["groups"]: row for row in ref["rows"]}
    first_pub = ref["rows"][0]
    variants = []
    for col in ref["columns"]:
        variants.append(col["variant"])
    extra = [v for v in dict.fromkeys(r["variant"] for r in recs) if v not in variants]
    header = ["containers"]
    for col in ref["columns"]:
        header += [f"{col['short']}: report", f"{col['variant']}: here"]
    header += [f"{v}: here" for v in extra]

    def here(v, g):
        rec = ours.get((v, groups.get(g)))
        if not rec:
            return "-"
        one = ours.get((v, groups.get(1)))
        # Per CPU in use: oversubscribed containers share the CPUs, so
        # compare what each CPU gets done with what it does for one
        # container alone (whose workers may share them too).
        per_cpu = rec["ops_per_sec"] / min(g * workers, cpus or g * workers)
        one_per_cpu = (one["ops_per_sec"] / min(workers, cpus or workers)
                       if one and one["ops_per_sec"] else None)
        rel = per_cpu / one_per_cpu if one_per_cpu else None
        return (f"{rate(rec['ops_per_sec_per_group'])} ({pct(rel)})"
                + ("!" if rec["oversubscribed"] else ""))

    cpus = (recs[0].get("machine") or {}).get("cpus", 0)
    rows = []
    for g in sorted(set(groups) | set(published)):
        row = [g]
        for col in ref["columns"]:
            pub = published.get(g)
            v = pub["values"].get(col["key"]) if pub else None
            rel = v / first_pub["values"][col["key"]] if v is not None else None
            row += [f"{v} ({pct(rel)})" if v is not None else "-", here(col["variant"], g)]
        row += [here(v, g) for v in extra]
        rows.append(row)
    return "\n".join([
        table(header, rows), "",
        "Signals/s of one container; in parentheses, relative to one container alone "
        "(here: per CPU in use, see `!`).",
        f"Report: {ref['machine']}. Here: {workers} worker(s) per container in a userspace "
        "model of the charge (no syscalls), so absolute rates differ by orders of magnitude.",
        f"`!`: more threads than the {cpus} usable CPUs; those workers time-share, so each "
        "container gets CPUs / containers of a CPU in every variant. The percentage of such "
        "a row is the throughput per CPU in use (total / CPUs) relative to one container "
        "alone, the report's figure when every container has a CPU of its own."])


def creds_section(recs, ref):
    ours = by_variant_threads(recs)
    threads = sorted({r["threads"] for r in recs})
    # The largest row within the CPUs, as labels_section's: an
    # oversubscribed row's threads time-share, which the report's did not.
    cpus = (recs[0].get("machine") or {}).get("cpus") or threads[-1]
    top = max((t for t in threads if t <= cpus), default=threads[-1])

    def ratio(v, w, t):
        a, b = ours.get((v, t)), ours.get((w, t))
        return a["ops_per_sec"] / b["ops_per_sec"] if a and b and b["ops_per_sec"] else None

    rows = []
    for fig in ref["figures"]:
        if fig["measure"] == "share":
            # Time the count costs: 1 - throughput(with it) / throughput(without).
            here = [(t, ratio(fig["variant"], fig["reference_variant"], t)) for t in (1, top)]
            cell = ", ".join(f"{pct(1 - r) if r else '-'} at {t}T" for t, r in here)
            how = f"1 - throughput({fig['variant']}) / throughput({fig['reference_variant']})"
        else:
            here = [(t, ratio(fig["variant"], fig["reference_variant"], t)) for t in (1, top)]
            cell = ", ".join(f"{(r - 1) * 100:+.0f}% at {t}T" if r else f"- at {t}T"
                             for t, r in here)
            how = f"throughput({fig['variant']}) / throughput({fig['reference_variant']}) - 1"
        published = (f"{fig['value'] * 100:+.0f}%" if fig["measure"] == "gain"
                     else f"{fig['value'] * 100:.1f}%")
        rows.append([fig["label"], published, cell, how])
    extra = []
    for v in ("padded", "percpu", "borrow", "local-copy"):
        r = ratio(v, "shared-line", top)
        if r:
            extra.append([v, f"{(r - 1) * 100:+.0f}%"])
    return "\n".join([
        table(["figure", "report", "here", "how we measure it"], rows), "",
        f"Report: {ref['machine']}. Here a check is nothing but the permission check, so the "
        "count's share of it is far larger than in a web server, where a check is a small part "
        "of each request: compare the direction, not the size.", "",
        f"Every variant against shared-line at {top} threads (throughput gain):", "",
        table(["variant", f"gain at {top}T"], extra)])


def all_variants(recs):
    threads = sorted({r["threads"] for r in recs})
    variants = list(dict.fromkeys(r["variant"] for r in recs))
    ours = by_variant_threads(recs)
    op = recs[0].get("op", "op")
    rows = []
    for v in variants:
        row = [v]
        for t in threads:
            rec = ours.get((v, t))
            ns = rec.get("ns_per_op") if rec else None
            row.append(f"{ns:.1f} / {pct(rec.get('efficiency'))}" if ns is not None else "-")
        rows.append(row)
    configs = {r["threads"]: r.get("config", str(r["threads"])) for r in recs}
    return table(["variant"] + [f"{configs[t]}: ns/{op} / eff" for t in threads], rows)


DIFFERENCES = """\
What differs from the reports' machines, and why it matters:

- Size. The labels report ran 8 to 96 cores (16 to 192 threads, 12 L3
  domains of 8 cores); the overlayfs report 56 and more than 100 cores.
  A shared cache line costs more the more cores pull it and the farther
  apart they sit (across L3 domains, across sockets), so the collapse the
  reports show at 96 cores shows here, at a few cores in one L3 domain,
  only as its first few points.  Their rows this machine cannot run are
  "-".
- Kernel against userspace.  The reports measured the kernel (nginx
  through syscalls, will-it-scale's signal1, overlayfs permission
  checks); these workloads model the same data structures and the same
  count operations in userspace, with the rest of a request replaced by
  private work.  Absolute rates are not comparable; the shape (which
  variant falls away from `off`, which stays with it) is.
- Normalisation.  The labels report's 100% is its first full L3 domain
  (8C16T).  Here the baseline row is the first full L3 domain too when the
  machine has more than one, and one thread otherwise (with one domain no
  row crosses a domain boundary).
- Noise.  Unless stated otherwise these runs come from a shared machine
  where other jobs compete for the CPUs; single points can swing by
  several percent.
"""


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description="Seed vs measured tables and results/report.md.")
    parser.add_argument("--results", required=True, metavar="DIR", action=Once,
                        help="directory with labels.json, creds.json, signal1.json and their PNGs")
    parser.add_argument("--reference-dir", metavar="DIR", action=Once)
    parser.add_argument("-o", "--output", metavar="REPORT.md", action=Once,
                        help="Markdown report (default DIR/report.md)")
    args = parser.parse_args(argv)
    # A typo'd folder was three cases "not run", exit 0.
    if not os.path.isdir(args.results):
        print(f"report.py: --results {args.results}: not a folder", file=sys.stderr)
        return 2
    out_path = args.output or os.path.join(args.results, "report.md")
    reference_dir = args.reference_dir or os.path.join(here, "reference")
    sections = {"labels": labels_section, "creds": creds_section, "signal1": signal1_section}
    titles = {"labels": "labels: AppArmor label refcounts (efficiency)",
              "creds": "creds: overlayfs mounter credential",
              "signal1": "signal1: ucounts RLIMIT_SIGPENDING charges (per container)"}
    try:
        data = {c: load_results(os.path.join(args.results, f"{c}.json"), c) for c in CASES}
        refs = {c: read_reference(os.path.join(reference_dir, f"{c}.json")) for c in CASES}
    except InputError as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 2
    first = next((recs[0] for recs in data.values() if recs), None)
    md = ["# percpuref: the three cases, seed vs measured", ""]
    if first:
        load = os.getloadavg()
        md += [f"Machine: {machine_line(first)}.",
               f"Run started {first.get('started', '?')}; load average when this report was "
               f"written: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min).", ""]
    md += [DIFFERENCES]
    for case in CASES:
        recs, ref = data[case], refs[case]
        md += [f"## {titles[case]}", "", f"Published: {ref['source']}.", ""]
        if not recs:
            body = f"(not run: no {case}.json in {args.results})"
        else:
            try:
                body = sections[case](recs, ref)
                every = all_variants(recs)
            except (KeyError, IndexError, TypeError, ValueError) as e:
                # A field a table needs, missing or of the wrong kind in
                # a file that passed the readers' common checks.
                print(f"report.py: {case}: the results or the reference lack what its "
                      f"tables need ({type(e).__name__}: {e})", file=sys.stderr)
                return 2
            params = recs[0].get("params")
            if isinstance(params, dict) and params:
                # What the workload was run with, which the published
                # figures may not match (labels --profile, --churn).
                body += ("\n\nParameters of this run: "
                         + ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}"
                                     for k, v in params.items()) + ".")
        print(f"\n== seed vs measured: {titles[case]} ==\n{body}")
        md += [body, ""]
        if recs:
            md += ["Every variant measured here (ns per op per thread / efficiency):", "",
                   every, ""]
            if os.path.exists(os.path.join(args.results, f"{case}.png")):
                md += [f"![{case}]({case}.png)", ""]
    try:
        with open(out_path, "w", encoding="utf-8") as f:
            f.write("\n".join(md))
    except OSError as e:
        print(f"report.py: {out_path}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"\nreport.py: wrote {out_path}")
    return 0


if __name__ == "__main__":
    run(main)

/* SPDX-License-Identifier: MIT */
/*
 * harness.h - what the harness's own files share (workloads see bench.h):
 * the CPU topology, the measurement loop and the reports.
 */
#ifndef PERCPUREF_BENCH_HARNESS_H
#define PERCPUREF_BENCH_HARNESS_H

#include <stdio.h>

#include "bench.h"

/*
 * The CPUs this process may run on (online and in its affinity mask), in
 * the order threads are placed: fill one L3 domain before the next; inside
 * a domain, one thread per physical core first, then the SMT siblings.
 * PERCPUREF_BENCH_SYSFS=DIR reads a fake /sys/devices/system/cpu from DIR
 * (for the tests; the affinity mask is then ignored).
 */
struct topology {
	unsigned int ncpus;
	int *order;		/* CPU of thread i is order[i % ncpus] */
	int *domain;		/* domain[i]: 0-based domain of order[i] */
	int *core;		/* core[i]: the lowest CPU of order[i]'s core */
	unsigned int ndomains;
	bool smt;		/* some core has more than one usable CPU */
	/* What a domain is: "L3" (cache/index*), "package" or "none". */
	const char *domain_source;
	unsigned int online;	/* CPUs online, usable or not */
	char model[96];		/* "model name" of /proc/cpuinfo */
};

void topology_read(struct topology *topo);
void topology_free(struct topology *topo);
/* Domains that the first @nthreads threads touch. */
unsigned int topology_domains_used(const struct topology *topo, unsigned int nthreads);
/* Physical cores that the first @nthreads threads touch. */
unsigned int topology_cores_used(const struct topology *topo, unsigned int nthreads);
/*
 * The reports' name for the first @nthreads threads' CPUs, "xCyT": x
 * physical cores, y threads ("8C16T": 8 cores with both SMT threads).
 */
void topology_format_config(const struct topology *topo, unsigned int nthreads, char *buf,
			    size_t len);
/* "0-3,8" for CPUs order[0 .. n-1] (n <= ncpus), sorted; into buf. */
void topology_format_cpus(const struct topology *topo, unsigned int n, char *buf, size_t len);

/* A workload's own figure (bench_report_metric()); name and unit are owned. */
struct metric {
	char *name;
	char *unit;		/* "" for none */
	double value;		/* NAN: not measured */
};

/* The figures of one measurement, or a row's means, in reporting order. */
struct bench_metrics {
	struct metric *v;
	unsigned int n, cap;
};

/* The progress line on stderr (main.c): shown, or erased if shown (before
 * a message, which then starts its own line). */
void progress_shown(void);
void progress_erase(void);

/* Adds @name or replaces its value. */
void metrics_set(struct bench_metrics *m, const char *name, double value, const char *unit);
void metrics_free(struct bench_metrics *m);

/* One measurement's outcome. */
struct sample {
	uint64_t ops;
	double seconds;
	bool paused;		/* the run was stopped and continued in the window */
	/* The least CPU time a worker had over the window, as a share of it
	 * (NAN: not measured), and that worker's index. */
	double worker_cpu_min;
	unsigned int worker_cpu_min_index;
	/* measure_line_transfer() just before the point; NAN: not measured */
	double transfer_ns;
	struct bench_metrics metrics;
};

/* What passing one cache line between the first two CPUs of the placement
 * order costs, in ns a transfer (transfer.c); NAN with fewer than two
 * CPUs, or where the probe's threads could not run. */
double measure_line_transfer(const struct topology *topo);

/* Before any thread but the main one exists (the library's included):
 * the count of SIGCONTs the measurements read (measure.c). */
void measure_setup(void);

/* One measurement of @duration seconds, after duration / 5 of warm-up.
 * A phase that has not ended after @hang_limit seconds (the workload's
 * setup, the threads' start, their return once the window closed, the
 * teardown) ends the run (exit 1, the phase named). */
struct sample measure(const struct bench_workload *w, const struct bench_variant *v,
		      unsigned int nthreads, const struct topology *topo, double duration,
		      double hang_limit);
/* The same point as @nprocs one-thread processes at once (--processes):
 * the summed throughput, no metrics.  The children must have ended
 * @hang_limit seconds after their windows would have closed. */
struct sample measure_processes(const struct bench_workload *w, const struct bench_variant *v,
				unsigned int nprocs, const struct topology *topo, double duration,
				double hang_limit);

/* One row-and-column cell of the report, after the repetitions. */
struct result {
	const struct bench_variant *variant;
	unsigned int threads;
	unsigned int groups;	/* of the workload's group; threads if it has none */
	struct sample *samples;	/* one per repetition */
	double ops_per_sec;	/* the reported statistic */
	double ns_per_op;	/* threads * 1e9 / ops_per_sec */
	/* (ops/s per thread) / (the baseline row's); negative: does not apply */
	double efficiency;
	/* Each metric's mean over the samples where it is finite. */
	struct bench_metrics metrics;
	/*
	 * --versus: this point's throughput over the reference variant's in
	 * the same row, repetition by repetition (measured in the same sweep
	 * of the row); the median, lowest and highest of those ratios, over the
	 * versus_rounds repetitions where both completed operations.  NAN
	 * (and 0 rounds) for the reference itself, where no round counts,
	 * and without --versus.
	 */
	double versus_median, versus_low, versus_high;
	unsigned int versus_rounds;
};

struct report {
	const struct bench_workload *workload;
	const struct topology *topo;
	const unsigned int *threads;	/* rows, ascending */
	unsigned int nthreads;
	const struct bench_variant **variants;	/* columns */
	unsigned int nvariants;
	struct result *results;	/* [row * nvariants + column] */
	unsigned int repeat;
	const char *stat;	/* "median" or "best" */
	unsigned int baseline;	/* efficiency's baseline row, in threads (default 1) */
	unsigned int baseline_row;	/* its index in threads[] */
	/* --versus: the reference variant, or NULL; its index in variants[] */
	const struct bench_variant *versus;
	unsigned int versus_column;
	const char *fast_path;	/* percpuref_fast_path(): "rseq-glibc", "fallback" ... */
	const char *library_cpus; /* the library's threads' CPUs chosen; NULL: inherited */
	double duration;
	double hang_limit;	/* --hang-limit: seconds a point may overrun its window */
	bool processes;		/* --processes: rows are one-thread processes */
	char started[32];	/* ISO 8601 UTC */
};

void report_table(FILE *out, const struct report *r);
void report_json(FILE *out, const struct report *r);
/* The machine line and the CPUs in placement order (--topology). */
void report_topology(FILE *out, const struct topology *topo);

#endif

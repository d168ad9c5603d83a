/* SPDX-License-Identifier: MIT */
/*
 * managed.c - what the reclaimer of managed percpu_refs costs (managed.h),
 * as three workloads:
 *
 *   managed-scan     one thread flushes back to back over N managed refs
 *                    that all stay referenced (one pass = one scan, no
 *                    per-scan limit): the cost of checking N refs.  Variants
 *                    faithful-1k .. batched-100k.  The table's ns/scan
 *                    includes the hand-off to the reclaimer; teardown reports
 *                    the reclaimer's own figures as metrics: mean scan time,
 *                    fences per scan and time per ref.  100k faithful
 *                    takes tens of milliseconds a pass (45.6 ms,
 *                    docs/managed.md): a longer --duration gives it more.
 *   managed-latency  each thread (one by default) makes a managed ref,
 *                    sleeps a random part of the interval, drops its
 *                    reference and waits for @release, with the reclaimer
 *                    scanning every --interval-ms.  Teardown reports the latency from the
 *                    last put to the release callback (mean, max) as
 *                    metrics; the table's ns/release includes the random
 *                    sleep.
 *   managed-hot      get+put pairs on one hot managed ref (plus --refs cold
 *                    managed refs on the list) with the reclaimer idle, or
 *                    scanning back to back (interval 0) with either
 *                    strategy: the proposal's limitation 6, the atomic window
 *                    during a check.  The ratio scan-X / idle is the cost;
 *                    the metrics say how often the reclaimer scanned and
 *                    fenced.
 *
 * Every workload restores the reclaimer's default configuration and
 * releases its refs in teardown, checking that none was released early.
 */
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <percpuref/managed.h>
#include <percpuref/percpu_ref.h>

#include "bench.h"

struct mref {
	struct percpu_ref ref;
	uint64_t released_ns;	/* atomic: set by the reclaimer */
};

/*
 * A point whose figures need the reclaimer's scans got none, and no
 * thread of the reclaimer's name runs: it could not start (a sandbox that
 * refuses new threads; the library said why).  The figures would be an
 * idle reclaimer's: fail the run, naming the cause.  Where the threads
 * cannot be listed (no /proc), a point with no scan stays as measured.
 */
static void need_reclaimer(const struct bench_run *run, bool scanned)
{
	if (scanned || bench_threads_named("percpuref-recl", NULL))
		return;
	bench_die("%s %s: no scan, and the library's reclaimer thread (percpuref-recl) "
		  "does not run: could it start?", run->workload->name, run->variant->name);
}

static void mref_release(struct percpu_ref *ref)
{
	struct mref *m = (struct mref *)ref;

	/* Release: the waiting thread reads what preceded it. */
	__atomic_store_n(&m->released_ns, bench_clock_ns(CLOCK_MONOTONIC), __ATOMIC_RELEASE);
}

static void configure(unsigned long interval_ms, unsigned long max,
		      enum percpu_ref_scan_strategy strategy)
{
	struct percpu_ref_managed_config c = { interval_ms, max, strategy };

	if (percpu_ref_managed_set_config(&c))
		bench_die("managed: bad reclaimer configuration");
}

static void configure_default(void)
{
	configure(PERCPU_REF_MANAGED_INTERVAL_MS, PERCPU_REF_MANAGED_MAX_PER_SCAN,
		  PERCPU_REF_SCAN_FILTERED);
}

/* An idle reclaimer: one scan an hour. */
#define IDLE_INTERVAL_MS 3600000UL

/* @n managed refs, each with its creator's reference, which the caller
 * drops later. */
static struct mref *make_refs(size_t n)
{
	struct mref *refs = calloc(n, sizeof(*refs));

	if (!refs)
		bench_die("managed: no memory for %zu refs", n);
	for (size_t i = 0; i < n; i++) {
		if (percpu_ref_init(&refs[i].ref, mref_release, PERCPU_REF_ALLOW_REINIT))
			bench_die("managed: percpu_ref_init failed");
		if (percpu_ref_switch_to_managed(&refs[i].ref))
			bench_die("managed: switch_to_managed failed");
	}
	return refs;
}

/* Drops the user references, waits for the releases, frees. */
static void free_refs(struct mref *refs, size_t n, const char *who)
{
	for (size_t i = 0; i < n; i++) {
		if (__atomic_load_n(&refs[i].released_ns, __ATOMIC_ACQUIRE))
			bench_die("%s: ref %zu released while referenced", who, i);
		percpu_ref_put(&refs[i].ref);
	}
	if (percpu_ref_managed_flush())
		bench_die("%s: flush failed", who);
	for (size_t i = 0; i < n; i++) {
		if (!__atomic_load_n(&refs[i].released_ns, __ATOMIC_ACQUIRE))
			bench_die("%s: ref %zu not released by the flush", who, i);
		percpu_ref_exit(&refs[i].ref);
	}
	free(refs);
}

/* ---- managed-scan ------------------------------------------------------ */

struct scan_state {
	struct mref *refs;
	size_t n;
	struct percpu_ref_managed_stats before;
};

#define SCAN_ARG(strategy, n) ((long)(n) << 2 | (strategy))

static void scan_setup(struct bench_run *run)
{
	struct scan_state *s = bench_zalloc(sizeof(*s));

	run->state = s;
	s->n = (size_t)(run->variant->arg >> 2);
	configure(IDLE_INTERVAL_MS, 0, (enum percpu_ref_scan_strategy)(run->variant->arg & 3));
	s->refs = make_refs(s->n);
	if (percpu_ref_managed_flush())	/* the first pass, outside the figures */
		bench_die("managed-scan: flush failed");
	percpu_ref_managed_get_stats(&s->before);
}

static void scan_loop(struct bench_thread *t)
{
	while (bench_running(t)) {
		if (percpu_ref_managed_flush())
			bench_die("managed-scan: flush failed");
		bench_count(t, 1);
	}
}

static void scan_teardown(struct bench_run *run)
{
	struct scan_state *s = run->state;
	struct percpu_ref_managed_stats after;
	double scans, scan_ns, refs;

	percpu_ref_managed_get_stats(&after);
	scans = (double)(after.scans - s->before.scans);
	scan_ns = (double)(after.scan_ns_total - s->before.scan_ns_total);
	refs = (double)(after.refs_scanned - s->before.refs_scanned);
	bench_report_metric(run, "refs", s->n, NULL);
	bench_report_metric(run, "scans", scans, NULL);
	bench_report_metric(run, "scan_time", scans > 0 ? scan_ns / scans / 1e6 : NAN, "ms");
	bench_report_metric(run, "fences_per_scan",
			    scans > 0 ? (after.fences - s->before.fences) / scans : NAN, NULL);
	bench_report_metric(run, "time_per_ref", refs > 0 ? scan_ns / refs : NAN, "ns");
	configure_default();
	free_refs(s->refs, s->n, "managed-scan");
	free(s);
}

/* One scan at a time: concurrent flushes share a scan, and the rate of
 * flushes would read as more scans than ran. */
static const char *scan_validate_rows(unsigned int max_threads)
{
	return max_threads > 1 ? "--threads: one thread only (concurrent flushes share a scan, "
				 "and would count as scans that never ran)" : NULL;
}

static const struct bench_variant scan_variants[] = {
	{ "faithful-1k", "1000 refs, one fence per ref", scan_loop,
	  SCAN_ARG(PERCPU_REF_SCAN_FAITHFUL, 1000) },
	{ "faithful-10k", "10000 refs, one fence per ref", scan_loop,
	  SCAN_ARG(PERCPU_REF_SCAN_FAITHFUL, 10000) },
	{ "faithful-100k", "100000 refs, one fence per ref", scan_loop,
	  SCAN_ARG(PERCPU_REF_SCAN_FAITHFUL, 100000) },
	{ "batched-1k", "1000 refs, one fence per scan", scan_loop,
	  SCAN_ARG(PERCPU_REF_SCAN_BATCHED, 1000) },
	{ "batched-10k", "10000 refs, one fence per scan", scan_loop,
	  SCAN_ARG(PERCPU_REF_SCAN_BATCHED, 10000) },
	{ "batched-100k", "100000 refs, one fence per scan", scan_loop,
	  SCAN_ARG(PERCPU_REF_SCAN_BATCHED, 100000) },
	{ "filtered-1k", "1000 refs, read twice, none switched (all held)", scan_loop,
	  SCAN_ARG(PERCPU_REF_SCAN_FILTERED, 1000) },
	{ "filtered-10k", "10000 refs, read twice, none switched (all held)", scan_loop,
	  SCAN_ARG(PERCPU_REF_SCAN_FILTERED, 10000) },
	{ "filtered-100k", "100000 refs, read twice, none switched (all held)", scan_loop,
	  SCAN_ARG(PERCPU_REF_SCAN_FILTERED, 100000) },
	{ 0 },
};

static const struct bench_workload managed_scan = {
	.name = "managed-scan",
	.help = "reclaimer: one full scan of N referenced managed refs, per strategy",
	.op = "scan",
	.variants = scan_variants,
	.no_efficiency = true,
	.waits = true,		/* each flush waits for the reclaimer's scan */
	.threads = "1",
	.validate_rows = scan_validate_rows,
	.setup = scan_setup,
	.teardown = scan_teardown,
};
PERCPUREF_BENCH_WORKLOAD(managed_scan);

/* ---- managed-latency --------------------------------------------------- */

static long opt_interval_ms = 20;

struct latency_state {
	uint64_t sum_ns, max_ns, n;	/* every loop thread's; read after join */
};

static void latency_setup(struct bench_run *run)
{
	run->state = bench_zalloc(sizeof(struct latency_state));
	configure((unsigned long)opt_interval_ms, PERCPU_REF_MANAGED_MAX_PER_SCAN,
		  (enum percpu_ref_scan_strategy)run->variant->arg);
}

/* Sleeps @us in slices; false, early, once the measurement has ended. */
static bool latency_sleep(struct bench_thread *t, long us)
{
	for (; us > 0; us -= 10000) {
		if (!bench_running(t))
			return false;
		usleep((useconds_t)(us < 10000 ? us : 10000));
	}
	return true;
}

static void latency_loop(struct bench_thread *t)
{
	struct latency_state *s = t->run->state;
	struct mref m;
	uint64_t put_ns, ns;

	/* At least one ref, made even after the window ended: its init starts
	 * the reclaimer, so that need_reclaimer() sees a thread that could
	 * start running.  A short window on a loaded machine (2 ms under TSan
	 * while the test command built kernels) ended before a loop's first
	 * init, and the run failed as if the reclaimer could not start. */
	do {
		bool stopped;

		m.released_ns = 0;
		if (percpu_ref_init(&m.ref, mref_release, PERCPU_REF_REL_MANAGED))
			bench_die("managed-latency: init failed");
		/* A random phase against the scan period. */
		stopped = !latency_sleep(t, rand() % (opt_interval_ms * 1000 + 1));
		put_ns = bench_clock_ns(CLOCK_MONOTONIC);
		percpu_ref_put(&m.ref);
		/* The measurement ended: release it now, uncounted (waiting
		 * out an --interval-ms of 60 s took a minute past the end). */
		while (!__atomic_load_n(&m.released_ns, __ATOMIC_ACQUIRE)) {
			stopped = stopped || !bench_running(t);
			if (!stopped || percpu_ref_managed_flush())
				usleep(50);
		}
		if (stopped) {
			percpu_ref_exit(&m.ref);
			break;
		}
		ns = m.released_ns - put_ns;
		/* Relaxed: sums of --threads loops, read after they joined. */
		__atomic_fetch_add(&s->sum_ns, ns, __ATOMIC_RELAXED);
		__atomic_fetch_add(&s->n, 1, __ATOMIC_RELAXED);
		for (uint64_t max = __atomic_load_n(&s->max_ns, __ATOMIC_RELAXED); ns > max;)
			if (__atomic_compare_exchange_n(&s->max_ns, &max, ns, false,
							__ATOMIC_RELAXED, __ATOMIC_RELAXED))
				break;
		percpu_ref_exit(&m.ref);
		bench_count(t, 1);
	} while (bench_running(t));
}

static void latency_teardown(struct bench_run *run)
{
	struct latency_state *s = run->state;

	need_reclaimer(run, s->n);
	bench_report_metric(run, "releases", s->n, NULL);
	bench_report_metric(run, "release_mean", s->n ? s->sum_ns / (double)s->n / 1e6 : NAN,
			    "ms");
	bench_report_metric(run, "release_max", s->n ? s->max_ns / 1e6 : NAN, "ms");
	configure_default();
	free(s);
}

static const char *latency_validate(void)
{
	return opt_interval_ms >= 1 && opt_interval_ms <= 60000 ? NULL
							      : "--interval-ms: want 1..60000";
}

static const struct bench_variant latency_variants[] = {
	{ "faithful", "one fence per ref", latency_loop, PERCPU_REF_SCAN_FAITHFUL },
	{ "batched", "one fence per scan", latency_loop, PERCPU_REF_SCAN_BATCHED },
	{ "filtered", "check before switch, then one fence per scan", latency_loop,
	  PERCPU_REF_SCAN_FILTERED },
	{ 0 },
};

static const struct bench_option latency_options[] = {
	{ .name = "interval-ms", .type = BENCH_OPT_LONG, .value = &opt_interval_ms,
	  .help = "scan interval of the reclaimer" },
	{ 0 },
};

static const struct bench_workload managed_latency = {
	.name = "managed-latency",
	.help = "reclaimer: time from the last put of a managed ref to its release",
	.op = "release",
	.variants = latency_variants,
	.options = latency_options,
	.no_efficiency = true,
	.waits = true,		/* sleeps, and waits for each release */
	.threads = "1",
	.setup = latency_setup,
	.teardown = latency_teardown,
	.validate = latency_validate,
};
PERCPUREF_BENCH_WORKLOAD(managed_latency);

/* ---- managed-hot ------------------------------------------------------- */

enum { HOT_IDLE = -1 };	/* else the strategy of a back-to-back reclaimer */

static long opt_cold_refs = 1000;

struct hot_state {
	struct mref *refs;	/* [0] is the hot one */
	size_t n;
	/* The reclaimer's figures at the window's two ends (main thread). */
	struct percpu_ref_managed_stats open, close;
	uint64_t open_ns, close_ns;
	/* Its thread's CPU clock, found at the window's opening (with
	 * how many threads of its name: one, or the CPU time is not
	 * measured), and its readings at both ends (0: unread). */
	clockid_t reclaimer_clock;
	int reclaimer_found;
	uint64_t open_cpu_ns, close_cpu_ns;
};

static void hot_setup(struct bench_run *run)
{
	struct hot_state *s = bench_zalloc(sizeof(*s));

	run->state = s;
	s->n = (size_t)opt_cold_refs + 1;
	configure(IDLE_INTERVAL_MS, 0, PERCPU_REF_SCAN_BATCHED);
	s->refs = make_refs(s->n);
	if (percpu_ref_managed_flush())
		bench_die("managed-hot: flush failed");
	if (run->variant->arg != HOT_IDLE)
		configure(0, 0, (enum percpu_ref_scan_strategy)run->variant->arg);
}

static void hot_loop(struct bench_thread *t)
{
	struct hot_state *s = t->run->state;
	struct percpu_ref *ref = &s->refs[0].ref;

	while (bench_running(t)) {
		for (int i = 0; i < BENCH_BATCH; i++) {
			percpu_ref_get(ref);
			percpu_ref_put(ref);
		}
		bench_count(t, BENCH_BATCH);
	}
}

/*
 * The reclaimer's figures over the measured window only: taken from setup
 * to teardown, the scans made before the first loop ran, with every CPU
 * free, counted too (2 threads on 2 CPUs: 961 scans/s reported, 683 during
 * the loops, review 149), and a reclaimer that scanned only then passed
 * need_reclaimer().  The walk of /proc first, outside the figures (up to
 * milliseconds with hundreds of threads); then the clock reads, which take
 * under a microsecond, around the window's own clock.
 */
static void hot_window_open(struct bench_run *run)
{
	struct hot_state *s = run->state;

	s->reclaimer_found = bench_thread_named_clock("percpuref-recl", &s->reclaimer_clock);
	if (s->reclaimer_found == 1)
		s->open_cpu_ns = bench_clock_ns(s->reclaimer_clock);
	percpu_ref_managed_get_stats(&s->open);
	s->open_ns = bench_clock_ns(CLOCK_MONOTONIC);
}

static void hot_window_close(struct bench_run *run)
{
	struct hot_state *s = run->state;

	s->close_ns = bench_clock_ns(CLOCK_MONOTONIC);
	percpu_ref_managed_get_stats(&s->close);
	if (s->reclaimer_found == 1)
		s->close_cpu_ns = bench_clock_ns(s->reclaimer_clock);
}

static void hot_teardown(struct bench_run *run)
{
	struct hot_state *s = run->state;
	double secs = (double)(s->close_ns - s->open_ns) / 1e9;
	/* One reclaimer thread at the opening, read at both ends (a clock
	 * whose thread ended reads 0): else not measured. */
	bool cpu_measured = s->reclaimer_found == 1 && s->open_cpu_ns && s->close_cpu_ns &&
			    s->close_cpu_ns >= s->open_cpu_ns;

	configure(IDLE_INTERVAL_MS, 0, PERCPU_REF_SCAN_BATCHED);
	if (run->variant->arg != HOT_IDLE)
		need_reclaimer(run, s->close.scans != s->open.scans);
	bench_report_metric(run, "refs", s->n, NULL);
	bench_report_metric(run, "window", secs, "s");
	/* Counted as scans end: a window shorter than a few scans reads
	 * 0 or a whole scan too many. */
	bench_report_metric(run, "scan_rate", (s->close.scans - s->open.scans) / secs, "/s");
	/* The reclaimer's CPU time over the window: near 100% is back to
	 * back; with every CPU running a loop it gives way between scans
	 * (sched_yield) and scans little (2 threads on 2 CPUs: 2%), so
	 * such a row does not test the scans' cost to the hot ref.  From
	 * its thread's CPU clock, not the library's scan time, which counts
	 * a scan's wall time, preemptions included, as the scan ends. */
	bench_report_metric(run, "reclaimer_cpu",
			    cpu_measured ? 100.0 * (double)(s->close_cpu_ns - s->open_cpu_ns) /
						   1e9 / secs
					 : NAN, "%");
	bench_report_metric(run, "fence_rate", (s->close.fences - s->open.fences) / secs, "/s");
	bench_report_metric(run, "switch_rate",
			    (s->close.refs_switched - s->open.refs_switched) / secs, "/s");
	configure_default();
	free_refs(s->refs, s->n, "managed-hot");
	free(s);
}

static const char *hot_validate(void)
{
	return opt_cold_refs >= 0 && opt_cold_refs <= 1000000 ? NULL : "--refs: want 0..1000000";
}

static const struct bench_variant hot_variants[] = {
	{ "idle", "reclaimer idle: per-CPU fast path", hot_loop, HOT_IDLE },
	{ "scan-faithful", "reclaimer scanning back to back, one fence per ref", hot_loop,
	  PERCPU_REF_SCAN_FAITHFUL },
	{ "scan-batched", "reclaimer scanning back to back, one fence per scan", hot_loop,
	  PERCPU_REF_SCAN_BATCHED },
	{ "scan-filtered", "reclaimer scanning back to back, check before switch (default)",
	  hot_loop, PERCPU_REF_SCAN_FILTERED },
	{ 0 },
};

static const struct bench_option hot_options[] = {
	{ .name = "refs", .type = BENCH_OPT_LONG, .value = &opt_cold_refs,
	  .help = "cold managed refs scanned besides the hot one" },
	{ 0 },
};

static const struct bench_workload managed_hot = {
	.name = "managed-hot",
	.help = "get+put on one hot managed ref, reclaimer idle vs scanning back to back",
	.op = "pair",
	.variants = hot_variants,
	.options = hot_options,
	.setup = hot_setup,
	.teardown = hot_teardown,
	.window_open = hot_window_open,
	.window_close = hot_window_close,
	.validate = hot_validate,
};
PERCPUREF_BENCH_WORKLOAD(managed_hot);
